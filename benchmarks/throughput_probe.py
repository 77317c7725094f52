"""Where a loaded step's time goes (issue 31): the throughput workload, stepped for a bounded time, with a line
every few seconds (steps, ms per step, rows per step by kind, output tokens/s, requests running and waiting, KV
usage, and the runtime's host time by phase: planning, eager rows, fast-path rows) and, once the batch is full (or
``--trace-after`` seconds in, for a workload whose batch never fills: 2048/128 runs ~128 rows beside one prompt a step),
a torch profiler trace of a few steps summed by kernel, with the share of the traced time the GPU was busy (the union
of its kernels' and copies' intervals: what the host left idle between them is the rest). One call on the H200:

    python benchmarks/throughput_probe.py -c build_configs/r1-distill-qwen-7b-random-fp8-tp1-load.yaml \\
        --engines-dir /tmp/engines --lengths 128/2048 --requests 512 --seconds 90 -o probe.json

Needs a built engine (``trtllm-pipeline build``); prints a table and writes the lines and the kernel sums as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from trtllm_pipeline.config import load_config
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime


def kernel_sums(prof, top: int) -> list[dict]:
    """The profiler's device time by kernel name, largest first (microseconds over the traced steps)."""
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "cuda_time_total", 0)
        if device_us:
            rows.append({"name": e.key[:90], "calls": e.count, "device_us": device_us,
                         "cpu_us": e.cpu_time_total})
    return sorted(rows, key=lambda r: -r["device_us"])[:top]


def busy_share(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(the share of [first start, last end] that the union of ``intervals`` covers, that span): how busy a device
    was over a trace, where overlapping intervals (kernels of two streams) count once."""
    if not intervals:
        return 0.0, 0.0
    spans = sorted(intervals)
    covered, (run_start, run_end) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > run_end:
            covered += run_end - run_start
            run_start, run_end = start, end
        else:
            run_end = max(run_end, end)
    covered += run_end - run_start
    total = max(end for _, end in spans) - spans[0][0]
    return (covered / total if total > 0 else 1.0), total


def device_busy(prof) -> tuple[float, float]:
    """``busy_share`` of a trace's CUDA activity (kernels, copies, memsets), in microseconds."""
    cuda = torch.autograd.DeviceType.CUDA
    return busy_share([(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == cuda])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--lengths", default="128/2048", help="input/output tokens of every request")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=90.0, help="stop stepping after this long")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    ap.add_argument("--profile-steps", type=int, default=8, help="steps traced once the batch is full (0: none)")
    ap.add_argument("--trace-after", type=float, default=None,
                    help="trace those steps this many seconds in, full batch or not")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    inp, out = (int(x) for x in args.lengths.split("/"))
    cfg = load_config(Path(args.config))
    rt = load_runtime(cfg, args.engines_dir)
    print(f"runtime: {rt.decode_path}; max batch {rt.max_batch_size}, max_num_tokens "
          f"{rt.scheduler.max_num_tokens}", flush=True)
    rng = random.Random(7)
    params = SamplingParams(max_tokens=out, min_tokens=out, end_id=-1)
    for i in range(args.requests):
        rt.submit(("probe", i), [rng.randrange(100, min(30000, rt.vocab_size - 1)) for _ in range(inp)], params)
    cuda = rt.device.type == "cuda"
    lines, kernels, busy = [], [], None
    start = last = time.perf_counter()
    prev = {**rt.phase_times(), "tokens": 0}
    tokens = 0
    profiled = args.profile_steps == 0
    header = (f"{'s':>6} {'steps':>6} {'ms/step':>8} {'fast rows':>9} {'eager rows':>10} {'eager tok':>9} "
              f"{'tok/s':>8} {'run':>4} {'wait':>5} {'KV %':>5} {'plan ms':>7} {'eager ms':>8} {'fast ms':>7}")
    if cuda and args.profile_steps:  # the first steps: the batch's prompts prefilled (eager rows), decodes beside
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                tokens += sum(len(e.token_ids) for e in rt.step())
            torch.cuda.synchronize()
        prefill = kernel_sums(prof, 25)
        cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
        share, span_us = device_busy(prof)
        print(f"-- traced the first 3 steps ({rt.phase_times()['eager_tokens']} prompt tokens): the GPU busy "
              f"{100 * share:.1f}% of {span_us / 1000:.1f} ms", flush=True)
        for k in prefill:
            print(f"   {k['device_us'] / 3000:8.3f} ms/step  {k['calls']:>6}  {k['name']}", flush=True)
        for e in cpu:
            print(f"   cpu {e.self_cpu_time_total / 3000:8.3f} ms/step  {e.count:>6}  {e.key[:80]}", flush=True)
        kernels_prefill = prefill
    else:
        kernels_prefill = []
    print(header, flush=True)
    while rt.has_work() and time.perf_counter() - start < args.seconds:
        running = len(rt.scheduler.running)
        full = running >= min(rt.max_batch_size, args.requests) and all(r.decoding for r in rt.scheduler.running)
        due = args.trace_after is not None and time.perf_counter() - start >= args.trace_after
        if not profiled and cuda and (due if args.trace_after is not None else full):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(args.profile_steps):
                    tokens += sum(len(e.token_ids) for e in rt.step())
                torch.cuda.synchronize()
            kernels = kernel_sums(prof, 25)
            profiled = True
            share, span_us = device_busy(prof)
            busy = {"share": share, "span_ms": span_us / 1000}
            print(f"-- traced {args.profile_steps} steps at {running} running: the GPU busy {100 * share:.1f}% of "
                  f"{span_us / 1000:.1f} ms", flush=True)
            for k in kernels:
                print(f"   {k['device_us'] / args.profile_steps / 1000:8.3f} ms/step  {k['calls']:>6}  {k['name']}",
                      flush=True)
            continue
        tokens += sum(len(e.token_ids) for e in rt.step())
        now = time.perf_counter()
        if now - last >= args.every:
            cur = rt.phase_times()
            steps = cur["steps"] - prev["steps"] or 1
            line = {"s": now - start, "steps": steps, "ms_per_step": (now - last) * 1000 / steps,
                    "fast_rows": (cur["fast_rows"] - prev["fast_rows"]) / steps,
                    "eager_rows": (cur["eager_rows"] - prev["eager_rows"]) / steps,
                    "eager_tokens": (cur["eager_tokens"] - prev["eager_tokens"]) / steps,
                    "chained": (cur["chained_steps"] - prev["chained_steps"]) / steps,
                    "tokens_per_s": (tokens - prev["tokens"]) / (now - last),
                    "running": len(rt.scheduler.running), "waiting": len(rt.scheduler.waiting),
                    "kv_usage": rt.stats().get("kv_cache_usage", 0.0),
                    **{f"{k}_ms": (cur[f"{k}_s"] - prev[f"{k}_s"]) * 1000 / steps for k in ("plan", "eager", "fast")}}
            lines.append(line)
            print(f"{line['s']:6.1f} {steps:6d} {line['ms_per_step']:8.2f} {line['fast_rows']:9.1f} "
                  f"{line['eager_rows']:10.2f} {line['eager_tokens']:9.1f} {line['tokens_per_s']:8.0f} "
                  f"{line['running']:4d} {line['waiting']:5d} {100 * line['kv_usage']:5.1f} {line['plan_ms']:7.2f} "
                  f"{line['eager_ms']:8.2f} {line['fast_ms']:7.2f}", flush=True)
            prev, last = {**cur, "tokens": tokens}, now
    rt.close()
    if args.output:
        args.output.write_text(json.dumps({"config": cfg.name, "lengths": args.lengths, "requests": args.requests,
                                           "lines": lines, "kernels": kernels, "busy": busy,
                                           "kernels_prefill": kernels_prefill}, indent=1))


if __name__ == "__main__":
    main()
