"""Device drafting's one-step lag, replayed on cached greedy outputs (issue 35): what it costs, and two fixes modelled.

    python benchmarks/spec_device_replay.py [--cache benchmarks/results/spec-simulate-smollm2-cpu/greedy-bfloat16.json]
        [--prompts N] [--k 8] [--verify-cost 1.15]

With prompt lookup on the device (``cuda.drafted``) a greedy request's steps chain: step s is planned and launched
before step s - 1's result reaches the host, so ``Speculator`` hears of each verify row one step late, and a row
planned on pending tokens takes ``budget``'s width while the device fills it with whatever the lookup after step
s - 1 found: when it found nothing, the request's last token repeated (the filler), which ``_settle_tracked`` then
reports as a row of rejected drafts (a miss: k halved). On the H100 (2026-12-06e, the first 6 grounded prompts, SmolLM2
FP8) device drafting needed 408 steps where host drafting needed 359 (366 drafts kept against 413).

This replays, at batch 1 with every step chained, the same outputs under: ``host`` (``spec_simulate.replay``: the
speculator told at once, nothing drafted where nothing is found); ``device`` (today's lag: the row's width from the
speculator as of two steps back, filler where the lookup found nothing, the filler's rejection told as a miss);
``+filler`` (a filler row not told as a miss); ``+width`` (after a partial row the width goes back to k, not to
kept + 1: a row costs the same at any width up to ~9 tokens on the fast path); and both. Steps, verify rows, kept
drafts and a cost in plain steps (a verify row ``--verify-cost``, every other step 1: they all chain; host drafting's
verify rows do not, so its cost is a floor) per workload.
Counts, not timings: the GPU's run is what decides (``benchmarks/spec_decode.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import DraftRequest, NgramProposer
from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_simulate import replay  # noqa: E402  (a sibling script)

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "benchmarks" / "results" / "spec-simulate-smollm2-cpu" / "greedy-bfloat16.json"


class _WidthBackToK(Speculator):
    """After a partial row the width goes back to k (where today's rule sets kept + 1)."""

    def verified(self, request_id, drafted, accepted, depth=None):
        super().verified(request_id, drafted, accepted, depth)
        t = self._tracks.get(request_id)
        if t is not None and self.adaptive and 0 < accepted < drafted:
            t.k = self.k


def device_replay(prompt: list[int], output: list[int], *, k: int, min_n: int, max_n: int, filler_is_miss: bool,
                  width_back_to_k: bool) -> dict:
    """One request's ``output`` under device drafting's lag (see the module's docstring)."""
    sp = (_WidthBackToK if width_back_to_k else Speculator)(NgramProposer(min_n, max_n), k)
    lookups = NgramProposer(min_n, max_n)  # the device's: on the history as the last step left it
    rid, generated, steps, wide = "r", list(output[:1]), 1, 0
    untold = None  # the last step's (drafts, whether they were found, whether the next lookup found, kept)

    def lookup(history):
        return [int(t) for t in lookups.propose([DraftRequest(rid, prompt, history, k)])[0][:k]]

    while len(generated) < len(output):
        room = len(output) - len(generated) - 1
        width = min(room, sp.budget(rid)) if room > 0 else 0  # planned before the last step was told
        found = lookup(generated)
        drafts = (found[:width] if found else [generated[-1]] * width) if width else []
        at = len(generated)
        kept = next((i for i, d in enumerate(drafts) if d != output[at + i]), len(drafts))
        generated += output[at : at + kept + 1]
        steps += 1
        wide += bool(drafts)  # a verify row's cost, filler or not (the speculator hears only of real drafts' rows)
        if untold is not None:  # the step before is settled now, behind this one
            n, real, next_found, n_kept = untold
            if n and (real or filler_is_miss):
                sp.verified(rid, n, n_kept)
            if not next_found:
                sp.found_nothing(rid)
        untold = (len(drafts), bool(found), bool(lookup(generated)), kept)
    return {"steps": steps, "verify_rows": wide, "drafted": sp.draft_tokens, "accepted": sp.accepted_tokens}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE, help="greedy outputs (benchmarks/spec_simulate.py's)")
    parser.add_argument("--prompts", type=int, default=0, help="the first N prompts of each workload (0: all)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--ngram-min", type=int, default=1)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--verify-cost", type=float, default=1.15,
                        help="a verify row in plain steps (SmolLM2 FP8 on the H100: 1.13-1.15 for k 1-8)")
    args = parser.parse_args(argv)
    if not args.cache.is_file():
        raise SystemExit(f"{args.cache} is missing: make it with benchmarks/spec_simulate.py --cache {args.cache}")
    workloads = json.loads(args.cache.read_text())["workloads"]
    modes = {"device": (True, False), "+filler": (False, False), "+width": (True, True), "+both": (False, True)}
    print(f"{'workload':9s} {'mode':8s} {'steps':>6s} {'verify':>6s} {'drafted':>7s} {'kept':>5s} {'cost':>7s}")
    for workload, items in workloads.items():
        items = items[: args.prompts] if args.prompts else items
        for mode in ("host", *modes):
            runs = []
            for it in items:
                if mode == "host":
                    runs.append(replay(it["prompt"], it["output"], k=args.k, ngram_min=args.ngram_min,
                                       ngram_max=args.ngram_max))
                else:
                    miss, width = modes[mode]
                    runs.append(device_replay(it["prompt"], it["output"], k=args.k, min_n=args.ngram_min,
                                              max_n=args.ngram_max, filler_is_miss=miss, width_back_to_k=width))
            steps, verify = sum(r["steps"] for r in runs), sum(r["verify_rows"] for r in runs)
            drafted, kept = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs)
            cost = steps + verify * (args.verify_cost - 1)
            print(f"{workload:9s} {mode:8s} {steps:6d} {verify:6d} {drafted:7d} {kept:5d} {cost:7.1f}")


if __name__ == "__main__":
    main()
