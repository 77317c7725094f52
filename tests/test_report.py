"""The report: builds with nothing measured, and builds with real eval, gate and bench results."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench_stub import stub_server
from conftest import CONFIGS, REPO, load, run_cli
from trtllm_pipeline import bench, report
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.results import number_cell

SEVEN_B = ["r1-distill-qwen-7b-bf16-tp1", "r1-distill-qwen-7b-fp8-tp1", "r1-distill-qwen-7b-fp8-tp2",
           "r1-distill-qwen-7b-fp8-tp4"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rows(markdown: str, name: str) -> list[str]:
    """The build's rows of the overview table (the formats table below it has its own)."""
    overview = markdown.split("## Formats")[0]
    return [line for line in overview.splitlines() if line.startswith(f"| {name} |")]


def test_unmeasured_7b_builds_are_shown_with_settings_and_not_measured_cells(tmp_path):
    out = tmp_path / "reports"
    proc = run_cli("report", *[str(CONFIGS / f"{n}.yaml") for n in SEVEN_B], "--engines-dir", str(tmp_path / "e"),
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "4 builds, 0 with measurements" in proc.stdout
    text = (out / "report.md").read_text()
    for name in SEVEN_B:
        (row,) = rows(text, name)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == ("BF16" if "bf16" in name else "FP8")
        assert cells[2] == re.search(r"tp(\d)", name).group(1)
        assert cells[3] == "not built"
        assert cells[5:7] == ["not measured", "not measured"]  # MMLU, GSM8K
        assert cells[8:] == ["not measured"] * 5  # TTFT, ITL, tokens/s, cost: never a zero
        assert f"## {name}" in text
    assert "| gate | baseline |" in text  # the BF16 build is the gates' baseline
    assert "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B" in text and "TP 4, PP 1 (4 GPUs)" in text
    for plot in report.PLOTS.values():
        data = (out / plot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        assert f"]({plot})" in text


@pytest.fixture(scope="module")
def measured_engines(built, engines_dir, data_dir, tmp_path_factory):
    """Our own copy of the session's tiny builds, evaluated on 4 MMLU items, fp8-tp1 benchmarked."""
    root = tmp_path_factory.mktemp("report-engines")
    names = ["tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1"]
    for name in names:
        built(name)
        shutil.copytree(engines_dir / name, root / name, symlinks=True,
                        ignore=shutil.ignore_patterns("eval", "bench", "serve", "triton_model_repo"))
        evaluate(load(name), engines_dir=root, tasks=["mmlu"], limit=4, data_dir=data_dir)
    cfg = load("tiny-qwen2-fp8-tp1")
    settings = bench.BenchSettings(protocol="openai", url="", model="stub", input_tokens=16, output_tokens=6,
                                   requests=4, warmup=0,
                                   levels=(bench.LoadLevel(concurrency=1), bench.LoadLevel(concurrency=2)))
    with stub_server() as url:
        settings = bench.BenchSettings(**{**settings.__dict__, "url": url})
        bench.bench(settings, tokenizer=bench.load_tokenizer(bench.config_tokenizer_dir(cfg, root)),
                    tokenizer_source="checkpoint", output=bench.default_output(root, cfg.name, settings),
                    config_name=cfg.name, engines_dir=root, gpus=1, gpu_hour_usd=2.0)
    return root


def test_a_small_measurement_is_never_printed_as_zero():
    assert number_cell(0.3, ".0f") == "0.3" and number_cell(0.004, ".2f") == "0.004"
    assert number_cell(12.34, ".1f") == "12.3" and number_cell(0, ".0f") == "0"  # a true zero stays
    assert number_cell(None, ".0f") == "n/a"
    run = {"batch": 1, "context": 16, "decode_ms": 40.0, "tokens_per_s": 25.0, "achieved_gbps": 0.31,
           "fraction_of_floor": None, "prefill_ms": 9.0, "peak_memory_gib": None}
    data = report.BuildData(load("tiny-qwen2-fp8-tp1"), None, {}, [], None, None, None,
                            {"runtime": {"runtime": "torch", "device": "cpu"}, "runs": [run]}, Path("inprocess-x.json"))
    (row,) = [line for line in report._inprocess_section(data) if line.startswith("| 1 |")]
    assert row == "| 1 | 16 | 40.000 | 25 | 0.31 | n/a | 9.0 | n/a |"


def test_the_itl_plot_never_puts_a_cpu_and_a_gpu_on_one_axis(tmp_path):
    def build(name, device, served=None, single=None):
        bench_data = {"settings": {"device": device}, "summary": [
            {"concurrency": 1, "requests": 4, "ttft_ms": {"p50": 9.0}, "itl_ms": {"p50": served}}]} if served else None
        inprocess = {"runtime": {"device": device}, "runs": [{"batch": 1, "context": 16, "decode_ms": single}]}
        return report.BuildData(load(name), None, {}, [], None, bench_data, None, inprocess if single else None)

    builds = [build("tiny-qwen2-fp8-tp1", "cpu", served=15.0, single=1.8),
              build("r1-distill-qwen-7b-random-fp8-tp1", "cuda:0 (NVIDIA H200)", single=2.7),
              build("r1-distill-qwen-7b-fp8-tp4", "cpu")]
    panels, missing = report.itl_panels(builds)
    assert list(panels) == ["CPU", "GPU: NVIDIA H200"] and missing == ["r1-distill-qwen-7b-fp8-tp4"]
    assert panels["CPU"] == [("tiny-qwen2-fp8-tp1", [(15.0, "served"), (1.8, "in-process")])]
    gpu_rows = dict(panels["GPU: NVIDIA H200"])  # the published H200 recipe beside the build measured on an H200
    assert gpu_rows["r1-distill-qwen-7b-random-fp8-tp1"] == [(2.7, "in-process")]
    assert gpu_rows["reference: TensorRT-LLM FP8"] == [(6.68, "published")]
    cpu_only, _ = report.itl_panels(builds[:1])  # no GPU measured: the published figures get a panel of their own
    assert list(cpu_only) == ["CPU", "published reference (TensorRT-LLM, H200)"]
    for plot in (report.plot_itl, report.plot_formats, report.plot_accuracy):
        assert plot(builds, tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)


def test_a_bad_gates_file_leaves_no_output_directory(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("max_drop: {mmlu: .nan}\n")
    out = tmp_path / "reports"
    proc = run_cli("report", str(CONFIGS / f"{SEVEN_B[0]}.yaml"), "--engines-dir", str(tmp_path / "e"), "-o", str(out),
                   "--gates", str(gates))
    assert proc.returncode == 2 and "max_drop.mmlu" in proc.stderr, proc.stderr
    assert not out.exists()


def test_report_of_measured_builds(measured_engines, tmp_path):
    configs = [load(n) for n in ("tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1", "tiny-qwen2-fp8-tp2")]
    result = report.report(configs, engines_dir=measured_engines, out_dir=tmp_path, gates_file=REPO / "eval/gates.yaml",
                           gpu_hour_usd=2.0, request_tokens=100)
    text = result.path.read_text()
    base, fp8, tp2 = (rows(text, c.name)[0] for c in configs)
    fp8_cells = [c.strip() for c in fp8.strip("|").split("|")]
    assert fp8_cells[3] == "torch" and fp8_cells[4] == "none (CPU)"
    assert re.fullmatch(r"\d+\.\d%", fp8_cells[5])  # MMLU measured on 4 items
    assert fp8_cells[6] == "not measured"  # GSM8K was not run
    assert fp8_cells[7] in ("MMLU pass vs tiny-qwen2-bf16-tp1", "MMLU FAIL vs tiny-qwen2-bf16-tp1")
    assert "baseline" in base
    # latency comes from the lowest concurrency, throughput and cost from the best level
    (b,) = [b for b in result.builds if b.name == "tiny-qwen2-fp8-tp1"]
    low, peak = b.lowest_load(), b.peak()
    assert low["concurrency"] == 1
    assert fp8_cells[8] == f"{low['ttft_ms']['p50']:.1f}" and fp8_cells[9] == f"{low['itl_ms']['p50']:.2f}"
    assert fp8_cells[10] == f"{peak['output_tokens_per_s']:.1f}"
    # measured on a CPU: a GPU price does not describe it (the cost model itself: test_cost.py)
    assert fp8_cells[11:13] == ["n/a (CPU)", "n/a (CPU)"]
    # the per-build table has one row per load level
    section = text.split("## tiny-qwen2-fp8-tp1")[1].split("## ")[0]
    assert "| c=1 | 4 | 0 |" in section and "| c=2 | 4 | 0 |" in section
    assert "openai-in16-out6.json" in section
    # a build with nothing measured keeps its row
    tp2_cells = [c.strip() for c in tp2.strip("|").split("|")]
    assert tp2_cells[3] == "not built" and tp2_cells[8:] == ["not measured"] * 5
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in result.plots)
