"""The torch runtime's executor seam: what runs the engine, under the scheduler in ``TorchRuntime``.

``TorchRuntime`` owns every request, the scheduler (``scheduler``), the KV block bookkeeping (``kv_cache``) and the
sampling; an executor only runs the model: ``allocate_kv`` (the block pool, once its size is known),
``forward`` (a step plan's rows as a ``plan.PagedBatch``: tokens written through block tables, hidden states out)
and ``logits`` (hidden states to float32 logits over the whole vocabulary).

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
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch


class ExecutorLost(UnavailableError):
    """The tensor-parallel group can no longer run: a worker died or stopped answering."""


def rank_stats(engine, rank: int) -> dict[str, Any]:
    """What one rank holds: its process, device, resident bytes by part, bytes a decode step reads."""
    return {"rank": rank, "pid": os.getpid(), "device": str(engine.device), "memory": engine.memory_bytes(),
            "weight_bytes": engine.weight_bytes(), "kv_bytes_per_token": engine.kv_bytes_per_token()}


def device_free_bytes(device: torch.device) -> int | None:
    """Bytes free on a CUDA device (after what this process holds), or the host's available memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what the caching allocator holds unused (the loaded checkpoint's copies) counts
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


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

    def forward(self, batch: PagedBatch) -> torch.Tensor:
        """Hidden states [N, hidden] of ``batch``'s packed tokens (their K/V written into the pool)."""
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def move_kv(self, table: list[int], sources: list[int], destinations: list[int]) -> None:
        """K/V at positions ``sources`` of a sequence (its block ``table``) copied to ``destinations``, every layer: a
        tree verify row's accepted path moved into place (``Qwen2Engine.move_kv``). Only where ``trees`` is True."""
        raise NotImplementedError

    trees: bool = False  # whether ``forward`` verifies tree rows (``PagedBatch.parents``) and ``move_kv`` runs

    def free_memory(self) -> int:
        """Bytes free on the device now (the least over the ranks): what the KV pool is sized from on CUDA."""
        raise NotImplementedError

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """The KV pool on every rank (each its KV heads): ``num_blocks`` blocks of ``block_size`` tokens."""
        raise NotImplementedError

    def ranks(self) -> list[dict[str, Any]]:
        """``rank_stats`` of every rank, with each process's current RSS (``rss_bytes``)."""
        raise NotImplementedError

    def fast_decoder(self, buckets: Sequence[int], use_graphs: bool):
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
        self.device = engine.device
        self._stats = rank_stats(engine, 0)

    def forward(self, batch):
        return self.engine(batch.to(self.device))

    def logits(self, hidden):
        return self.engine.logits(hidden)

    trees = True

    def move_kv(self, table, sources, destinations):
        self.engine.move_kv(table, sources, destinations)

    def free_memory(self):
        return device_free_bytes(self.device)

    def allocate_kv(self, num_blocks, block_size):
        self.engine.allocate_kv(num_blocks, block_size)
        self._stats = rank_stats(self.engine, 0)

    def ranks(self):
        return [{**self._stats, "rss_bytes": rss_bytes(os.getpid())}]

    def fast_decoder(self, buckets, use_graphs):
        from trtllm_pipeline.runtimes.torch_engine.cuda import graphs  # Triton: imported where the fast path is asked for

        return graphs.prepared(self.engine, buckets, use_graphs=use_graphs)
