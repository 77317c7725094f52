"""A tensor-parallel worker: rank i > 0 of the group, started by the leader (``launcher.spawn``).

It loads its own ``rank{i}.safetensors`` only, says it is ready through the rendezvous store (with
what it holds: ``rank_stats``), joins the group, then runs each command the leader broadcasts until
told to stop. Any failure ends the process (exit code 1, the traceback in its log): a rank that
cannot run its part must not leave the others waiting, and its exit closes its sockets, which fails
the leader's pending collective at once. It never outlives the leader (``launcher.die_with_leader``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from pathlib import Path


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trtllm_pipeline.runtimes.torch_engine.tp.worker")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--port", type=int, required=True, help="the rendezvous TCPStore on 127.0.0.1")
    p.add_argument("--leader-pid", type=int, required=True)
    p.add_argument("--device", required=True, help="cpu or cuda:<rank>")
    p.add_argument("--dtype", default=None, help="compute dtype; default: the checkpoint's")
    p.add_argument("--max-seq-len", type=int, required=True)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0: torch's default")
    p.add_argument("--timeout", type=float, required=True, help="seconds a collective may wait")
    p.add_argument("--load-timeout", type=float, required=True, help="seconds the rendezvous may wait")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    from trtllm_pipeline.runtimes.torch_engine.tp import launcher

    from trtllm_pipeline.errors import PipelineError

    launcher.die_with_leader(args.leader_pid)
    try:
        serve(args)
    except PipelineError as exc:  # a problem the user can fix (a bad rank file): its message, not a traceback
        print(f"error: {exc.message}" + (f"\nfix: {exc.fix}" if exc.fix else ""), file=sys.stderr, flush=True)
        os._exit(2)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    # No interpreter teardown: destroying a process group whose peers are gone can abort the process.
    os._exit(0)


def serve(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from trtllm_pipeline.runtimes.torch_engine.executor import device_free_bytes, rank_stats
    from trtllm_pipeline.runtimes.torch_engine.tp import comm as wire
    from trtllm_pipeline.runtimes.torch_engine.tp.sharded_model import load_shard, run_command

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    store = dist.TCPStore("127.0.0.1", args.port, args.world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=args.load_timeout))
    comm = wire.Comm(args.rank, args.world_size, device, args.timeout)
    engine = load_shard(args.checkpoint, comm, device=device, dtype=getattr(torch, args.dtype) if args.dtype else None,
                        max_seq_len=args.max_seq_len)
    free = device_free_bytes(device)  # what is left for this rank's KV pool (the leader sizes it over the ranks)
    store.set(f"ready/{args.rank}", json.dumps({**rank_stats(engine, args.rank), "free_bytes": free}))
    comm.connect(store)
    while True:
        op, ints, payload = comm.receive()
        if op == wire.STOP:
            return
        run_command(engine, op, ints, payload)


if __name__ == "__main__":
    main()
