"""The collectives of one tensor-parallel fast decode step, measured alone: all-reduce time per token.

The distributed fast path (``runtimes/torch_engine/cuda/decode_step.py`` over a ``ShardedQwen2Engine`` rank) runs, per
step, one all-reduce of the embedding rows, two per layer (after attention.dense and mlp.proj) of
[batch, hidden] in the compute dtype, and one all-gather of the ranks' float32 lm_head slices. This
script runs exactly those, with the runtime's own ``tp.comm.Comm`` (NCCL, one GPU per rank; gloo on
127.0.0.1 on CPU), at the 7B's sizes by default: on CUDA captured in one CUDA graph as the step captures
them, replayed and timed with CUDA events; on CPU launched eagerly (a check of the code path; its times
are gloo's on shared cores, not a GPU's). Before timing, each collective's result is checked (rank r
contributes r + 1: the all-reduce must give N (N + 1) / 2 everywhere, the gather each rank's slice).

    python benchmarks/tp_collectives.py --world-size 4 -o tp4-collectives.json      # 4 GPUs
    python benchmarks/tp_collectives.py --world-size 2 --device cpu --layers 2 --hidden 64 --vocab 256

Prints one JSON object (and writes it with ``-o``): per batch, microseconds per step for the whole set
and for each kind, and the bytes each rank sends into them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import queue
import sys
import time
from pathlib import Path

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# NVLink multicast stays off on the device tool's shared machines (its KINDS.md); the ranks inherit this
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trtllm_pipeline.runtimes.torch_engine.tp.comm import Comm  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.tp.launcher import listening_socket  # noqa: E402


def step_collectives(comm: Comm, batch: int, hidden: int, layers: int, vocab: int, dtype: torch.dtype):
    """(buffers, the step's collectives as callables by kind) at one batch size: preallocated, capturable."""
    dev = comm.device
    rows = torch.empty(batch, hidden, dtype=dtype, device=dev)
    reduced = torch.empty(1, batch, hidden, dtype=dtype, device=dev)
    local = torch.empty(batch, vocab // comm.size, device=dev)
    gathered = [torch.empty_like(local) for _ in range(comm.size)]
    kinds = {
        "embedding all-reduce": lambda: comm.all_reduce(rows),
        f"{2 * layers} row-parallel all-reduces": lambda: [comm.all_reduce(reduced) for _ in range(2 * layers)],
        "lm_head all-gather": lambda: comm.all_gather(gathered, local),
    }
    return (rows, reduced, local, gathered), kinds


def check(comm: Comm, bufs, kinds) -> None:
    """Each collective gives what it must: sums of rank + 1, every rank's slice in rank order."""
    rows, reduced, local, gathered = bufs
    want = comm.size * (comm.size + 1) / 2
    for t in (rows, reduced, local):
        t.fill_(comm.rank + 1)
    kinds["embedding all-reduce"]()
    comm.all_reduce(reduced)
    kinds["lm_head all-gather"]()
    assert torch.all(rows.float() == want) and torch.all(reduced.float() == want), "all-reduce gave a wrong sum"
    for r, part in enumerate(gathered):
        assert torch.all(part == r + 1), f"all-gather: rank {r}'s slice is wrong"


def timed(comm: Comm, fn, replays: int) -> float:
    """Microseconds per call: a CUDA graph replayed (CUDA), or eager launches (CPU)."""
    if comm.device.type == "cuda":
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        comm.all_reduce(torch.zeros(1, device=comm.device))  # start the timed replays together
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            graph.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1000 / replays
    fn()
    comm.all_reduce(torch.zeros(1))
    start = time.perf_counter()
    for _ in range(replays):
        fn()
    return (time.perf_counter() - start) * 1e6 / replays


def rank_main(rank: int, args, port: int, results) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    store = dist.TCPStore("127.0.0.1", port, args.world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    comm = Comm(rank, args.world_size, device, 120.0)
    comm.connect(store)
    dtype = getattr(torch, args.dtype)
    out = []
    for batch in args.batch:
        bufs, kinds = step_collectives(comm, batch, args.hidden, args.layers, args.vocab, dtype)
        check(comm, bufs, kinds)
        row = {"batch": batch, "us_per_step": {}}
        for name, fn in kinds.items():
            row["us_per_step"][name] = timed(comm, fn, args.replays)
        row["us_per_step"]["all"] = timed(comm, lambda: [fn() for fn in kinds.values()], args.replays)
        size = torch.finfo(dtype).bits // 8
        row["bytes_per_rank"] = {"all-reduces": (2 * args.layers + 1) * batch * args.hidden * size,
                                 "all-gather": batch * (args.vocab // args.world_size) * 4}
        out.append(row)
    if rank == 0:
        results.put(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, required=True, help="ranks (one GPU each on CUDA)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--hidden", type=int, default=3584, help="default: DeepSeek-R1-Distill-Qwen-7B")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--vocab", type=int, default=152064, help="padded vocabulary (a multiple of the ranks)")
    ap.add_argument("--dtype", default="bfloat16", help="the compute dtype the all-reduces carry")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    if args.vocab % args.world_size:
        ap.error(f"--vocab {args.vocab} is not a multiple of --world-size {args.world_size}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        ap.error(f"{args.world_size} ranks need {args.world_size} GPUs; torch sees {torch.cuda.device_count()}")
    sock = listening_socket()
    store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], args.world_size + 1, is_master=True,
                          wait_for_workers=False, master_listen_fd=sock.detach())
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, store.port, results)) for r in range(args.world_size)]
    for p in procs:
        p.start()
    rows = None
    while rows is None:  # a rank that fails (its check, NCCL) ends the run at once instead of a hang
        try:
            rows = results.get(timeout=1)
        except queue.Empty:
            if any(p.exitcode for p in procs) or all(p.exitcode is not None for p in procs):
                for p in procs:
                    p.kill()
                sys.exit(f"a rank failed (exit codes {[p.exitcode for p in procs]}); its traceback is above")
    for p in procs:
        p.join(timeout=60)
    failed = [p.exitcode for p in procs if p.exitcode]
    report = {"world_size": args.world_size, "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
              "shape": {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "dtype": args.dtype},
              "method": "CUDA graph of the step's collectives, replayed" if args.device == "cuda" else
                        "eager gloo collectives on shared CPU cores (a code-path check, not a GPU time)",
              "batches": rows, "torch": torch.__version__}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
