"""The served engine loop's host time per step with the GPU's work taken away (issue 30): what a served step costs
the host beyond the runtime's own ``step()``.

Served, the torch runtime runs inside Triton's Python-backend stub: ``triton/torch_server.TorchModelServer`` hosts
the engine loop (``runtimes/engine_loop``): between steps it takes and admits requests, after each step its
``on_events`` detokenizes every row's token (``TextStream``), hands each streaming row's token to the outbox, whose
thread builds the response and sends it, and updates the metrics. Here a real ``TorchModelServer`` runs its loop in
its own thread as served, on a runtime whose decode step runs no model (``host_step_probe``'s ``_NoStep``: token +
1), with a stand-in for ``triton_python_backend_utils`` (``FakePb``; metrics only count). Its requests come one of
two ways (``--path``):

- ``direct`` (the default; how the BLS, the model clients use, talks to the engine): the server listens on a Unix
  socket of its own (``triton/direct.py``), and a process standing in for the BLS (``bls_reader``: not this
  process's GIL) sends the BLS's streaming engine requests there and reads every response frame, one thread a
  stream as the BLS does. The engine's outbox encodes real frames and writes them on real connections;
  ``send`` is the time in ``direct.Sender.send`` (encoding and writing).
- ``fakepb`` (the ensemble's path through Triton): the requests carry the tensors the ensemble's preprocessing
  gives the engine model, and each send is recorded (``--send-us``: plus a fixed sleep, the stub's synchronous IPC
  round trip; ``--poll-us`` the same for ``is_cancelled()``).

For each stream count, K steps of steady decode are timed: wall ms per step of the loop, split into
``between_steps``, the runtime's ``step()`` and ``on_events``, the loop thread's and the outbox thread's CPU (also
per stream, in us), and the runtime-only figure of ``host_step_probe`` for the same rows; ``--repeat`` runs every
case that many times, interleaved, and prints medians. Runs on the CPU, on the tiny checkpoint a test suite builds:

    python benchmarks/served_host_probe.py --checkpoint engines/tiny-qwen2-bf16-tp1/checkpoint \\
        --streams 1,32,64,128 --coalesce 0,1 --repeat 5 -o served_host.json [--profile] [--path fakepb]

``--profile`` is cProfile in the loop's thread only; for both threads, py-spy (``py-spy record --threads --format
raw -- python benchmarks/served_host_probe.py --streams 64 --coalesce 1 --steps 1500``). Figures, before and after
issue 30's cuts of the host work per stream (direct path, with and without ``--gpu-ms``): docs/serving.md, "On the
BLS's direct socket".
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bls_reader  # noqa: E402  (benchmarks/: the BLS's side of the direct socket)
from host_step_probe import _NoStep  # noqa: E402  (benchmarks/: the no-model decode step both share)

from trtllm_pipeline.runtimes.base import SamplingParams  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs, batch_buckets, row_limit  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime  # noqa: E402

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


# ---- a stand-in for triton_python_backend_utils: what torch_server, tensors and engine_metrics call ----------------

class _Tensor:
    __slots__ = ("_name", "_array")

    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Response:
    __slots__ = ("tensors", "error")

    def __init__(self, output_tensors=(), error=None):
        self.tensors, self.error = output_tensors, error


class _Error(Exception):
    INVALID_ARG, UNAVAILABLE, INTERNAL = 3, 14, 13

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class _Metric:
    """A custom metric: each call is an IPC round trip in the stub; here it only counts."""

    calls = 0

    def __init__(self, labels=None, buckets=None):
        self.value = 0

    def increment(self, value) -> None:
        _Metric.calls += 1
        self.value += value

    def set(self, value) -> None:
        _Metric.calls += 1
        self.value = value

    def observe(self, value) -> None:
        _Metric.calls += 1


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"
    Metric = _Metric

    def __init__(self, name: str, description: str, kind: str):
        self.name, self.kind = name, kind


class FakePb:
    Tensor = _Tensor
    InferenceResponse = _Response
    TritonError = _Error
    MetricFamily = _Family
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL

    @staticmethod
    def get_input_tensor_by_name(request, name: str):
        array = request.inputs.get(name)
        return None if array is None else _Tensor(name, array)


class Sender:
    """A response sender: records the count, tokens and final flag; ``ipc_s`` sleeps as the stub's round trip."""

    def __init__(self, ipc_s: float, clock: "Clock"):
        self.ipc_s, self.clock = ipc_s, clock
        self.responses = self.tokens = 0
        self.final = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        t = time.perf_counter()
        if self.ipc_s:
            time.sleep(self.ipc_s)
        self.responses += 1
        self.clock.sends += 1
        if response is not None and response.tensors:
            self.tokens += response.tensors[0].as_numpy().shape[-1]
        if flags & FINAL:
            self.final.set()
        self.clock.send_s += time.perf_counter() - t


class Request:
    """A streaming request as the ensemble's preprocessing hands it to the engine model (one prompt)."""

    def __init__(self, prompt: list[int], max_tokens: int, sender: Sender, poll_s: float, clock: "Clock"):
        self.inputs = bls_reader.engine_inputs(prompt, max_tokens)  # the same tensors either path
        self.sender, self.poll_s, self.clock = sender, poll_s, clock

    def get_response_sender(self) -> Sender:
        return self.sender

    def request_id(self) -> str:
        return ""  # a gRPC client of the ensemble: no id, so the server polls is_cancelled()

    def parameters(self) -> str:
        return "{}"

    def requested_output_names(self) -> list[str]:
        return ["output_ids", "sequence_length", "output_text"]

    def is_cancelled(self) -> bool:
        self.clock.polls += 1
        if self.poll_s:
            time.sleep(self.poll_s)
        return False


class Clock:
    """What the senders and requests spent (one for the whole probe)."""

    def __init__(self):
        self.send_s, self.polls, self.sends = 0.0, 0, 0


SLACK_TOKENS = 1000  # tokens a stream decodes past the warm-up and timed steps (``served``)
CLOCK = Clock()


# ---- the probe ---------------------------------------------------------------------------------------------------

class _Gpu:
    """``--gpu-ms``: the GPU's time put back. Each launched decode step ends ``step_s`` after its launch or after the
    step before it ended, whichever is later (a GPU runs them in turn), and reading its tokens (the event of
    ``greedy_host``, which ``_settle_pending`` waits on) waits until then in ``time.sleep``, the GIL free, as torch's
    event wait frees it: the outbox's thread sends while the loop waits, and host work beyond the GPU's time shows as
    ms per step above ``step_s``. ``waited_s``: the loop's time waiting so (the host's slack)."""

    def __init__(self, decoder, step_s: float):
        self.step_s, self.end, self.waited_s = step_s, 0.0, 0.0
        self._inner = decoder.greedy_host
        decoder.greedy_host = self.greedy_host

    def greedy_host(self):
        host, _ = self._inner()
        self.end = max(time.perf_counter(), self.end) + self.step_s
        return host, _Ready(self, self.end)


class _Ready:
    __slots__ = ("gpu", "end")

    def __init__(self, gpu: _Gpu, end: float):
        self.gpu, self.end = gpu, end

    def synchronize(self) -> None:
        if (left := self.end - time.perf_counter()) > 0:
            time.sleep(left)
            self.gpu.waited_s += left


def make_runtime(ckpt: Path, rows: int, gpu_s: float = 0.0) -> TorchRuntime:
    """``host_step_probe``'s runtime: the tiny checkpoint, continuous batching, a decode step that runs no model
    (``gpu_s`` > 0: taking that long on a stand-in GPU, ``_Gpu``, as ``rt.gpu``)."""
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=rows, max_seq_len=2048,
                      fast_decode=False)
    decoder = DecodeGraphs(_NoStep(rt.engine), batch_buckets(rows, limit=row_limit(rt.engine, 1)), use_graphs=False)
    decoder.prepare()
    rt.attach_decoder(decoder)  # overlap and chaining as the runtime sets them for its own decoder
    rt.gpu = _Gpu(decoder, gpu_s) if gpu_s > 0 else None
    return rt


def gpu_s(args, streams: int) -> float:
    """The stand-in GPU's step at ``streams`` rows: ``--gpu-ms`` + ``--gpu-us-per-stream`` x streams."""
    return (args.gpu_ms + args.gpu_us_per_stream * streams / 1000) / 1000 if args.gpu_ms > 0 else 0.0


def prompt_of(i: int, n: int) -> list[int]:
    return [(7 * i + j) % 1000 + 10 for j in range(n)]


def runtime_only(ckpt: Path, rows: int, prompt_tokens: int, steps: int, gpu: float = 0.0) -> float:
    """host_step_probe's figure: ms per ``step()`` of the runtime alone, ``rows`` decoding (with a stand-in GPU:
    ``bench --in-process``'s step, no server)."""
    rt = make_runtime(ckpt, rows, gpu)
    params = SamplingParams(max_tokens=steps + 20, end_id=-1)
    for i in range(rows):
        rt.submit(i, prompt_of(i, prompt_tokens), params)
    while rt.scheduler.waiting or any(not r.decoding for r in rt.scheduler.running):
        rt.step()
    for _ in range(3):
        rt.step()
    start = time.perf_counter()
    for _ in range(steps):
        rt.step()
    ms = (time.perf_counter() - start) * 1000 / steps
    rt.close()
    return ms


def _thread_cpu(thread: threading.Thread | None) -> float:
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError):
        return 0.0


class Timed:
    """Wraps the loop's ``turn`` and the host's methods (instance attributes: the running loop picks them up) and
    times ``steps`` steady decode steps from the first turn at which every stream decodes."""

    def __init__(self, server, rt: TorchRuntime, streams: int, steps: int, warmup: int, profile: bool):
        self.server, self.rt, self.streams, self.steps, self.warmup = server, rt, streams, steps, warmup
        self.parts = dict.fromkeys(("between_steps", "step", "on_events"), 0.0)
        self.profiler = cProfile.Profile() if profile else None
        self.measuring, self.counted, self.steady_turns, self.most_jobs = False, 0, 0, 0
        self.done = threading.Event()
        self.start: dict = {}
        self.end: dict = {}
        loop = server.loop
        self._turn = loop.turn
        for name in ("between_steps", "on_events"):
            setattr(server, name, self._wrap(getattr(server, name), name))
        rt_step = rt.step
        rt.step = self._wrap(rt_step, "step")
        loop.turn = self.turn

    def _wrap(self, fn, name):
        parts = self.parts

        def timed(*args, **kwargs):
            if not self.measuring:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] += time.perf_counter() - t
        return timed

    def _steady(self) -> bool:
        s, sched = self.server, self.rt.scheduler
        return (len(s._jobs) == self.streams and not s._waiting and not sched.waiting
                and len(sched.running) == self.streams and all(r.decoding for r in sched.running))

    def _snapshot(self) -> dict:
        return {"t": time.perf_counter(), "loop_cpu": time.thread_time(),
                "outbox_cpu": _thread_cpu(self.server.outbox._thread), "send_s": CLOCK.send_s, "sends": CLOCK.sends,
                "gpu_wait_s": self.rt.gpu.waited_s if self.rt.gpu is not None else 0.0,
                "polls": CLOCK.polls, "metric_calls": _Metric.calls, "phases": self.rt.phase_times(),
                "parts": dict(self.parts)}

    def unsteady_end(self) -> bool:
        """Every stream came and went without a turn at which all of them decoded: the measurement never starts."""
        return not self.measuring and not self.done.is_set() and self.most_jobs > 0 and not self.server._jobs

    def turn(self):
        self.most_jobs = max(self.most_jobs, len(self.server._jobs))
        if not self.measuring and not self.done.is_set():
            if self._steady():
                self.steady_turns += 1
            if self.steady_turns > self.warmup:
                self.measuring = True
                self.start = self._snapshot()
                if self.profiler:
                    self.profiler.enable()
        if not self.measuring:
            return self._turn()
        events = self._turn()
        if events:
            self.counted += 1
        if self.counted >= self.steps:
            if self.profiler:
                self.profiler.disable()
            self.end = self._snapshot()
            self.measuring = False
            self.done.set()
        return events


def _timed_sends(clock: Clock):
    """``direct.Sender.send`` (a frame encoded and written) with its time added to ``clock.send_s``; undone by
    calling the result."""
    from trtllm_pipeline.triton import direct

    send = direct.Sender.send

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return send(self, *args, **kwargs)
        finally:
            clock.send_s += time.perf_counter() - t
            clock.sends += 1

    direct.Sender.send = timed
    return lambda: setattr(direct.Sender, "send", send)


def served(ckpt: Path, streams: int, args, coalesce: bool) -> dict:
    from trtllm_pipeline.triton.torch_server import TorchModelServer

    _Metric.calls = 0
    rt = make_runtime(ckpt, streams, gpu_s(args, streams))
    switches = {"TRTLLM_PIPELINE_STREAM_COALESCE": "1" if coalesce else "0",
                "TRTLLM_PIPELINE_OUTBOX_THREAD": "1" if args.outbox_thread else "0"}
    saved = {k: os.environ.get(k) for k in switches}
    os.environ.update(switches)  # read where the server is made
    where = f"\0trtllm-pipeline-probe-{uuid.uuid4().hex}" if args.path == "direct" else None
    try:
        server = TorchModelServer(rt, FakePb, exclude_input_in_output=True, direct_address=where)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    timed = Timed(server, rt, streams, args.steps, args.warmup, args.profile)
    clock = CLOCK
    # every stream decoding still when the last one starts and when the timed steps end: the measurement waits for a
    # turn with all of them decoding, and a stream that arrived late (the reader process descheduled between its
    # sends, on a loaded 2-core machine) met the first ones already ended at 40 tokens of slack (a clean clone's test
    # run, 2026-12-07: no steady turn, the 120 s timeout)
    max_tokens = args.steps + args.warmup + SLACK_TOKENS + streams // 4
    prompts = [prompt_of(i, args.prompt_tokens) for i in range(streams)]
    senders, reader = [], None
    if where is None:  # FakePb: Triton's senders, recorded in this process
        for prompt in prompts:
            sender = Sender(args.send_us / 1e6, clock)
            senders.append(sender)
            server.enqueue(Request(prompt, max_tokens, sender, args.poll_us / 1e6, clock))
    else:  # the BLS's streams on the engine's socket, read in a process of its own
        undo = _timed_sends(clock)
        reader, totals = bls_reader.start(where, prompts, max_tokens)
    try:
        deadline = time.perf_counter() + args.timeout
        while not timed.done.wait(0.1):
            if timed.unsteady_end():
                raise SystemExit(f"{streams} streams: they ended before all of them decoded at once (no steady turn "
                                 f"to time); give them more tokens (SLACK_TOKENS)")
            if time.perf_counter() > deadline:
                raise SystemExit(f"{streams} streams: the timed steps did not end within {args.timeout} s")
        for sender in senders:
            sender.final.wait(args.timeout)
        if reader is not None:
            if not totals.poll(args.timeout):
                raise SystemExit(f"{streams} streams: the reader did not see every stream's end")
            read = totals.recv()
            reader.join(10)
            if read["errors"] or read["tokens"] != streams * max_tokens:
                raise SystemExit(f"{streams} streams: the reader saw {read}")
    finally:
        if reader is not None:
            undo()
            if reader.is_alive():
                reader.kill()
        server.close()
    a, b, k = timed.start, timed.end, timed.counted
    per = lambda x: x * 1000 / k  # noqa: E731
    result = {
        "streams": streams, "path": args.path, "coalesce": coalesce, "outbox_thread": args.outbox_thread, "steps": k,
        "ms_per_step": per(b["t"] - a["t"]),
        **{f"{name}_ms": per(b["parts"][name] - a["parts"][name]) for name in a["parts"]},
        "loop_cpu_ms": per(b["loop_cpu"] - a["loop_cpu"]),
        "outbox_cpu_ms": per(b["outbox_cpu"] - a["outbox_cpu"]),
        "send_ms": per(b["send_s"] - a["send_s"]),
        "sends_per_step": (b["sends"] - a["sends"]) / k,  # responses (frames) sent
        "gpu_ms": gpu_s(args, streams) * 1000, "gpu_wait_ms": per(b["gpu_wait_s"] - a["gpu_wait_s"]),
        "polls_per_step": (b["polls"] - a["polls"]) / k,
        "metric_calls_per_step": (b["metric_calls"] - a["metric_calls"]) / k,
        "phases_ms": {p: per(b["phases"][f"{p}_s"] - a["phases"][f"{p}_s"]) for p in ("plan", "eager", "fast")},
        "chained_steps": b["phases"]["chained_steps"] - a["phases"]["chained_steps"],
    }
    if reader is None:
        result["tokens_per_response"] = sum(s.tokens for s in senders) / max(1, sum(s.responses for s in senders))
    else:  # over the whole run
        result["tokens_per_response"] = read["tokens"] / max(1, read["frames"])
        result["reader_cpu_s"] = read["cpu_s"]
    result["host_ms"] = result["ms_per_step"] - result["step_ms"]  # the server's own work a step
    if timed.profiler:
        out = io.StringIO()
        pstats.Stats(timed.profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
        result["profile"] = out.getvalue()
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=Path("engines/tiny-qwen2-bf16-tp1/checkpoint"))
    ap.add_argument("--streams", default="1,32,64,128,256", help="stream counts, comma-separated")
    ap.add_argument("--coalesce", default="0,1", help="TRTLLM_PIPELINE_STREAM_COALESCE values to run")
    ap.add_argument("--path", choices=("direct", "fakepb"), default="direct",
                    help="direct: the BLS's streams on the engine's socket, as served (frames written on Unix "
                         "sockets, read by a process standing in for the BLS); fakepb: Triton's response senders, "
                         "recorded (the ensemble's path)")
    ap.add_argument("--outbox-thread", type=int, default=1, help="1: the outbox's thread, as on a GPU")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50, help="steps timed once every stream decodes")
    ap.add_argument("--warmup", type=int, default=5, help="steady steps before the timed ones")
    ap.add_argument("--gpu-ms", type=float, default=0.0,
                    help="> 0: a stand-in GPU whose decode step takes this long (+ --gpu-us-per-stream a stream), "
                         "run asynchronously as chained steps run (e.g. the H200's in-process 7B step: 2.37 + "
                         "0.0143 a stream); 0: the host's time alone")
    ap.add_argument("--gpu-us-per-stream", type=float, default=0.0)
    ap.add_argument("--send-us", type=float, default=0.0, help="a fixed cost per send (the stub's IPC round trip)")
    ap.add_argument("--poll-us", type=float, default=0.0, help="a fixed cost per is_cancelled() call")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every case, interleaved; the table gives medians")
    ap.add_argument("--no-runtime-only", action="store_true", help="skip host_step_probe's runtime-only figure")
    ap.add_argument("--profile", action="store_true", help="cProfile the loop thread's timed steps")
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING)
    results = []
    header = (f"{'streams':>7} {'coal':>4} {'ms/step':>8} {'step()':>7} {'host':>7} {'between':>7} {'on_ev':>7} "
              f"{'loopCPU':>7} {'obxCPU':>7} {'send':>6} {'polls':>5} {'rsp/st':>6} {'tok/rsp':>7} {'gpuwait':>7} "
              f"{'us/str':>6} {'obx/str':>7} {'rt-only':>7} {'x':>5}")
    bases = {}
    for repeat in range(args.repeat):  # each repeat runs every case once: the runs of one case interleave
        for n in [int(x) for x in args.streams.split(",")]:
            if n not in bases:
                bases[n] = None if args.no_runtime_only else runtime_only(args.checkpoint, n, args.prompt_tokens,
                                                                          args.steps, gpu_s(args, n))
            for c in [int(x) for x in args.coalesce.split(",")]:
                r = served(args.checkpoint, n, args, bool(c))
                r["runtime_only_ms"], r["repeat"] = bases[n], repeat
                # per stream a step: the loop's wall time and the outbox thread's CPU, in us
                r["loop_us_per_stream"] = r["ms_per_step"] * 1000 / n
                r["outbox_us_per_stream"] = r["outbox_cpu_ms"] * 1000 / n
                results.append(r)
                print(_row(r) if len(results) > 1 else header + "\n" + _row(r), flush=True)
                if "profile" in r:
                    print(r["profile"], flush=True)
    medians = _medians(results)
    print(f"\n{args.path}: ms per step of the served loop (wall), its parts; host = ms/step - step(); CPU of the loop "
          "thread and of the outbox thread per step; send: ms in send(); polls: is_cancelled() per step; rsp/st: "
          "responses sent per step; tok/rsp: tokens per response over the whole run; gpuwait: the loop's wait for "
          "the stand-in GPU per step (--gpu-ms); us/str, obx/str: the loop's wall and the outbox's CPU per stream, "
          "in us; rt-only: host_step_probe's runtime alone; "
          f"x: ms/step / rt-only" + (f"; medians of {args.repeat} runs" if args.repeat > 1 else "") + "\n" + header
          + "\n" + "\n".join(_row(r) for r in medians))
    if args.output:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                           "medians": medians}, indent=1))


def _row(r: dict) -> str:
    base = r["runtime_only_ms"]
    ratio = f"{r['ms_per_step'] / base:5.1f}" if base else "    -"
    return (f"{r['streams']:>7} {int(r['coalesce']):>4} {r['ms_per_step']:8.3f} {r['step_ms']:7.3f} "
            f"{r['host_ms']:7.3f} {r['between_steps_ms']:7.3f} {r['on_events_ms']:7.3f} {r['loop_cpu_ms']:7.3f} "
            f"{r['outbox_cpu_ms']:7.3f} {r['send_ms']:6.3f} {r['polls_per_step']:5.1f} {r['sends_per_step']:6.1f} "
            f"{r['tokens_per_response']:7.2f} {r['gpu_wait_ms']:7.3f} "
            f"{r['loop_us_per_stream']:6.1f} {r['outbox_us_per_stream']:7.1f} {(base or 0):7.3f} {ratio}")


def _medians(results: list[dict]) -> list[dict]:
    """Each case's median figures over its repeats (numbers only; profiles and phases left out)."""
    cases: dict = {}
    for r in results:
        cases.setdefault((r["streams"], r["coalesce"]), []).append(r)
    out = []
    for runs in cases.values():
        first = runs[0]
        out.append({k: (float(np.median([r[k] for r in runs])) if isinstance(v, float) else v)
                    for k, v in first.items() if k not in ("profile", "phases_ms", "repeat")} | {"runs": len(runs)})
    return out


if __name__ == "__main__":
    main()
