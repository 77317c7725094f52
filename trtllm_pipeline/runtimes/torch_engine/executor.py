"""The torch runtime's executor seam: what runs the engine, under the scheduler in ``TorchRuntime``.

``TorchRuntime`` owns every request, the batching and the sampling; an executor only runs the model:
``forward`` (tokens into cache slots, hidden states out), ``logits`` (hidden states to float32 logits
over the whole vocabulary) and ``copy_prefix`` (share a computed prefix between cache slots).

* ``LocalExecutor``: the engine in this process, whole (a tp=1 checkpoint, or a tp>1 one merged).
* ``runtimes.tp.executor.TpExecutor``: this process is rank 0 of a tensor-parallel group; each call is
  broadcast to the worker processes, every rank runs its shard, rank 0 gets the result.

An executor that has lost a worker raises ``ExecutorLost`` from every call from then on.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from trtllm_pipeline.errors import UnavailableError


class ExecutorLost(UnavailableError):
    """The tensor-parallel group can no longer run: a worker died or stopped answering."""


def rank_stats(engine, rank: int) -> dict[str, Any]:
    """What one rank holds: its process, device, resident bytes by part, bytes a decode step reads."""
    return {"rank": rank, "pid": os.getpid(), "device": str(engine.cache_k.device), "memory": engine.memory_bytes(),
            "weight_bytes": engine.weight_bytes(), "kv_bytes_per_token": engine.kv_bytes_per_token()}


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process (Linux /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Executor:
    """Runs the engine for ``TorchRuntime``; see the module docstring."""

    engine: Any  # rank 0's engine (the whole one for LocalExecutor): describe() and the CUDA fast path read it
    world_size: int = 1
    failure: ExecutorLost | None = None

    def forward(self, tokens: torch.Tensor, slots: Sequence[int], starts: Sequence[int], key_len: int) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def copy_prefix(self, src_slot: int, dst_slots: Sequence[int], length: int) -> None:
        raise NotImplementedError

    def ranks(self) -> list[dict[str, Any]]:
        """``rank_stats`` of every rank, with each process's current RSS (``rss_bytes``)."""
        raise NotImplementedError

    def fast_decoder(self, buckets: Sequence[int], scratch_slot: int, use_graphs: bool):
        """The CUDA fast path's decoder (``decode``, ``greedy``, ``weight_bytes``, ``buckets``, ``use_graphs``,
        ``setup_seconds``: ``cuda.graphs.DecodeGraphs``'s) over every rank, prepared; raises
        ``cuda.decode_step.Unsupported`` where the path cannot run the engine."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the workers (if any)."""


class LocalExecutor(Executor):
    """The whole engine in this process: today's path, and the reference the distributed one matches."""

    def __init__(self, engine):
        self.engine = engine
        self.device = engine.cache_k.device
        self._stats = rank_stats(engine, 0)

    def forward(self, tokens, slots, starts, key_len):
        return self.engine(tokens.to(self.device), torch.tensor(slots, device=self.device),
                           torch.tensor(starts, device=self.device), key_len)

    def logits(self, hidden):
        return self.engine.logits(hidden)

    def copy_prefix(self, src_slot, dst_slots, length):
        self.engine.copy_prefix(src_slot, torch.tensor(list(dst_slots), device=self.device), length)

    def ranks(self):
        return [{**self._stats, "rss_bytes": rss_bytes(os.getpid())}]

    def fast_decoder(self, buckets, scratch_slot, use_graphs):
        from trtllm_pipeline.runtimes.torch_engine.cuda import graphs  # Triton: imported where the fast path is asked for

        return graphs.prepared(self.engine, buckets, scratch_slot, use_graphs=use_graphs)
