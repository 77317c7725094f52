"""One tensor-parallel rank's Qwen2 engine, built from its own ``rank{i}.safetensors`` only.

TensorRT-LLM's layout, as the checkpoint has it (``checkpoint`` module docstring):

* column-parallel ``attention.qkv``, ``mlp.fc``, ``mlp.gate``: this rank's output features, so it
  computes ``heads / tp`` query heads and its KV heads (``kv / tp``, or the one KV head it
  replicates when tp exceeds the KV heads: rank r holds head ``r * kv // tp``, which is the head its
  query heads attend to). Nothing to exchange: the inputs are whole on every rank.
* row-parallel ``attention.dense``, ``mlp.proj``: this rank's input features, so its output is a
  partial sum: all-reduced (summed) over the ranks, then the bias is added once, after the reduce
  (TensorRT-LLM does not split a row-parallel bias; added on every rank before the sum it would
  count tp times). Qwen2 has none, the code keeps the rule for checkpoints that do.
* ``vocab_embedding`` (``use_parallel_embedding``, ``embedding_sharding_dim`` 0, as ModelOpt exports
  for tp > 1): this rank's rows of the vocabulary; a token outside them looks up zeros, and the
  all-reduce gives every rank the whole embedding.
* ``lm_head``: vocabulary-parallel, this rank's rows of the padded vocabulary; rank 0 gathers the
  slices into the whole logits. Not replicated: each rank loads only its own file, which holds only
  its slice, and a replicated head would cost every rank the whole ``vocab x hidden`` matrix (for
  R1-distill 7B, 1.1 GB of bf16 per GPU) to save one gather of ``rows x vocab`` float32 per step.

Quantized linears need nothing of their own: each rank file carries its own scales (per tensor,
per channel or per group, split with the features they scale), so ``torch_engine/model.Linear`` runs a
rank's slice exactly as it runs a whole layer, and an activation quantized per tensor with the
calibrated scale is the same numbers sliced or whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trtllm_pipeline import checkpoint
from trtllm_pipeline.checkpoint import CheckpointLayout
from trtllm_pipeline.runtimes.torch_engine.model import Linear, Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch
from trtllm_pipeline.runtimes.torch_engine.tp import comm as wire
from trtllm_pipeline.runtimes.torch_engine.tp.comm import Comm


class RowParallelLinear(Linear):
    """A row-parallel slice: partial sum, all-reduce, then the (unsplit) bias once.

    With one rank the bias stays inside the GEMM (the reduce is the identity), so the layer is
    exactly a ``Linear`` to the CUDA fast path, which reads its weights and bias directly.
    """

    def __init__(self, tensors: dict[str, Any], prefix: str, dtype: torch.dtype, device: torch.device, fmt: str,
                 group: int | None, comm: Comm):
        mine = {k: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        bias = mine.pop(prefix + ".bias", None) if comm.size > 1 else None
        super().__init__(mine, prefix, dtype, device, fmt, group)
        self.comm = comm
        self.reduced_bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.comm.all_reduce(super().forward(x).contiguous())
        return out if self.reduced_bias is None else out + self.reduced_bias


class ShardedQwen2Engine(Qwen2Engine):
    """Rank ``comm.rank`` of ``comm.size``: its heads, its slices, its part of the KV cache."""

    def __init__(self, config: dict[str, Any], tensors: dict[str, Any], comm: Comm, **kwargs):
        layout = CheckpointLayout(config)
        if layout.tp != comm.size or layout.pp != 1:
            raise ValueError(f"a tp={layout.tp} pp={layout.pp} checkpoint cannot run as {comm.size} "
                             "tensor-parallel ranks")
        # Plain attributes, set before Qwen2Engine.__init__ runs the hooks that read them.
        self.comm, self.tp_rank, self.tp_size = comm, comm.rank, comm.size
        self.vocab, self.parallel_embedding = layout.vocab, layout.parallel_embedding
        super().__init__(config, tensors, **kwargs)

    def _local_heads(self, layout: CheckpointLayout) -> tuple[int, int]:
        return layout.heads // self.tp_size, layout.kv_heads_per_rank

    def _row_linear(self, tensors, prefix: str, dtype, device, fmt: str, group: int | None) -> Linear:
        return RowParallelLinear(tensors, prefix, dtype, device, fmt, group, self.comm)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.parallel_embedding:  # replicated: every rank holds the whole table
            return super()._embed(tokens)
        rows = self.embedding.shape[0]
        local = tokens - self.tp_rank * rows
        outside = (local < 0) | (local >= rows)
        x = F.embedding(local.clamp(0, rows - 1), self.embedding).masked_fill(outside[..., None], 0)
        return self.comm.all_reduce(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: the whole float32 logits (the slices gathered, the padding rows cut); other ranks: None."""
        parts = self.comm.gather(super().logits(hidden).contiguous())
        return None if parts is None else torch.cat(parts, dim=-1)[..., : self.vocab]


def load_shard(ckpt_dir: Path, comm: Comm, *, device: torch.device, dtype: torch.dtype | None,
               max_seq_len: int) -> ShardedQwen2Engine:
    """Rank ``comm.rank``'s engine from its own file (W8A16 quantized from it as trtllm-build does per rank)."""
    config = checkpoint.read_config(ckpt_dir)
    tensors = checkpoint.load_rank_file(ckpt_dir, config, comm.rank)
    tensors = checkpoint.trtllm_build_quantize(config, [tensors])[0]
    return ShardedQwen2Engine(config, tensors, comm, device=device, max_seq_len=max_seq_len, dtype=dtype)


@torch.inference_mode()
def run_command(engine: ShardedQwen2Engine, op: int, ints: list[int], payload: torch.Tensor | None):
    """What every rank does for one command (``comm`` op codes); rank 0 gets the result."""
    if op == wire.FORWARD:
        return engine(PagedBatch.unflat(payload, ints[0], ints[1], ints[2]))
    if op == wire.LOGITS:
        return engine.logits(payload)
    if op == wire.ALLOCATE_KV:
        engine.allocate_kv(ints[0], ints[1])
        return None
    if op == wire.PING:
        engine.comm.all_reduce(torch.zeros(1, device=engine.comm.device))
        return None
    if op == wire.FAST_PREPARE:  # the CUDA fast path (Triton): imported where it is asked for
        from trtllm_pipeline.runtimes.torch_engine.cuda import graphs

        engine.fast = graphs.prepared(engine, payload.tolist(), use_graphs=bool(ints[1]),
                                      step=getattr(engine, "fast_step", None))  # rank 0 built its step already
        engine.fast_step = None
        return engine.fast
    if op == wire.FAST_DECODE:
        return engine.fast.decode_padded(payload.view(2 + ints[1], ints[0]))
    raise ValueError(f"unknown tensor-parallel command {op}")

