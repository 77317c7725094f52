"""The torch engine model's outbox (``triton/torch_server._Outbox``): on a GPU its thread sends while the engine
runs on, and a streaming row's tokens that come while its response waits join that response. The served path
through a real tritonserver is covered by test_serve/test_bench_triton; here the joining itself, with a sender
that is slow on purpose (as the stub's IPC was on the H200 under 64 streams)."""

from __future__ import annotations

import threading
import types

from trtllm_pipeline.triton.torch_server import _Outbox

FINAL = 1


class SlowSender:
    """Records each send; the first one waits until ``release`` is set (the sending thread is busy)."""

    def __init__(self, fail: bool = False):
        self.sent: list[tuple[object, int]] = []
        self.release = threading.Event()
        self.fail = fail

    def send(self, response=None, flags: int = 0) -> None:
        if not self.sent:
            self.release.wait(10)
        self.sent.append((response, flags))
        if self.fail:
            raise RuntimeError("the client is gone")


def build(job, ids, text):
    return (list(ids), text)


def test_tokens_that_come_while_a_response_waits_join_it_in_order_and_the_final_flag_is_kept():
    sender = SlowSender()
    job = types.SimpleNamespace(sender=sender)
    outbox = _Outbox(lambda job: None, threaded=True, coalesce=True)
    outbox.stream(job, 0, [1], "a", False, build, FINAL)  # taken by the thread at once, blocks in send
    for _ in range(100):  # until the thread holds it
        if outbox._chunks == {}:
            break
        threading.Event().wait(0.01)
    for token, piece in ((2, "b"), (3, ""), (4, "cd")):
        outbox.stream(job, 0, [token], piece, False, build, FINAL)
    outbox.stream(job, 0, [], "", True, build, FINAL)  # the end: no token, only the final flag
    sender.release.set()
    outbox.close()
    assert sender.sent == [(([1], "a"), 0), (([2, 3, 4], "bcd"), FINAL)]


def test_rows_of_one_job_and_other_jobs_are_never_joined():
    sender = SlowSender()
    sender.release.set()
    first, second = types.SimpleNamespace(sender=sender), types.SimpleNamespace(sender=sender)
    outbox = _Outbox(lambda job: None, threaded=False)  # unthreaded: every token its own response, at once
    outbox.stream(first, 0, [1], "a", False, build, FINAL)
    outbox.stream(first, 0, [2], "b", False, build, FINAL)
    outbox.stream(second, 0, [], "", True, build, FINAL)
    assert sender.sent == [(([1], "a"), 0), (([2], "b"), 0), (None, FINAL)]
    threaded = _Outbox(lambda job: None, threaded=True, coalesce=True)
    sender.sent.clear()
    threaded.stream(first, 0, [5], "x", False, build, FINAL)
    threaded.stream(first, 1, [6], "y", False, build, FINAL)
    threaded.stream(second, 0, [7], "z", True, build, FINAL)
    threaded.close()
    assert sorted(sender.sent, key=lambda s: s[0][0]) == [(([5], "x"), 0), (([6], "y"), 0), (([7], "z"), FINAL)]


def test_a_send_that_fails_reports_the_job_gone():
    sender = SlowSender(fail=True)
    sender.release.set()
    job = types.SimpleNamespace(sender=sender)
    gone = []
    outbox = _Outbox(gone.append, threaded=True, coalesce=True)
    outbox.stream(job, 0, [1], "a", False, build, FINAL)
    outbox.close()
    assert gone == [job]


def test_without_coalescing_every_token_is_its_own_response_and_the_loop_can_wait_for_them():
    sender = SlowSender()
    job = types.SimpleNamespace(sender=sender)
    outbox = _Outbox(lambda job: None, threaded=True)  # the default: one response per token
    for token in (1, 2, 3):
        outbox.stream(job, 0, [token], str(token), token == 3, build, FINAL)
    mark = outbox.mark()
    sender.release.set()
    outbox.wait(mark, timeout=10)
    assert sender.sent == [(([1], "1"), 0), (([2], "2"), 0), (([3], "3"), FINAL)]
    outbox.close()


def test_served_host_probe_runs_a_few_steps_and_prints_its_table(quantized, tmp_path, capsys):
    """benchmarks/served_host_probe.py (the served loop's host time per step, no model): a real TorchModelServer on
    the tiny checkpoint with the stand-in pb_utils, 4 streams, 5 timed steps, both outbox modes, on the direct
    socket (a process reading the frames as the BLS does; every token arrives) and through the fake Triton."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import served_host_probe

    ckpt = quantized("tiny-qwen2-bf16-tp1").checkpoint_dir
    for path, coalesce in (("direct", "0,1"), ("fakepb", "1")):
        out = tmp_path / f"probe-{path}.json"
        served_host_probe.main(["--checkpoint", str(ckpt), "--streams", "4", "--steps", "5", "--prompt-tokens", "8",
                                "--timeout", "120", "--path", path, "--coalesce", coalesce, "-o", str(out)])
        assert "ms/step" in capsys.readouterr().out
        results = json.loads(out.read_text())["results"]
        expected = [(4, False, 5), (4, True, 5)] if coalesce == "0,1" else [(4, True, 5)]
        assert [(r["streams"], r["coalesce"], r["steps"]) for r in results] == expected
        assert all(r["path"] == path and r["ms_per_step"] > 0 and r["on_events_ms"] > 0 and r["runtime_only_ms"] > 0
                   and r["tokens_per_response"] >= 1 for r in results)
