"""The collectives a tensor-parallel group runs, and the command the leader broadcasts each step.

A ``Comm`` owns its own process group object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on
CUDA) instead of torch.distributed's global default group, so that several runtimes can live in one
process (tests, the demo) and closing one leaves the others alone. Gloo is bound to 127.0.0.1.

Every collective has the group's timeout, so a rank that stops answering fails the call instead of
hanging it; a rank that dies closes its sockets, which fails the others' pending calls at once.

The wire format is tensors only, never pickles: a fixed header of ``HEADER`` int64 (the op code and
up to seven integers), then, when the op has one, a payload tensor whose size the header gives.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

HEADER = 8
# Op codes. FORWARD: rows B, tokens N, table width W; payload a ``plan.PagedBatch`` flat (int64 tokens N,
# starts B, lengths B, block tables B*W). LOGITS: rows, hidden size, dtype code; payload the hidden states' rows
# (every rank computes its vocabulary slice, rank 0 gathers them). ALLOCATE_KV: blocks, block size: every rank
# allocates its KV pool. PING: nothing (a heartbeat; an all-reduce answers it). STOP: the worker exits.
# FAST_PREPARE: bucket count, CUDA graphs (0/1); payload the batch buckets: every rank builds and captures its
# fast decode step. FAST_DECODE: rows, table width W; payload tokens, positions and block tables ((2 + W) x rows).
FORWARD, LOGITS, ALLOCATE_KV, PING, STOP, FAST_PREPARE, FAST_DECODE = 1, 2, 3, 4, 5, 6, 7
OP_NAMES = {FORWARD: "forward", LOGITS: "logits", ALLOCATE_KV: "allocate_kv", PING: "ping", STOP: "stop",
            FAST_PREPARE: "fast_prepare", FAST_DECODE: "fast_decode"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Comm:
    """One rank's end of the group: ``rank`` of ``size``, tensors on ``device``."""

    def __init__(self, rank: int, size: int, device: torch.device, timeout_s: float):
        self.rank, self.size, self.device, self.timeout_s = rank, size, device, timeout_s
        self.pg = None

    def connect(self, store: dist.Store) -> None:
        """Join the group (blocks until every rank has joined, or the timeout); ranks load their shards
        first, so that a rank that fails to load is seen dead instead of waited for here."""
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.PrefixStore("tp", store)
        device, rank, size = self.device, self.rank, self.size
        if device.type == "cuda":
            torch.cuda.set_device(device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            options._timeout = timeout
            self.pg = dist.ProcessGroupGloo(store, rank, size, options)

    # ---- collectives ----------------------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` from rank 0 into every rank's ``tensor`` (in place)."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor], opts).wait()
        return tensor

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place (row-parallel partial sums, the vocabulary-parallel embedding)."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self.pg.allreduce([tensor], opts).wait()
        return tensor

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` into ``out`` (one tensor per rank, rank order) on every rank: the fast
        decode step's lm_head slices (preallocated, so a CUDA graph can capture it)."""
        self.pg.allgather([out], [tensor]).wait()
        return out

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape) at rank 0, in rank order; None elsewhere."""
        opts = dist.GatherOptions()
        opts.rootRank = 0
        out = [[torch.empty_like(tensor) for _ in range(self.size)]] if self.rank == 0 else []
        self.pg.gather(out, [tensor.contiguous()], opts).wait()
        return out[0] if self.rank == 0 else None

    # ---- commands -------------------------------------------------------------------------------

    def send(self, op: int, ints: tuple[int, ...] = (), payload: torch.Tensor | None = None) -> torch.Tensor | None:
        """Rank 0: broadcast a command (its header, then its payload); the payload as sent, on ``device``."""
        header = torch.zeros(HEADER, dtype=torch.long)
        header[0] = op
        header[1 : 1 + len(ints)] = torch.tensor(ints, dtype=torch.long)
        self.broadcast(header.to(self.device))
        if payload is None:
            return None
        return self.broadcast(payload.to(self.device).contiguous())

    def receive(self) -> tuple[int, list[int], torch.Tensor | None]:
        """Other ranks: the next command as (op, its integers, its payload)."""
        header = self.broadcast(torch.zeros(HEADER, dtype=torch.long, device=self.device)).tolist()
        op, ints = header[0], header[1:]
        payload = None
        if op == FORWARD:
            b, n, w = ints[0], ints[1], ints[2]
            payload = self.broadcast(torch.empty(n + 2 * b + b * w, dtype=torch.long, device=self.device))
        elif op == LOGITS:
            payload = self.broadcast(torch.empty((ints[0], ints[1]), dtype=DTYPES[ints[2]], device=self.device))
        elif op == FAST_PREPARE:
            payload = self.broadcast(torch.empty(ints[0], dtype=torch.long, device=self.device))
        elif op == FAST_DECODE:
            payload = self.broadcast(torch.empty((2 + ints[1]) * ints[0], dtype=torch.long, device=self.device))
        return op, ints, payload
