"""What a newcomer meets first: `make help`, make's exit codes (`tools/make`), and the large-download guard."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# No test may start a real download: any hub request goes to a closed port.
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}


def make(*args: str, hf_home: Path, tool: str = "tools/make", env: dict | None = None) -> subprocess.CompletedProcess:
    """`tools/make` (or make) on this checkout with the venv running these tests, its set-up taken as done."""
    # Not the variables of a make that runs this suite (`make test ARGS=--durations=40` would hand ARGS down)
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    return subprocess.run(
        [tool, "-s", "-o", "setup", f"VENV={Path(sys.executable).parent.parent}", *args],
        cwd=REPO, env={**outer, **NO_HUB, "HF_HOME": str(hf_home), **(env or {})},
        capture_output=True, text=True, timeout=300,
    )


def test_make_targets_pass_the_commands_exit_code_through_tools_make(tmp_path):
    # The 7B FP8 TP4 build on a machine without TensorRT-LLM: the CLI's code is 3 (this machine lacks it).
    out = make("build-fp8-tp4", f"ENGINES_DIR={tmp_path / 'engines'}", hf_home=tmp_path / "hf")
    assert out.returncode == 3, out.stderr
    assert "TensorRT-LLM is not installed" in out.stderr
    assert "MODEL=tiny-qwen2 is what runs" in out.stderr  # the fix names what runs on a machine like this
    assert not (tmp_path / "engines").exists()


def test_a_large_download_is_said_and_refused_without_consent(tmp_path):
    out = make("build-fp8-tp4", "RUNTIME=torch", f"ENGINES_DIR={tmp_path / 'engines'}", hf_home=tmp_path / "hf")
    assert out.returncode == 2, out.stderr
    assert "about 15.2 GB into" in out.stderr and str(tmp_path / "hf" / "hub") in out.stderr
    assert "ALLOW_DOWNLOAD=1" in out.stderr and "--allow-download" in out.stderr
    assert not (tmp_path / "hf").exists()  # nothing fetched, nothing written


def test_allow_download_passes_the_guard(tmp_path):
    # With consent the download starts (and fails here: the hub is a closed port, exit 3 naming the network).
    out = make("quantize-fp8-tp1", "ALLOW_DOWNLOAD=1", f"ENGINES_DIR={tmp_path / 'engines'}", hf_home=tmp_path / "hf")
    assert out.returncode == 3, out.stderr
    assert "cannot download deepseek-ai/DeepSeek-R1-Distill-Qwen-7B" in out.stderr
    assert "about 15.2 GB" in out.stderr  # still said, as a warning


def test_on_a_terminal_the_download_is_asked_and_no_refuses(tmp_path):
    code = ("from trtllm_pipeline.model.source import _consent_to_download as ask\n"
            "ask('deepseek-ai/DeepSeek-R1-Distill-Qwen-7B', None)\nprint('DOWNLOADING')")
    env = {k: v for k, v in os.environ.items() if k != "TRTLLM_PIPELINE_ALLOW_DOWNLOAD"}
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=child, stdout=child, stderr=child,
                            env={**env, **NO_HUB, "HF_HOME": str(tmp_path / "hf")}, cwd=REPO)
    os.close(child)
    seen = b""
    while b"[y/N]" not in seen:
        seen += os.read(main, 4096)
    os.write(main, b"n\n")
    assert proc.wait(timeout=60) != 0
    try:
        while chunk := os.read(main, 4096):
            seen += chunk
    except OSError:  # the terminal closes with the process
        pass
    os.close(main)
    assert b"about 15.2 GB" in seen and b"DOWNLOADING" not in seen


def test_make_help_lists_every_target():
    text = (REPO / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True).stdout
    for target in (t for t in phony if t != "help"):
        stem = target.split("%")[0]
        assert f"make {stem}" in shown, f"make help does not show {target}"
    assert "MODEL=tiny-qwen2 is what runs on a machine without a GPU" in shown.replace("\n" + " " * 26, " ")
