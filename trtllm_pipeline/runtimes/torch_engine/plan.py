"""The step plan: what one engine step runs, as the scheduler decided it, for any executor to consume.

A row is one request's part of the step: ``tokens`` to feed (a chunk of its prompt, the recomputation of a
preempted request, or its last sampled token), written at positions ``start ..`` through its ``block_table``;
``sample`` says whether the row's last token's logits give the request its next token (the last chunk of a
prefill, every decode). With speculative decoding a decode row carries ``draft`` more tokens (the last sampled
token, then k drafted ones): its logits are read at every one of its positions (the verify step), then the table is
rolled back past the rejected drafts (``Scheduler.verified``; ``KVCacheManager.trim`` frees whole blocks past the
kept length). A tree verify row (``parents``: ``speculative.tree``) carries several continuations at once: each token
attends to the context and its ancestors only, at the position of its depth; its K/V is written at its index in the
row, and the accepted path's is moved to consecutive positions before the rollback (``Qwen2Engine.move_kv``).

``PagedBatch`` is the tensor form the model runs (``model.Qwen2Engine.forward``): rows packed one after another
(no padding between them), their start positions and lengths, and their block tables padded with the null block.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.kv_cache import tables_padded


@dataclasses.dataclass
class PlanRow:
    request_id: Any
    tokens: list[int]
    start: int
    block_table: list[int]
    sample: bool
    draft: int = 0  # the last ``draft`` tokens are drafts: logits at every position from the decode token on
    parents: list[int] | None = None  # a tree verify row: per token its parent's index in the row (-1: the first)

    @property
    def is_decode(self) -> bool:  # one token: the CUDA fast path's kind of row
        return len(self.tokens) == 1


@dataclasses.dataclass
class StepPlan:
    rows: list[PlanRow] = dataclasses.field(default_factory=list)
    preempted: list[Any] = dataclasses.field(default_factory=list)  # requests sent back to the queue this step

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)


@dataclasses.dataclass
class PagedBatch:
    """Rows packed: ``tokens`` [N], ``starts`` / ``lengths`` [B], ``block_tables`` [B, W] (int64); ``parents``
    [N] only where some row is a tree: each token's parent's index in its row (-1 for a row's first; a plain row a
    chain, i - 1), a host tensor (the attention's mask and the positions are built from it on the host)."""

    tokens: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    block_tables: torch.Tensor
    parents: torch.Tensor | None = None

    @classmethod
    def of(cls, rows: Sequence[PlanRow] | Sequence[tuple[Sequence[int], int, Sequence[int]]]) -> "PagedBatch":
        """From plan rows, or (tokens, start, block table) triples."""
        triples = [(r.tokens, r.start, r.block_table) if isinstance(r, PlanRow) else r for r in rows]
        width = max(len(t) for _, _, t in triples)
        trees = [r.parents if isinstance(r, PlanRow) else None for r in rows]
        parents = None
        if any(p is not None for p in trees):
            parents = torch.tensor([x for p, (toks, _, _) in zip(trees, triples)
                                    for x in (p if p is not None else range(-1, len(toks) - 1))], dtype=torch.long)
        # one host tensor made (``flat``'s layout), the four fields views of it: a tensor made from a list costs
        # ~8 us of host time each, paid on every step
        flat = [x for toks, _, _ in triples for x in toks]
        flat += [s for _, s, _ in triples]
        flat += [len(toks) for toks, _, _ in triples]
        for table in tables_padded((t for _, _, t in triples), width):
            flat += table
        tokens = sum(len(toks) for toks, _, _ in triples)
        batch = cls.unflat(torch.tensor(flat, dtype=torch.long), len(triples), tokens, width)
        batch.parents = parents
        return batch

    def to(self, device) -> "PagedBatch":
        return PagedBatch(self.tokens.to(device), self.starts.to(device), self.lengths.to(device),
                          self.block_tables.to(device), self.parents)  # (parents: read on the host)

    def flat(self) -> torch.Tensor:
        """One int64 tensor (the tensor-parallel wire format): tokens, starts, lengths, tables; ``unflat`` reads it.
        Tree rows do not cross it: the runtime drafts chains where its executor cannot verify trees."""
        if self.parents is not None:
            raise ValueError("a batch with tree rows cannot be sent to tensor-parallel ranks")
        return torch.cat([self.tokens, self.starts, self.lengths, self.block_tables.reshape(-1)])

    @classmethod
    def unflat(cls, flat: torch.Tensor, rows: int, tokens: int, width: int) -> "PagedBatch":
        n, b = tokens, rows
        return cls(flat[:n], flat[n : n + b], flat[n + b : n + 2 * b], flat[n + 2 * b :].view(b, width))


def row_depths(parents: Sequence[int]) -> list[int]:
    """Per index of a tree row (``PlanRow.parents``), its offset from the row's first position: where it is rotated."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def row_ancestors(parents: Sequence[int]) -> list[int]:
    """Per index of a tree row (``PlanRow.parents``), a bitmask of the row indices it attends to: its ancestors and
    itself (its depth: the count, less one)."""
    out: list[int] = []
    for i, p in enumerate(parents):
        out.append((0 if p < 0 else out[p]) | (1 << i))
    return out


def decode_inputs(tokens, tables, positions, batch: int, width: int) -> torch.Tensor:
    """A decode step's inputs as the fast path reads them: [2 + width, batch] int64 host tensor, row 0 the tokens,
    row 1 the positions, rows 2.. the block tables (column b is row b's table, null blocks after its own; padding
    rows: token 0 at position 0 in the null block)."""
    n = len(tokens)
    rows = torch.zeros((2 + width, batch), dtype=torch.long)
    rows[0, :n] = torch.as_tensor(tokens, dtype=torch.long)
    rows[1, :n] = torch.as_tensor(positions, dtype=torch.long)
    for b, table in enumerate(tables):
        rows[2 : 2 + len(table), b] = torch.as_tensor(table, dtype=torch.long)
    return rows


def logit_span(row: PlanRow) -> int:
    """Positions whose logits a row needs: none (a prefill chunk that samples nothing), its last (a sampling row),
    or its decode token's and every draft's (a verify row)."""
    return (1 + row.draft) if row.sample else 0


def rows_at(t: torch.Tensor | None, positions: list[int]) -> torch.Tensor | None:
    """Rows ``positions`` (increasing) of ``t``: a view where they are one run, as every row of a plain decode step or
    of a verify step is (no index list copied to the device, and no gather launched); a gathered copy otherwise, its
    index list copied from pinned memory behind the work already queued (a plain copy would wait for that work: the
    logits of a step's several prompts, whose prefill is launched before the running step is read, ``step``).
    Readers never write into it (bans are applied to copies)."""
    if t is None or not positions:
        return None if t is None else t[:0]
    first = positions[0]
    if positions[-1] - first + 1 == len(positions):
        return t[first : first + len(positions)]
    index = torch.tensor(positions)
    if t.device.type == "cuda":
        index = index.pin_memory().to(t.device, non_blocking=True)
    return t[index]
