"""Token trees of drafts: several continuations of the matched suffix verified in one row (issue 35).

One candidate a step stops at ~1.69x ideal on SmolLM2's grounded prompts; verifying the B most frequent continuations
of the matched suffix at once reaches 1.86x (``benchmarks/spec_tree.py``, docs/perf-notes.md "Several candidates a
step"). A ``DraftTree`` is its nodes in topological order: node ``i`` is ``tokens[i]`` following ``parents[i]`` (-1:
the request's last token, the root; else an earlier node), at ``depth`` positions past the root. In a verify row
(``PlanRow.parents``) the root is the row's first token, so the row's own parents are ``row_parents``: index 0 the
root (-1), node i at index i + 1. The eager model attends each node to the cached context and its own ancestors only
and rotates it at context length + depth; its K/V is written at its row index, and the accepted path's is moved to
consecutive positions afterwards (``Qwen2Engine.move_kv``).

``frequency_tree`` is SuffixDecoding's tree: the continuations of every occurrence of the longest matching suffix
(shorter suffixes' too while there are fewer than ``min_occurrences``), counted in a trie; its ``max_nodes`` most
frequent nodes (a node is never more frequent than its parent, so they are a tree, listed parents first; each node's
first child is its most frequent: ``chain`` is the single most likely continuation).
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Iterable, Sequence

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer, continuation, occurrences


@dataclasses.dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]  # per node: an earlier node's index, or -1 (the root: the request's last token)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a draft tree of {len(self.tokens)} tokens has {len(self.parents)} parents")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"draft tree parents {self.parents} are not in topological order (each -1 or earlier)")

    @classmethod
    def of_chain(cls, tokens: Sequence[int]) -> "DraftTree":
        """Linear drafts as a tree: each node the previous one's child."""
        return cls([int(t) for t in tokens], list(range(-1, len(tokens) - 1)))

    @classmethod
    def of_paths(cls, paths: Iterable[Sequence[int]]) -> "DraftTree":
        """Candidate continuations merged, in order, shared prefixes once (the first candidate is then ``chain``)."""
        index: dict[tuple, int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        for path in paths:
            path = tuple(int(t) for t in path)
            for d in range(1, len(path) + 1):
                if path[:d] not in index:
                    index[path[:d]] = len(tokens)
                    tokens.append(path[d - 1])
                    parents.append(index[path[: d - 1]] if d > 1 else -1)
        return cls(tokens, parents)

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        """Each node's distance from the root (1 for the root's children)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def depth(self) -> int:
        return max(self.depths(), default=0)

    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def chain(self) -> list[int]:
        """The first child at each node from the root: the proposer's most likely path (sampled requests and
        executors that cannot verify a tree take it as linear drafts)."""
        out, at = [], -1
        for i, p in enumerate(self.parents):
            if p == at:
                out.append(self.tokens[i])
                at = i
        return out

    def truncated(self, n: int) -> "DraftTree":
        """Its first ``n`` nodes (still a tree: parents come first; a step's token budget cuts a row so)."""
        return DraftTree(self.tokens[:n], self.parents[:n])

    def limited(self, depth: int) -> "DraftTree":
        """The nodes at most ``depth`` deep (what a request may still emit)."""
        keep = [i for i, d in enumerate(self.depths()) if d <= depth]
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep], [index.get(self.parents[i], -1) for i in keep])


def row_parents(tree: DraftTree) -> list[int]:
    """A verify row's parents: index 0 the root (the request's last token), node i at index i + 1."""
    return [-1] + [p + 1 for p in tree.parents]


def suffix_starts(hist: array, min_n: int, max_n: int, min_occurrences: int) -> list[int]:
    """Where the continuations of ``hist``'s longest matching suffix start (most recent first), then shorter
    suffixes' while fewer than ``min_occurrences`` (a 4-token match seen once says less than 1-token ones seen often)."""
    starts: list[int] = []
    seen: set[int] = set()
    for n in range(min(max_n, len(hist) - 1), min_n - 1, -1):
        for s in occurrences(hist, n):
            if s not in seen:
                seen.add(s)
                starts.append(s)
        if len(starts) >= min_occurrences:
            break
    return starts


def count_trie(continuations: Iterable[Sequence[int]]) -> dict[tuple, list[int]]:
    """{path: [count, rank of its most recent continuation]} over ``continuations`` (most recent first)."""
    trie: dict[tuple, list[int]] = {}
    for rank, cont in enumerate(continuations):
        cont = tuple(cont)
        for d in range(1, len(cont) + 1):
            node = trie.setdefault(cont[:d], [0, rank])
            node[0] += 1
    return trie


def most_frequent(trie: dict[tuple, list[int]], budget: int) -> list[tuple]:
    """The ``budget`` most frequent paths, shallower then more recent first among equals: parents before children."""
    return sorted(trie, key=lambda p: (-trie[p][0], len(p), trie[p][1]))[:budget]


def tree_of_paths(paths: Sequence[tuple]) -> DraftTree:
    """Paths whose every prefix comes earlier (``most_frequent``'s) as a tree, one node each."""
    index = {p: i for i, p in enumerate(paths)}
    return DraftTree([p[-1] for p in paths], [index[p[:-1]] if len(p) > 1 else -1 for p in paths])


def frequency_tree(hist: array, depth: int, max_nodes: int, min_n: int, max_n: int,
                   min_occurrences: int) -> DraftTree:
    """The module docstring's frequency tree for ``hist`` (empty where no suffix matched): continuations ``depth``
    tokens long (one cut by the history's end repeats its period, as ``lookup``'s)."""
    starts = suffix_starts(hist, min_n, max_n, min_occurrences)
    trie = count_trie(continuation(hist, s, depth) for s in starts)
    return tree_of_paths(most_frequent(trie, max_nodes))


class NgramTreeProposer(NgramProposer):
    """Prompt lookup drafting a ``frequency_tree`` (``runtime.speculative.tree``): up to ``max_nodes`` nodes, at
    most ``r.k`` deep. Its rows verify eagerly (``TorchRuntime._split``); ``chain`` is what ``NgramProposer``-like
    linear drafting would take from the same counts."""

    name = "ngram-tree"

    def __init__(self, min_n: int, max_n: int, max_nodes: int, min_occurrences: int):
        super().__init__(min_n, max_n)
        self.max_nodes, self.min_occurrences = max_nodes, min_occurrences

    def propose(self, batch):
        return [frequency_tree(self._synced(r), r.k, self.max_nodes, self.min_n, self.max_n, self.min_occurrences)
                for r in batch]
