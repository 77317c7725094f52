"""`make demo`'s driver, fast variant: every stage for real, the report written, no server left behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, free_ports, load
from trtllm_pipeline import demo, report, serve
from trtllm_pipeline.tasks.registry import TASKS

pytestmark = pytest.mark.slow
TINY = demo.MODELS[demo.TINY]  # the real model's demo is `make demo`'s; the suite runs the tiny one's
NAMES = TINY.names
STEPS = (["quantize"] * 4 + ["build"] * 4 + ["eval"] * 4 * len(TASKS) + ["gate"] * 3 * len(TASKS) + ["bench"] * 4
         + ["deploy", "serve", "generate", "bench", "serve", "report"])


@pytest.fixture
def demo_engines(built, engines_dir, tmp_path):
    """The session's tiny builds copied into a directory of the demo's own (its evals must not
    overwrite other tests' results); the demo then finds quantize and build cached."""
    root = tmp_path / "engines"
    for name in NAMES:
        built(name)
        shutil.copytree(engines_dir / name, root / name, symlinks=True,
                        ignore=shutil.ignore_patterns("eval", "bench", "serve", "triton_model_repo"))
    return root


def run_demo(engines, reports, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    http, grpc, metrics, openai = free_ports(4)
    return subprocess.run(
        [sys.executable, "-m", "trtllm_pipeline.demo", "--model", demo.TINY, "--fast", "--engines-dir", str(engines),
         "--reports-dir", str(reports), "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
         "--openai-port", str(openai), *extra],
        cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=900,
    )


def no_server_left(engines) -> bool:
    if serve.read_state(load(TINY.served), engines) is not None:
        return False
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return not any("tritonserver" in line and str(engines) in line for line in ps.splitlines())


def test_demo_runs_every_stage_writes_the_report_and_reuses_its_cache(demo_engines, data_dir, tmp_path):
    reports = tmp_path / "reports"
    first = run_demo(demo_engines, reports, "--data-dir", str(data_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert re.findall(r"^\$ trtllm-pipeline (\w+)", first.stdout, re.M) == STEPS  # each step shown as its command
    assert f"demo done. Report: {reports / 'report.md'}" in first.stdout
    assert no_server_left(demo_engines)

    text = (reports / "report.md").read_text()
    for name in NAMES:
        row = [line for line in text.splitlines() if line.startswith(f"| {name} |")][0]  # the overview's
        formats = [line for line in text.split("## Formats")[1].splitlines() if line.startswith(f"| {name} |")][0]
        ms, batch32, device = (c.strip() for c in formats.split("|")[8:11])
        assert ms != "not measured" and device == "none (CPU)", formats  # in-process at batch 1
        assert batch32 == "not measured"  # the tiny builds take batches up to 8
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3] == "torch" and re.fullmatch(r"\d+\.\d%", cells[5]) and re.fullmatch(r"\d+\.\d%", cells[6])
        assert cells[7] == "baseline" if name == TINY.baseline else cells[7].endswith(f"vs {TINY.baseline}")
        measured = name == TINY.served
        assert (cells[9] != "not measured") == measured  # only the served build was benchmarked
    for plot in report.PLOTS.values():
        assert (reports / plot).read_bytes().startswith(b"\x89PNG")
    bench_files = list((demo_engines / TINY.served / "bench").glob("triton-grpc-*.json"))
    assert len(bench_files) == 1

    # Again, up to the served format's deploy (`Demo.all` runs these first; the benches, the server and the report
    # after them are measurements, run anew every time)
    second = demo_script(demo_engines, reports, data_dir, "d.prepare(); d.deploy()")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    out = second.stdout + second.stderr
    for stage, count in (("quantize", 3), ("build", 3), ("eval mmlu", 3), ("eval gsm8k", 3), ("deploy", 1)):
        assert len(re.findall(rf"^{stage}: cache hit", out, re.M)) >= count, stage
    assert "quantize: wrote" not in out and "build: torch engine for" not in out
    assert no_server_left(demo_engines)


def demo_script(engines, reports, data_dir, statement: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``statement`` on a `demo.Demo` ``d`` of the tiny model at the FAST size, in a fresh interpreter."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from trtllm_pipeline import demo
        data = {str(data_dir) if data_dir else None!r}
        d = demo.Demo(Path("build_configs"), Path({str(engines)!r}), Path({str(reports)!r}), data and Path(data),
                      demo.FAST, model=demo.MODELS[demo.TINY])
    """) + statement
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def test_without_eval_data_the_demo_skips_eval_and_gate_with_a_notice(demo_engines, tmp_path):
    proc = demo_script(demo_engines, tmp_path, None, f"print('evaluated:', d.evaluate(({TINY.baseline!r},)))",
                       env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evaluated: False" in proc.stdout
    assert "notice: no evaluation data here" in proc.stdout and "DATA_DIR" in proc.stdout
