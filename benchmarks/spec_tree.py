"""Tree prompt lookup, better single-candidate proposers and an oracle, replayed offline (issue 35).

    python benchmarks/spec_tree.py --cache benchmarks/results/spec-simulate-smollm2-cpu/greedy-float32.json
        [--out spec-tree.json] [--top 4]

``spec_simulate.py``'s study (its docstring: the greedy outputs it caches, why model steps are the speedup's proxy)
for proposers the runtime does not have, each replayed as ``spec_simulate.replay`` drives a request at batch 1: the
prefill emits the first token; then each decode step looks up drafts within the room left (``max_tokens - generated
- 1``), capped at k; a step with drafts is a verify step that emits 1 + the accepted length, one without a plain
step (1 token). Every lookup that finds drafts is verified (the runtime's ``adaptive: false``: in steps the best
policy, as ``spec_simulate``'s grid found; adaptive k only trims the tokens verified); ``quiet`` settings add the
``Speculator``'s quiet back-off (``replay``). Approaches (``--cache`` alone: no model, 20 s):

* ``ngram``: the runtime's ``NgramProposer`` (its ``lookup``), every lookup verified: ``spec_simulate``'s fixed rows.
* ``tree``: for each n-gram size from ``ngram_max`` down to ``ngram_min`` (longest match first), every earlier
  occurrence of the context's last n tokens, most recent first, offers its next k tokens; up to C distinct ones
  (one that is a prefix of a kept one adds nothing; one that extends a kept one replaces it) are merged into a token
  tree (shared prefixes once). The step accepts the longest root path the greedy continuation follows. C 1 is
  ``NgramProposer``'s draft (checked: it is the first candidate's prefix), extended where it stops at the context's
  end (an output looping with a period under k: the most recent occurrence is a period back) by an older one's.
* ``freqtree``: SuffixDecoding's tree: the continuations (k tokens) of every occurrence of the longest matching
  suffix (up to ``ngram_max`` tokens; the shorter ones' too while fewer than ``min_occ`` occurrences), counted in a
  trie; its ``budget`` most frequent nodes are verified (a node is never more frequent than its parent). The
  runtime drafts it (``runtime.speculative.tree``: ``speculative/tree.py``, whose ranking this replay imports).
* ``suffix``: single candidate, the longest matching suffix (up to ``ngram_max``); of all its occurrences'
  continuations the one seen most often (``pick frequent``: the trie walked from the root by the most frequent child,
  the most recent occurrence breaking ties) or the most recent (``pick recent``: ``NgramProposer`` with a long max).
  ``kscale`` s > 0: k = min(k, s x match length) (adaptive k from the match length).
* ``oracle``: the longest prefix (at most k) of the true continuation found anywhere in prompt + output so far: what
  any proposer drafting copies of its context could get at most (one candidate suffices, it knows the future).

Reported per setting and workload (grounded: 18 prompts, random: 6): steps (the prefill counted: plain decoding takes
the output's tokens), verify rows, the mean accepted length (of a verify row), tokens verified per verify row (the
tree's nodes + the row's last token: the verify step's width; mean and max), and the ideal speedup (plain steps /
speculative steps, summed over the prompts) with the worst prompt's, and the break-even cost of a drafted token:
the most a verify row may cost per tree token beyond its first (in plain steps; a row costing 1 + that x nodes) for
the grounded total to stay at ``--target`` (1.8x), or "-" where it is under it even at a flat cost; and
``spec_simulate``'s modelled speedup (``--verify-cost`` 1, ``--chain-cost`` 0.85: plain decoding chains its steps,
these only where the quiet back-off skips a lookup).
"""

from __future__ import annotations

import itertools
import json
import sys
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_simulate import greedy_arguments, greedy_outputs, ints, modelled  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import lookup  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import MAX_QUIET, QUIET_AFTER  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.speculative.tree import count_trie, most_frequent  # noqa: E402

STUDIED = ("grounded", "random")  # the workloads this study replays


class Context:
    """A request's prompt + greedy output, looked up at each prefix length m of the output (context = prompt +
    output[:m]); occurrences memoised by (context length, n) since every setting asks the same ones."""

    def __init__(self, prompt: list[int], output: list[int]):
        self.prompt, self.output = prompt, output
        self.tokens = list(prompt) + list(output)
        self._bytes = array("i", self.tokens).tobytes()
        self._occ: dict[tuple[int, int], list[int]] = {}

    def occurrences(self, total: int, n: int) -> list[int]:
        """Where (start of the continuation) the last n of the first ``total`` tokens occur earlier, ending before
        the last token, most recent first."""
        key = (total, n)
        if key not in self._occ:
            data, size = self._bytes[: total * 4], 4
            pattern, end, found = data[(total - n) * size :], (total - 1) * size, []
            while True:
                at = data.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % size == 0:
                    found.append(at // size + n)
                end = at + len(pattern) - 1
            self._occ[key] = found
        return self._occ[key]

    def longest_match(self, total: int, max_n: int, min_n: int = 1) -> int:
        for n in range(min(max_n, total - 1), min_n - 1, -1):
            if self.occurrences(total, n):
                return n
        return 0


def tree_candidates(ctx: Context, total: int, k: int, c: int, min_n: int, max_n: int) -> list[list[int]]:
    cands: list[list[int]] = []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        for start in ctx.occurrences(total, n):
            cont = ctx.tokens[start : min(start + k, total)]
            for i, have in enumerate(cands):
                if have[: len(cont)] == cont:
                    break  # adds nothing
                if cont[: len(have)] == have:
                    cands[i] = cont  # extends a kept one
                    break
            else:
                if len(cands) < c:
                    cands.append(cont)
    return cands


def _count_trie(ctx: Context, total: int, k: int, starts: list[int]) -> dict[tuple, list]:
    """{path: [count, rank of its most recent occurrence]} over the continuations of ``starts`` (most recent first),
    cut by the context's end (the runtime's ``frequency_tree`` repeats the period there, as ``lookup`` does)."""
    return count_trie(ctx.tokens[start : min(start + k, total)] for start in starts)


def _starts(ctx: Context, total: int, min_n: int, max_n: int, min_occ: int) -> list[int]:
    """The occurrences of the longest matching suffix, then shorter ones' while fewer than ``min_occ``."""
    starts: list[int] = []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        starts += [s for s in ctx.occurrences(total, n) if s not in starts]
        if len(starts) >= min_occ:
            break
    return starts


def freqtree_candidates(ctx: Context, total: int, k: int, budget: int, min_n: int, max_n: int,
                        min_occ: int) -> list[list[int]]:
    trie = _count_trie(ctx, total, k, _starts(ctx, total, min_n, max_n, min_occ))
    kept = most_frequent(trie, budget)  # the runtime's ``NgramTreeProposer`` ranks its nodes so
    parents = {p[:-1] for p in kept}
    return [list(p) for p in kept if p not in parents]  # the leaves: their root paths are the tree


def suffix_candidates(ctx: Context, total: int, k: int, min_n: int, max_n: int, pick: str,
                      kscale: int) -> list[list[int]]:
    n = ctx.longest_match(total, max_n, min_n)
    if not n:
        return []
    if kscale:
        k = min(k, kscale * n)
    starts = ctx.occurrences(total, n)
    if pick == "recent":
        return [ctx.tokens[starts[0] : min(starts[0] + k, total)]]
    trie = _count_trie(ctx, total, k, starts)
    children: dict[tuple, list[tuple]] = {}
    for p in trie:
        children.setdefault(p[:-1], []).append(p)
    path: tuple = ()
    while path in children:  # the most frequent child, the most recent occurrence breaking ties
        path = min(children[path], key=lambda p: (-trie[p][0], trie[p][1]))
    return [list(path)]


def oracle_candidates(ctx: Context, total: int, k: int) -> list[list[int]]:
    """The longest prefix of the true continuation (at most k) that occurs in the first ``total`` tokens."""
    future = ctx.tokens[total : total + k]
    data = ctx._bytes[: total * 4]
    best = 0
    while best < len(future):  # occurrences of a longer prefix are occurrences of the shorter: grow one at a time
        pattern = array("i", future[: best + 1]).tobytes()
        at, found = data.find(pattern), False
        while at >= 0:
            if at % 4 == 0:
                found = True
                break
            at = data.find(pattern, at + 1)
        if not found:
            break
        best += 1
    return [future[:best]] if best else []


def candidates(ctx: Context, total: int, k: int, s: dict) -> list[list[int]]:
    """The drafts ``s`` verifies with the context's first ``total`` tokens (a tree: its root paths), none empty."""
    if s["approach"] == "ngram":
        cands = [lookup(array("i", ctx.tokens[:total]), k, s["ngram_min"], s["ngram_max"])]
    elif s["approach"] == "tree":
        cands = tree_candidates(ctx, total, k, s["c"], s["ngram_min"], s["ngram_max"])
        ref = lookup(array("i", ctx.tokens[:total]), k, s["ngram_min"], s["ngram_max"])
        # (NgramProposer repeats a period cut by the context's end; the tree extends it from an older occurrence)
        assert not ref or cands[0][: len(ref)] == ref[: len(cands[0])], "C 1 is not NgramProposer's draft"
    elif s["approach"] == "freqtree":
        cands = freqtree_candidates(ctx, total, k, s["budget"], s["ngram_min"], s["ngram_max"], s["min_occ"])
    elif s["approach"] == "suffix":
        cands = suffix_candidates(ctx, total, k, s["ngram_min"], s["ngram_max"], s["pick"], s["kscale"])
    else:
        cands = oracle_candidates(ctx, total, k)
    return [c for c in cands if c]


def replay(ctx: Context, setting: dict) -> dict:
    """One request replayed under ``setting``; per verify row its tree's nodes. ``quiet``: the ``Speculator``'s quiet
    back-off (from the ``QUIET_AFTER``-th empty lookup in a row, none for 1, 2 ... ``MAX_QUIET`` steps: those plain
    steps chain on the one before, as ``spec_simulate.replay`` counts them), with every lookup that finds verified."""
    prompt, output = ctx.prompt, ctx.output
    m, steps, rows, accepted, widths = 1, 1, 0, 0, []  # step 1: the prefill's token
    quiet = idle = chained = 0
    chain_next = False
    while m < len(output):
        chained += chain_next
        room = len(output) - m - 1
        k, cands = min(setting["k"], room), []
        if idle:
            idle -= 1
        elif k > 0:
            cands = candidates(ctx, len(prompt) + m, k, setting)
            quiet = 0 if cands else quiet + 1
            if quiet >= QUIET_AFTER and setting.get("quiet"):
                idle = min(MAX_QUIET, 2 ** (quiet - QUIET_AFTER))
        steps += 1
        if cands:
            truth = output[m : m + k]
            acc = max(next((i for i, (a, b) in enumerate(zip(c, truth)) if a != b), min(len(c), len(truth)))
                      for c in cands)
            nodes = len({tuple(c[:d]) for c in cands for d in range(1, len(c) + 1)})
            rows, accepted = rows + 1, accepted + acc
            widths.append(1 + nodes)
            m += acc + 1
            chain_next = False
        else:
            m += 1
            chain_next = idle > 0  # the next step looks nothing up: the GPU may chain it on this one
    return {"steps": steps, "tokens": m, "verify_rows": rows, "chained": chained, "accepted": accepted,
            "widths": widths}


def summarise(runs: list[dict], target: float, verify_cost: float, chain_cost: float) -> dict:
    steps, plain = sum(r["steps"] for r in runs), sum(r["tokens"] for r in runs)
    rows, widths = sum(r["verify_rows"] for r in runs), [w for r in runs for w in r["widths"]]
    nodes = sum(w - 1 for w in widths)
    costs = [modelled(r, verify_cost, chain_cost) for r in runs]
    return {"break_even": (plain / target - steps) / nodes if nodes and plain / target >= steps else None,
            "steps": steps, "verify_rows": rows, "chained": sum(r["chained"] for r in runs),
            "accepted": sum(r["accepted"] for r in runs),
            "mean_accepted": sum(r["accepted"] for r in runs) / rows if rows else 0.0,
            "mean_width": sum(widths) / len(widths) if widths else 0.0, "max_width": max(widths, default=0),
            "speedup": plain / steps, "modelled_speedup": sum(c[0] for c in costs) / sum(c[1] for c in costs),
            "worst_prompt_speedup": min(r["tokens"] / r["steps"] for r in runs),
            "per_prompt_steps": [r["steps"] for r in runs]}


def grid(ks: list[int], cs: list[int], budgets: list[int]) -> list[dict]:
    ngrams = [(1, 4), (2, 4), (1, 8)]
    quiet = (False, True)
    out = [{"approach": "ngram", "k": k, "ngram_min": lo, "ngram_max": hi, "quiet": q}
           for k, (lo, hi), q in itertools.product(ks, ngrams, quiet)]
    out += [{"approach": "tree", "k": k, "c": c, "ngram_min": lo, "ngram_max": hi, "quiet": q}
            for k, c, (lo, hi), q in itertools.product(ks, cs, ngrams, quiet)]
    out += [{"approach": "freqtree", "k": k, "budget": b, "ngram_min": 1, "ngram_max": hi, "min_occ": mo, "quiet": q}
            for k, b, hi, mo, q in itertools.product(ks, budgets, (4, 8, 16), (1, 4), quiet)]
    out += [{"approach": "suffix", "k": k, "ngram_min": 1, "ngram_max": hi, "pick": p, "kscale": s}
            for k, hi, p, s in itertools.product(ks, (4, 8, 16, 64), ("recent", "frequent"), (0, 1, 2, 4))]
    out += [{"approach": "oracle", "k": k} for k in ks + [128]]
    return out


def label(s: dict) -> str:
    return _label(s) + (" quiet" if s.get("quiet") else "")


def _label(s: dict) -> str:
    if s["approach"] == "ngram":
        return f"ngram k={s['k']} n={s['ngram_min']}..{s['ngram_max']}"
    if s["approach"] == "tree":
        return f"tree C={s['c']} k={s['k']} n={s['ngram_min']}..{s['ngram_max']}"
    if s["approach"] == "freqtree":
        return f"freqtree B={s['budget']} k={s['k']} n={s['ngram_min']}..{s['ngram_max']} occ>={s['min_occ']}"
    if s["approach"] == "suffix":
        return f"suffix {s['pick']} k={s['k']} n<={s['ngram_max']} kscale={s['kscale']}"
    return f"oracle k={s['k']}"


def table(results: list[dict], top: int) -> list[str]:
    head = (f"{'setting':<42} | {'grounded: steps':>15} {'rows':>4} {'acc/row':>7} {'width':>6} {'max':>4} "
            f"{'ideal':>6} {'worst':>6} {'b-even':>6} {'model':>6} | {'random: steps':>13} {'ideal':>6} {'width':>6}")
    lines = [head, "-" * len(head)]
    for r in results[:top] if top else results:
        g, x = r["grounded"], r["random"]
        lines.append(f"{label(r['setting']):<42} | {g['steps']:>15} {g['verify_rows']:>4} {g['mean_accepted']:>7.2f} "
                     f"{g['mean_width']:>6.1f} {g['max_width']:>4} {g['speedup']:>5.2f}x "
                     f"{g['worst_prompt_speedup']:>5.2f}x {_pct(g['break_even']):>6} "
                     f"{g['modelled_speedup']:>5.2f}x | {x['steps']:>13} {x['speedup']:>5.2f}x "
                     f"{x['mean_width']:>6.1f}")
    return lines


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return [_rounded(v) for v in value] if isinstance(value, list) else value


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def main(argv=None) -> None:
    parser = greedy_arguments(__doc__, "spec-tree.json")
    parser.add_argument("--ks", type=ints, default=[8, 16, 32])
    parser.add_argument("--cs", type=ints, default=[1, 2, 4, 8])
    parser.add_argument("--budgets", type=ints, default=[8, 16, 32, 64])
    parser.add_argument("--verify-cost", type=float, default=1.0, help="spec_simulate's (a verify row, plain steps)")
    parser.add_argument("--chain-cost", type=float, default=0.85, help="spec_simulate's (a chained plain step)")
    parser.add_argument("--target", type=float, default=1.8, help="the break-even's grounded speedup")
    parser.add_argument("--top", type=int, default=4, help="settings printed per approach (by grounded steps)")
    args = parser.parse_args(argv)

    workloads = greedy_outputs(args.config, args.engines_dir, args.cache, args.output_tokens, args.random_prompts,
                               args.compute_dtype, ignore_eos=args.ignore_eos)
    # the study's two workloads (the caches also hold spec_simulate's open one, whose poem loops so that the tree's
    # first path, extended from an older occurrence, leaves NgramProposer's repeated period: candidates() asserts not)
    contexts = {w: [Context(it["prompt"], it["output"]) for it in workloads[w]] for w in STUDIED}
    results = []
    for setting in grid(args.ks, args.cs, args.budgets):
        row = {"setting": setting}
        for workload, ctxs in contexts.items():
            runs = [replay(c, setting) for c in ctxs]
            row[workload] = summarise(runs, args.target, args.verify_cost, args.chain_cost)
        results.append(row)
    for by in ("steps", "modelled_speedup"):  # the ideal's ranking, then the model's
        print(f"Per approach, its top {args.top} by grounded {by}:")
        for approach in ("ngram", "tree", "freqtree", "suffix", "oracle"):
            ranked = sorted((r for r in results if r["setting"]["approach"] == approach),
                            key=lambda r: ((1 if by == "steps" else -1) * r["grounded"][by],
                                           r["grounded"]["mean_width"]))
            print("\n".join(table(ranked, args.top)) + "\n")
    head = json.dumps({"cache": str(args.cache), "output_tokens": args.output_tokens, "target": args.target,
                       "verify_cost": args.verify_cost, "chain_cost": args.chain_cost})
    rows = ",\n".join(json.dumps(_rounded(r)) for r in results)  # a setting a line
    args.out.write_text(f'{head[:-1]}, "results": [\n{rows}\n]}}\n')
    print(f"({len(results)} settings; grounded: {len(contexts['grounded'])} prompts, random: "
          f"{len(contexts['random'])}; every lookup that finds verified) results: {args.out}")


if __name__ == "__main__":
    main()
