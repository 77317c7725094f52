"""The EAGLE-3 proposer: a draft head (``eagle3_head``) reading the target's own residual streams drafts ``k`` tokens.

The head needs, for every context token, the target's streams at its capture points (``eagle3_checkpoint``:
by default entering layers 2, L // 2 and L - 3). The runtime's steps do not hand those out, so this is a correctness
path, as ``draft`` is: a second view of the target (its first layers, up to the last capture point: the target's own
tensors, a KV pool of the proposer's own, as ``self`` speculation makes one) runs each request's tokens it has not
seen yet (``Qwen2Engine.residual_streams``), batched over the requests; that costs about those layers' share of a
target forward per new token, on top of the target's own step.

Per request, with history x_0 .. x_{n-1} (the last one just emitted by the target):

* the target view has run x_0 .. x_{n-1}, giving g_i = fc(streams at i) for each;
* the head's KV holds pairs (g_i, x_{i+1}) at positions i = 0 .. n - 2 (EAGLE's shift: the hidden state of one
  token beside the embedding of the next). Only pairs of real tokens are kept: what was drafted last time is
  dropped, and the pairs of the drafts the target accepted are fed again with the target's g (as EAGLE's drafting
  loop keeps only ``stable_kv``);
* its output at position n - 2 gives the first draft d_1 (a draft-vocabulary id mapped to the target's through
  ``d2t``); each further draft feeds (the previous output, the previous draft) at the next position.

Greedy drafts; the target's verify step keeps exactly plain decoding's tokens whatever they are (``acceptance``).
Needs the whole target in this process (not a tensor-parallel shard), as ``self`` does.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from trtllm_pipeline.errors import ConfigError, InputError
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch
from trtllm_pipeline.runtimes.torch_engine.speculative import eagle3_checkpoint
from trtllm_pipeline.runtimes.torch_engine.speculative.draft import first_layers, own_pool, same_tokenizer
from trtllm_pipeline.runtimes.torch_engine.speculative.eagle3_head import Eagle3Head, HeadCache
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import Proposer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Request:
    cache: HeadCache
    seen: list[int] = dataclasses.field(default_factory=list)  # tokens the target view has run, positions 0..
    pairs: int = 0  # the head's KV holds the real pairs at positions 0 .. pairs - 1
    pending: torch.Tensor | None = None  # g for positions pairs .. len(seen) - 1 (not yet paired with a next token)
    last: torch.Tensor | None = None  # the head's output at its last real pair: the first draft's


class Eagle3Proposer(Proposer):
    name = "eagle3"

    def __init__(self, head: Eagle3Head, view: Qwen2Engine, points: tuple[int, ...], *, max_batch_size: int,
                 max_seq_len: int, block_size: int = 32):
        self.head, self.view, self.points, self.max_seq_len = head, view, points, max_seq_len
        self.kv = own_pool(view, max_batch_size=max_batch_size, max_seq_len=max_seq_len, block_size=block_size)
        self._requests: dict[Any, _Request] = {}

    @classmethod
    def from_settings(cls, settings, target) -> "Eagle3Proposer":
        """The EAGLE-3 head at ``settings.draft_checkpoint`` for ``target`` (a ``TorchRuntime``), checked against it
        (``eagle3_checkpoint``: InputError / ConfigError, exit 2, naming the fix)."""
        where = Path(settings.draft_checkpoint).expanduser()
        if not where.is_dir():
            raise ConfigError(f"runtime.speculative.draft_checkpoint: {where} is not a directory.",
                              fix="point it at the EAGLE-3 head's directory (config.json and *.safetensors)")
        if target.executor.world_size > 1:
            raise ConfigError("runtime.speculative.method: eagle3 reads the target's hidden states in one process; "
                              f"this target runs as {target.executor.world_size} tensor-parallel ranks.",
                              fix="use method: ngram, or runtime.tp_mode: merged")
        engine = target.engine
        spec = eagle3_checkpoint.read_spec(where, target_layers=len(engine.layers),
                                           target_hidden=engine.embedding.shape[1], target_vocab=target.vocab_size)
        for tok in (where / "tokenizer", where):  # heads rarely ship one; where one does, it must be the target's
            if (tok / "tokenizer.json").is_file() and not same_tokenizer(tok, target.tokenizer_dir):
                raise InputError(f"runtime.speculative.draft_checkpoint ({where}): the head's tokenizer ({tok}) is not "
                                 f"the target's ({target.tokenizer_dir}); its token ids would mean other tokens.",
                                 fix="use the EAGLE-3 head trained for this target")
        tensors = eagle3_checkpoint.load_tensors(spec)
        head = Eagle3Head(spec, tensors, embedding=engine.embedding, target_lm_head=engine.lm_head,
                          max_seq_len=target.max_seq_len, dtype=engine.dtype, device=engine.device)
        del tensors
        view = first_layers(engine, max(spec.points))
        log.info("speculative decoding: EAGLE-3 head %s (hidden %d, draft vocabulary %d) reading the target's "
                 "streams %s (%s)", where, spec.hidden, spec.draft_vocab, list(spec.points), spec.points_from)
        return cls(head, view, spec.points, max_batch_size=target.max_batch_size, max_seq_len=target.max_seq_len)

    def propose(self, batch):
        out: list[list[int]] = [[] for _ in batch]
        asks, rows = [], []  # rows: the view's runs of the tokens it has not seen
        for i, r in enumerate(batch):
            history = list(r.prompt) + list(r.generated)
            if len(history) < 2 or len(history) + r.k > self.max_seq_len:
                continue
            state = self._state(r.request_id, history)
            if state is None:
                continue  # the view's pool is full: no drafts for this one this step
            if len(history) > len(state.seen):
                rows.append((history[len(state.seen):], len(state.seen), self.kv.tables[r.request_id]))
            asks.append((i, state, history))
        fused = iter(self._fused(rows) if rows else ())
        for i, state, history in asks:
            g = next(fused) if len(history) > len(state.seen) else None  # None: no new token since the last time
            out[i] = self._draft(state, history, g, batch[i].k)
        return out

    def _state(self, request_id, history: list[int]) -> _Request | None:
        """The request's state, its view's blocks grown for ``history``; started afresh where the history no longer
        extends what the view has run (an id reused)."""
        state = self._requests.get(request_id)
        if state is not None and history[: len(state.seen)] != state.seen:
            self.release(request_id)
            state = None
        if state is None:
            if self.kv.admit(request_id, [], len(history), watermark=False) is None:
                return None
            state = self._requests[request_id] = _Request(self.head.new_cache())
        if not self.kv.grow(request_id, len(history)):
            self.release(request_id)
            return None
        return state

    @torch.inference_mode()
    def _fused(self, rows) -> list[torch.Tensor]:
        """Each row's new tokens through the target view: the head's hidden inputs g [new, H] per row."""
        streams = self.view.residual_streams(PagedBatch.of(rows).to(self.view.device), self.points)
        return list(self.head.fuse(streams).split([len(t) for t, _, _ in rows]))

    @torch.inference_mode()
    def _draft(self, state: _Request, history: list[int], g: torch.Tensor | None, k: int) -> list[int]:
        """Feed the request's new real pairs (``g``: the view's output for its new tokens), then draft ``k`` tokens
        greedily."""
        n = len(history)
        if g is not None:
            pending = g if state.pending is None else torch.cat([state.pending, g])  # positions state.pairs .. n - 1
            start = state.pairs
            tokens = torch.tensor(history[start + 1 :], device=self.head.device)  # x_{i+1} for i = start .. n - 2
            state.last = self.head(tokens, pending[: n - 1 - start], start, state.cache)[-1:]
            state.seen, state.pairs, state.pending = history, n - 1, pending[n - 1 - start :]
        drafts, position, last = [], n - 1, state.last
        while True:
            token = self.head.draft(last)
            drafts.append(int(token[0]))
            if len(drafts) == k:
                return drafts
            last = self.head(token, last, position, state.cache)  # past the real pairs: overwritten next time
            position += 1

    def release(self, request_id):
        if self._requests.pop(request_id, None) is not None:
            self.kv.free(request_id)

    def close(self):
        for rid in list(self._requests):
            self.release(rid)
