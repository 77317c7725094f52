"""The draft-model proposer: a second, smaller checkpoint with the same tokenizer decodes ``k`` tokens greedily (or,
self-speculation, the target's own first layers do: ``from_target_layers``).

It keeps a KV cache of its own (its own pool and ``KVCacheManager``), holding per request the tokens it has fed.
Each ``propose``: the request's history since what the draft already holds (after rolling back past the drafts the
target rejected: the longest prefix of what it fed that still agrees with the history) is fed in one forward with
every other request's, giving the first draft; then ``k - 1`` batched one-token steps give the rest. Eager model
code on any device (``model.Qwen2Engine``), the same the target's verify step runs.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from pathlib import Path
from typing import Any

import torch

from trtllm_pipeline import checkpoint
from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.runtimes.torch_engine.kv_cache import KVCacheManager
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import Proposer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Fed:
    tokens: list[int] = dataclasses.field(default_factory=list)  # what the draft's cache holds, positions 0..
    valid: int = 0  # of those, how many are the request's real history (the rest: its own drafts)


def same_tokenizer(a_dir: Path, b_dir: Path) -> bool:
    """Whether two tokenizer directories map the same strings to the same ids (added tokens included)."""
    from trtllm_pipeline.tokenizer import Tokenizer

    a, b = Tokenizer(a_dir), Tokenizer(b_dir)
    return a.backend.get_vocab(with_added_tokens=True) == b.backend.get_vocab(with_added_tokens=True)


def first_layers(engine: Qwen2Engine, n: int) -> Qwen2Engine:
    """A view of ``engine``'s first ``n`` layers: an attribute dict of its own (the layer list, a KV pool to allocate),
    the target's tensors (no second set of weights)."""
    view = copy.copy(engine)
    view.layers = engine.layers[:n]
    view.cache_k = view.cache_v = None
    return view


def own_pool(engine: Qwen2Engine, *, max_batch_size: int, max_seq_len: int, block_size: int) -> KVCacheManager:
    """A proposer's KV pool on ``engine``, allocated now: every row's whole length, a block a row to spare and the
    null block; and the manager of its blocks."""
    blocks = -(-max_batch_size * max_seq_len // block_size) + max_batch_size + 1
    engine.allocate_kv(blocks, block_size)
    return KVCacheManager(blocks, block_size)


class DraftProposer(Proposer):
    name = "draft"
    # A probe is one eager forward of the draft (its catch-up over the tokens since it last drafted and its first
    # draft in one): ~650 aten ops for SmolLM2's first 7 layers, ~10 of its plain steps (graph replays) on an H100.
    # Within 3% of plain needs >= ~330 plain steps a probe; a 7B's steps are dearer, so fewer there.
    max_backoff = 512
    learns_across_requests = True  # its agreement with the target is the model pair's, not one request's

    def __init__(self, engine: Qwen2Engine, *, vocab_limit: int, max_batch_size: int, max_seq_len: int,
                 block_size: int = 32):
        self.engine, self.vocab_limit, self.max_seq_len = engine, vocab_limit, max_seq_len
        self.kv = own_pool(engine, max_batch_size=max_batch_size, max_seq_len=max_seq_len, block_size=block_size)
        self._fed: dict[Any, _Fed] = {}

    @classmethod
    def from_settings(cls, settings, target) -> "DraftProposer":
        """The draft checkpoint of ``settings.draft_checkpoint`` for ``target`` (a ``TorchRuntime``): refused
        (ConfigError, exit 2) when missing or when its tokenizer is not the target's."""
        from trtllm_pipeline import artifacts

        where = Path(settings.draft_checkpoint).expanduser()
        if not (where / "config.json").is_file():
            raise ConfigError(f"runtime.speculative.draft_checkpoint: {where} is not a checkpoint directory "
                              "(no config.json).", fix="point it at a build's engines/<name>/checkpoint "
                              "(run `quantize` for the draft's config first)")
        draft_tok, target_tok = artifacts.checkpoint_tokenizer(where), target.tokenizer_dir
        if not (draft_tok / "tokenizer.json").is_file() or not same_tokenizer(draft_tok, target_tok):
            raise ConfigError(f"runtime.speculative.draft_checkpoint: the draft's tokenizer ({draft_tok}) is not the "
                              f"target's ({target_tok}); drafted ids would mean other tokens.",
                              fix="use a draft model of the target's family with the same tokenizer, or method: ngram")
        config, tensors = checkpoint.load_checkpoint(where)
        engine = Qwen2Engine(config, tensors, device=target.device, max_seq_len=target.max_seq_len,
                             dtype=target.engine.dtype)
        del tensors
        log.info("speculative decoding: draft model %s (%d layers)", where, len(engine.layers))
        return cls(engine, vocab_limit=target.vocab_size, max_batch_size=target.max_batch_size,
                   max_seq_len=target.max_seq_len)

    @classmethod
    def from_target_layers(cls, settings, target) -> "DraftProposer":
        """Self-speculation: the target's first ``settings.draft_layers`` layers (default a quarter), then its own
        final norm and head, as the draft (no second set of weights: the layers are the target's tensors; only
        the KV cache is the draft's own). Needs the whole engine in this process (not a tensor-parallel shard)."""
        engine = target.engine
        total = len(engine.layers)
        n = settings.draft_layers or max(1, total // 4)
        if target.executor.world_size > 1:
            raise ConfigError("runtime.speculative.method: self needs the whole target in one process; this one "
                              f"runs as {target.executor.world_size} tensor-parallel ranks.",
                              fix="use method: ngram, or runtime.tp_mode: merged")
        if n >= total:
            raise ConfigError(f"runtime.speculative.draft_layers: {n} is not fewer than the target's {total} layers.",
                              fix=f"use 1..{total - 1}")
        draft = first_layers(engine, n)
        log.info("speculative decoding: self-speculation with the first %d of %d layers", n, total)
        return cls(draft, vocab_limit=target.vocab_size, max_batch_size=target.max_batch_size,
                   max_seq_len=target.max_seq_len)

    def propose(self, batch):
        out: list[list[int]] = [[] for _ in batch]
        live: list[int] = []  # indexes into batch still drafting
        rows = []
        for i, r in enumerate(batch):
            history = list(r.prompt) + list(r.generated)
            if len(history) + r.k > self.max_seq_len:
                continue
            fed = self._fed.get(r.request_id)
            if fed is None:
                if self.kv.admit(r.request_id, [], len(history) + r.k, watermark=False) is None:
                    continue  # the draft's pool is full: no drafts for this one this step
                fed = self._fed[r.request_id] = _Fed()
            keep = _agreeing(fed, history)
            if keep == len(history):  # never: the last token is new; guard so a row feeds at least one token
                keep -= 1
            del fed.tokens[keep:]
            if not self.kv.grow(r.request_id, len(history) + r.k):
                self.release(r.request_id)
                continue
            rows.append((history[keep:], keep, self.kv.tables[r.request_id]))
            fed.tokens.extend(history[keep:])
            fed.valid = len(history)
            live.append(i)
        step = 0
        while live:
            tokens = self._next(rows)
            step += 1
            rows, still = [], []
            for i, t in zip(live, tokens):
                r = batch[i]
                if t >= self.vocab_limit:  # a padded id of the draft's vocabulary: no word of the target's
                    continue
                out[i].append(t)
                if step < r.k:
                    fed = self._fed[r.request_id]
                    rows.append(([t], len(fed.tokens), self.kv.tables[r.request_id]))
                    fed.tokens.append(t)
                    still.append(i)
            live = still
        return out

    @torch.inference_mode()
    def _next(self, rows) -> list[int]:
        """The draft's greedy next token after each row (tokens, start, table) is fed."""
        hidden = self.engine(PagedBatch.of(rows).to(self.engine.device))
        ends = torch.tensor(list(itertools.accumulate(len(t) for t, _, _ in rows)), device=hidden.device) - 1
        return self.engine.logits(hidden[ends]).argmax(-1).tolist()

    def release(self, request_id):
        if self._fed.pop(request_id, None) is not None:
            self.kv.free(request_id)

    def close(self):
        for rid in list(self._fed):
            self.release(rid)


def _agreeing(fed: _Fed, history: list[int]) -> int:
    """How many of the fed tokens still agree with the history (the real ones, then drafts the target accepted)."""
    n = min(fed.valid, len(history))
    while n < len(fed.tokens) and n < len(history) and fed.tokens[n] == history[n]:
        n += 1
    return n

