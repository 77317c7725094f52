"""health.lost for the deployment's Python models: a recorded stub that is gone reads as crashed, one whose record
its heartbeat stopped touching as hung (Triton 2.51 keeps both ready), one that beats as alive."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from trtllm_pipeline.triton import health


def _repository(tmp_path):
    repo = tmp_path / "engines" / "tiny" / "triton_model_repo"
    repo.mkdir(parents=True)
    return repo


def test_a_stub_whose_heartbeat_stopped_reads_as_hung_and_names_its_model_and_process(tmp_path):
    repo = _repository(tmp_path)
    record = health.marker(repo, health.STUBS) / f"tensorrt_llm_bls.{os.getpid()}"  # this process: running
    record.parent.mkdir(parents=True)
    record.touch()
    assert health.lost(repo) is None
    stale = time.time() - health.HUNG_S - 5
    os.utime(record, (stale, stale))
    why = health.lost(repo)
    assert why is not None and f"tensorrt_llm_bls model's process (pid {os.getpid()})" in why
    assert "it is hung" in why and "serve --stop" in why


def test_mark_stubs_heartbeat_keeps_a_live_stub_fresh_until_its_record_is_cleared(tmp_path):
    repo = _repository(tmp_path)
    health.mark_stub(repo, "preprocessing")
    record = health.marker(repo, health.STUBS) / f"preprocessing.{os.getpid()}"
    stale = time.time() - health.HUNG_S - 5
    os.utime(record, (stale, stale))
    assert "it is hung" in health.lost(repo)
    time.sleep(health.HEARTBEAT_S * 2.5)  # the heartbeat touched it meanwhile
    assert health.lost(repo) is None
    health.clear(repo)  # the heartbeat ends with its record
    time.sleep(health.HEARTBEAT_S * 1.5)
    assert not [t for t in threading.enumerate() if t.name == "preprocessing-heartbeat"]


def test_a_stub_that_is_gone_reads_as_crashed(tmp_path):
    repo = _repository(tmp_path)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = health.marker(repo, health.STUBS) / f"postprocessing.{int(done.stdout)}"
    record.parent.mkdir(parents=True)
    record.touch()
    why = health.lost(repo)
    assert why is not None and "postprocessing model's process" in why and "is gone: it crashed" in why
