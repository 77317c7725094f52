"""Scoring through the torch runtime: log-likelihoods of continuations (the eval tasks' ``LM.score``), next-token
and sequence log-probabilities (the fidelity task, checks), and final hidden states. Each runs whole sequences in one
eager forward on blocks of its own, between generation requests (never beside them), so it is the numerical
reference the fast path is checked against.

``Scoring`` is a part of ``TorchRuntime`` (its KV cache manager, executor and forward), kept apart as
``OverlapSteps`` and ``DeviceDrafting`` are.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow


class Scoring:
    """Scoring's half of ``TorchRuntime`` (see the module's docstring)."""

    def hidden_states(self, ids: Sequence[int]) -> torch.Tensor:
        """Final hidden states [T, hidden] of one whole sequence, run once in blocks of its own (tests, checks)."""
        if self.has_work():
            raise RuntimeError("hidden_states() cannot run while generation requests are active")
        rid = ("hidden", 0)
        if self.kv.admit(rid, list(ids), len(ids), use_cache=False, watermark=False) is None:
            raise UnavailableError(f"{len(ids)} tokens do not fit the KV pool's free blocks.")
        try:
            return self._forward([PlanRow(rid, list(ids), 0, self.kv.tables[rid], True)])
        finally:
            self.kv.free(rid)

    def next_token_logprobs(self, context: Sequence[int]) -> list[float]:
        if self.has_work():
            raise RuntimeError("next_token_logprobs() cannot run while generation requests are active")
        hidden = self.hidden_states(context)
        return torch.log_softmax(self.executor.logits(hidden[-1]), dim=-1).tolist()

    def sequence_logprobs(self, token_ids: Sequence[int], first: int) -> torch.Tensor:
        if self.has_work():
            raise RuntimeError("sequence_logprobs() cannot run while generation requests are active")
        if not 0 <= first < len(token_ids):
            raise InputError(f"sequence_logprobs(): position {first} is outside the {len(token_ids)} tokens.")
        hidden = self.hidden_states(token_ids)
        return torch.log_softmax(self.executor.logits(hidden[first:]), dim=-1)

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihoods of continuations, computing a shared context prefix once.

        Requests whose inputs (context + continuation minus its last token) are identical, like
        the four answer letters of one MMLU question, share a single forward pass; the common prefix of all
        (the few-shot block) is computed once and its full KV blocks shared by every row's block table through
        the prefix cache (whatever ``enable_kv_cache_reuse`` says: these blocks are only this call's).
        """
        if self.has_work():
            raise RuntimeError("score() cannot run while generation requests are active")
        if not contexts:
            return []
        seqs = [list(c) + list(x) for c, x in zip(contexts, continuations)]
        if any(not c for c in contexts) or any(not x for x in continuations):
            raise InputError("score() needs a non-empty context and continuation for every request.")
        if (longest := max(len(s) for s in seqs)) > self.max_seq_len:
            raise InputError(f"a scored sequence has {longest} tokens; max_seq_len is {self.max_seq_len}.",
                             fix="truncate the context from the left before scoring")
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(seqs):
            groups.setdefault(tuple(s[:-1]), []).append(i)
        keys = list(groups)
        prefix = min(_common_prefix(keys), min(len(c) for c in contexts) - 1)
        shared = prefix // self.kv.block_size * self.kv.block_size  # its whole blocks, shared by table
        held: list[Any] = []
        try:
            if shared > 0:
                self._score_rows([(("score-prefix",), list(keys[0][:shared]), shared - 1)], held, commit=True)
            results: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
            for start in range(0, len(keys), self.max_batch_size):
                chunk = keys[start : start + self.max_batch_size]
                # the first position whose logits a group needs: the cache may give at most the positions before
                firsts = [min(len(contexts[i]) for i in groups[key]) - 1 for key in chunk]
                rows = [(("score", j), list(key), first) for j, (key, first) in enumerate(zip(chunk, firsts))]
                hidden, plan_rows = self._score_rows(rows, held)
                offset = 0
                for row, key, first in zip(plan_rows, chunk, firsts):
                    h = hidden[offset + first - row.start : offset + len(row.tokens)]
                    offset += len(row.tokens)
                    logprobs = torch.log_softmax(self.executor.logits(h), dim=-1)
                    for i in groups[key]:
                        skip = len(contexts[i]) - 1 - first
                        target = torch.tensor(continuations[i], device=self.device)
                        lp = logprobs[skip : skip + len(target)]
                        results[i] = (float(lp.gather(-1, target[:, None]).sum()),
                                      bool(torch.equal(lp.argmax(-1), target)))
                for row in plan_rows:
                    self.kv.free(row.request_id)
                    held.remove(row.request_id)
            return results
        finally:
            for rid in held:
                self.kv.free(rid)

    def _score_rows(self, rows, held: list, commit: bool = False):
        """Rows (id, tokens, first: the first position whose hidden state is needed) admitted through the prefix
        cache and run in one forward; ``commit``: their full blocks keyed for the rows that follow."""
        plan_rows = []
        for rid, tokens, first in rows:
            done = self.kv.admit(rid, tokens[: first + 1], len(tokens), use_cache=True, watermark=False)
            if done is None:
                raise UnavailableError(f"scoring {len(rows)} sequences of up to {max(len(t) for _, t, _ in rows)} "
                                       "tokens needs more KV blocks than the pool has free.",
                                       fix="score fewer or shorter sequences at once, or give the pool more memory")
            held.append(rid)
            plan_rows.append(PlanRow(rid, tokens[done:], done, self.kv.tables[rid], False))
        hidden = self._forward(plan_rows)
        if commit:
            for rid, tokens, _ in rows:
                self.kv.commit(rid, tokens, use_cache=True)
        return hidden, plan_rows


def _common_prefix(seqs: list[tuple[int, ...]]) -> int:
    first, n = seqs[0], len(seqs[0])
    for s in seqs[1:]:
        n = min(n, len(s))
        for j in range(n):
            if s[j] != first[j]:
                n = j
                break
    return n
