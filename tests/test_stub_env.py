"""Serving where the serving Python has numpy 2: the Python-backend stub gets its own numpy<2 environment.

The serving Python with numpy 2 is this venv's interpreter with a real numpy 2 installed (pip --target)
first on its PYTHONPATH: what `import numpy` and the package metadata say there is numpy 2, and the
stub, given the serving process's path first, would import it. The numpy<2 comes from pip's index
and from a local wheel folder (offline machines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_ports, load

from trtllm_pipeline import serve
from trtllm_pipeline.client import TritonClient
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.triton import stub_env

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2-fp8-tp2"  # a config no other test serves (one server per config at a time)
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


@pytest.fixture(scope="module")
def numpy2(tmp_path_factory) -> Path:
    """A folder holding a real numpy 2, to put first on the serving Python's path."""
    target = tmp_path_factory.mktemp("numpy2")
    subprocess.run([*PIP, "install", "-q", "--only-binary=:all:", "--no-deps", "--target", str(target),
                    "numpy>=2,<3"], check=True, capture_output=True)
    return target


def numpy2_version(numpy2: Path) -> str:
    return next(numpy2.glob("numpy-*.dist-info")).name.removesuffix(".dist-info").split("-")[1]


def with_numpy2(numpy2: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(numpy2), str(REPO), os.environ.get("PYTHONPATH", "")]),
            **extra}


def stub_processes(pgid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and serve._pgid(p) == pgid
            and b"triton_python_backend_stub" in _read(p / "cmdline")]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_the_environment_from_pip_imports_its_numpy_1_and_the_serving_pythons_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_PIPELINE_CACHE", str(tmp_path))
    env = stub_env.ensure(None)  # pip's index
    assert env.path == stub_env.env_dir() and env.path.parent == tmp_path / "stub-envs"
    assert env.numpy.startswith("1.") and json.loads((env.path / stub_env.RECORD).read_text())["wheels"] is None
    # As the stub runs it: the environment's interpreter, no PYTHONPATH.
    probe = "import numpy, torch, tokenizers; print(numpy.__version__); print(numpy.__file__); print(torch.__file__)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([str(env.bin / "python"), "-c", probe], env=clean, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, numpy_file, torch_file = out.stdout.split()
    assert version == env.numpy and Path(numpy_file).is_relative_to(env.site_packages)
    assert Path(torch_file).is_relative_to(Path(sys.prefix))  # the serving Python's, through the .pth
    assert stub_env.ensure(None) == env  # made once: reused, not remade
    assert [p.name for p in env.path.parent.iterdir() if not p.name.endswith(".lock")] == [env.path.name]


def test_a_serving_python_with_numpy_2_serves_through_the_stub_environment(tmp_path, numpy2, built, engines_dir):
    wheels = tmp_path / "wheels"  # an offline machine's wheel folder
    subprocess.run([*PIP, "download", "-q", "--only-binary=:all:", "--no-deps", "-d", str(wheels), "numpy==1.26.4"],
                   check=True, capture_output=True)
    built(NAME)
    cfg = load(NAME).with_runtime(tp_mode="merged")
    env = with_numpy2(numpy2, TRTLLM_PIPELINE_CACHE=str(tmp_path / "cache"))
    facts = "from trtllm_pipeline.triton import stub_env; import numpy; print(numpy.__version__, stub_env.needed())"
    assert subprocess.run([sys.executable, "-c", facts], env=env, capture_output=True, text=True).stdout.split() == \
        [numpy2_version(numpy2), "True"]
    ports = [f"--{kind}-port={port}" for kind, port in zip(("http", "grpc", "metrics", "openai"), free_ports(4))]
    cli = [sys.executable, "-m", "trtllm_pipeline", "serve", "-c", str(REPO / "build_configs" / f"{NAME}.yaml"),
           "--engines-dir", str(engines_dir), "--tp-mode", "merged"]
    started = subprocess.run([*cli, "--detach", "--stub-wheels", str(wheels), *ports], env=env, capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    state = serve.read_state(cfg, engines_dir)
    try:
        doctor = subprocess.run([sys.executable, "-c", "from trtllm_pipeline.triton import stub_env; "
                                 "print(stub_env.describe())"], env=env, capture_output=True, text=True).stdout
        assert doctor.startswith("1.26.4 from the stub environment ") and str(tmp_path / "cache") in doctor
        with TritonClient(f"127.0.0.1:{state.grpc_port}") as client:
            served = [client.generate(p, max_tokens=16) for p in ("The capital of France is", "Grüße aus München")]
        # Every stub of this server runs numpy 1.26.4 from the environment, none the serving Python's numpy 2.
        [prepared] = [p for p in (tmp_path / "cache" / "stub-envs").iterdir() if p.is_dir()]
        record = json.loads((prepared / stub_env.RECORD).read_text())
        assert record["numpy"] == "1.26.4" and record["wheels"] == str(wheels)
        stubs = stub_processes(state.pid)
        assert len(stubs) >= 4  # preprocessing x2, postprocessing, tensorrt_llm, tensorrt_llm_bls
        for pid in stubs:
            maps = _read(Path(f"/proc/{pid}/maps")).decode()
            numpys = {line.split()[-1].split("/numpy/")[0] for line in maps.splitlines() if "_multiarray_umath" in line}
            assert numpys == {str(prepared / record["site_packages"])}
    finally:
        subprocess.run([*cli, "--stop"], env=env, capture_output=True, timeout=120)
    assert not serve.group_alive(state.pid)
    runtime = load_runtime(cfg, engines_dir)
    try:
        for prompt, text in zip(("The capital of France is", "Grüße aus München"), served):
            ids = runtime.tokenizer.encode(prompt, add_special_tokens=True)
            assert text == runtime.generate([ids], SamplingParams(max_tokens=16))[0].text
    finally:
        runtime.close()


def test_serve_exits_3_saying_what_was_tried_when_no_numpy_1_can_be_had(tmp_path, numpy2, built, engines_dir):
    (tmp_path / "empty").mkdir()  # a wheel folder without numpy<2, and so no index
    env = with_numpy2(numpy2, TRTLLM_PIPELINE_CACHE=str(tmp_path / "cache"),
                      TRTLLM_PIPELINE_STUB_WHEELS=str(tmp_path / "empty"))
    built(NAME)
    ports = [f"--{kind}-port={port}" for kind, port in zip(("http", "grpc", "metrics", "openai"), free_ports(4))]
    proc = subprocess.run([sys.executable, "-m", "trtllm_pipeline", "serve", "-c",
                           str(REPO / "build_configs" / f"{NAME}.yaml"), "--engines-dir", str(engines_dir), "--detach",
                           *ports], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"numpy {numpy2_version(numpy2)} is installed" in proc.stderr
    assert f"wheel folder {tmp_path / 'empty'}" in proc.stderr
    assert "--stub-wheels" in proc.stderr and "TRTLLM_PIPELINE_STUB_WHEELS" in proc.stderr
    assert "Traceback" not in proc.stderr
    envs = tmp_path / "cache" / "stub-envs"  # nothing half-made left to be taken as ready
    assert [p.name for p in envs.iterdir() if not p.name.endswith(".lock")] == []
