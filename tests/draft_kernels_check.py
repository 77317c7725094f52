"""Run by tests/test_draft_kernels.py in a subprocess: cuda/draft_kernels.py's after_step and fill_inputs through
Triton's interpreter on the CPU, against DeviceDrafts' torch methods (the reference) on a copy of the same state, in
seeded random cases. Every state tensor, ``out``, tokens and positions must be equal. Prints one JSON line.

    python tests/draft_kernels_check.py [CASES_PER_CONFIG] [--cuda]

``--cuda``: the kernels compiled and run on the GPU (the reference stays on the CPU): the device run's check.
"""

from __future__ import annotations

import json
import random
import sys

CUDA = "--cuda" in sys.argv
if not CUDA:
    import triton_interpreter  # noqa: F401  (before any kernel module is imported)

import torch  # noqa: E402

from trtllm_pipeline.runtimes.torch_engine.cuda import draft_kernels  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.speculative.device_drafts import DeviceDrafts  # noqa: E402

STATE = ("history", "length", "next_token", "next_position", "next_drafts", "found")
BLOCK = 32  # small chunks: several scan iterations per row at max_len 64..96, quick in the interpreter
DEVICE = "cuda" if CUDA else "cpu"  # the kernels'
CONFIGS = [(k, min_n, max_n) for k in (1, 3, 4, 8) for min_n, max_n in ((1, 1), (2, 4), (1, 3))]


def random_history(rng: random.Random, max_len: int, vocab: int) -> list[int]:
    kind = rng.randrange(6)
    if kind == 0:  # short
        return [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
    if kind == 1:  # a loop, cut anywhere
        period = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
        return (period * max_len)[: rng.randint(2, max_len - 2)]
    if kind == 2:  # nothing repeats
        return rng.sample(range(1000, 1000 + max_len), rng.randint(1, max_len // 2))
    if kind == 3:  # full or nearly
        period = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        return (period * max_len)[: max_len - rng.randint(0, 3)]
    hist = [rng.randrange(vocab) for _ in range(rng.randint(4, 20))]
    for _ in range(rng.randint(1, 4)):  # copies of earlier spans
        at = rng.randrange(len(hist))
        hist += hist[at : at + rng.randint(1, 6)] + [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
    return hist[:max_len]


def pair(rng: random.Random, rows: int, max_len: int, k: int, min_n: int, max_n: int, vocab: int):
    ref = DeviceDrafts(rows, max_len, k, min_n, max_n, "cpu")
    for row in range(rows):
        ref.load(row, random_history(rng, max_len, vocab))
    kern = DeviceDrafts(rows, max_len, k, min_n, max_n, DEVICE)
    for name in STATE:
        getattr(kern, name).copy_(getattr(ref, name))
    return ref, kern


def state_mismatch(ref: DeviceDrafts, kern: DeviceDrafts, sink_too: bool) -> list[str]:
    """The state tensors that differ. The sink column of history is never compared (a write sink: the torch version
    aims dropped writes there, the kernel drops them); the sink row only when one program at most wrote it (several
    padding spans race on it, in both versions)."""
    rows = ref.rows + (1 if sink_too else 0)
    bad = []
    for name in STATE:
        a, b = getattr(ref, name)[:rows], getattr(kern, name)[:rows].cpu()
        if name == "history":
            a, b = a[:, : ref.max_len], b[:, : ref.max_len]
        if not torch.equal(a, b):
            bad.append(name)
    return bad


def step_case(rng: random.Random, ref: DeviceDrafts, kern: DeviceDrafts, vocab: int) -> tuple[list[str], dict]:
    """One after_step call on both: a few verify/decode spans of distinct rows, padding spans among them."""
    k, rows = ref.k, ref.rows
    chosen = rng.sample(range(rows), rng.randint(1, rows))
    spans, tokens, greedy, positions = [], [], [], []
    for r in chosen:
        n = rng.randint(1, k + 1)
        first = len(tokens)
        if rng.random() < 0.7:  # the state's own next inputs, as fill_inputs makes them
            row_tokens = [int(ref.next_token[r])] + [int(t) for t in ref.next_drafts[r, : n - 1]]
        else:
            row_tokens = [rng.randrange(vocab) for _ in range(n)]
        agree = rng.choice([0, n - 1, rng.randint(0, n - 1)])  # none, all, some of the drafts accepted
        row_greedy = [row_tokens[j + 1] if j < agree else (row_tokens[j + 1] + 1 if j + 1 < n else rng.randrange(
            vocab)) for j in range(n)]
        if rng.random() < 0.2:  # the target's choices at random
            row_greedy = [rng.randrange(vocab) for _ in range(n)]
        tokens += row_tokens
        greedy += row_greedy
        position = int(ref.next_position[r])
        positions += [position + j for j in range(n)]
        spans.append((first, n, r))
    pads = rng.choice([0, 0, 1, 1, 2, 3])
    for _ in range(pads):  # padding: any first (in range or not), any r
        spans.insert(rng.randint(0, len(spans)), (rng.randint(-2, len(tokens) + 3), 0, rng.randrange(rows)))
    extra = rng.randint(0, 3)  # padding token rows past the spans
    tokens += [rng.randrange(vocab) for _ in range(extra)]
    greedy += [rng.randrange(vocab) for _ in range(extra)]
    positions += [rng.randrange(100) for _ in range(extra)]
    batch = max(len(tokens), len(spans)) + rng.randint(0, 2)
    inputs = torch.full((4, batch), -7, dtype=torch.int64)  # rows: tokens, positions, ... as the caller's inputs
    inputs[0, : len(tokens)] = torch.tensor(tokens)
    inputs[1, : len(positions)] = torch.tensor(positions)
    step = torch.full((4, batch), -7, dtype=torch.int64)  # the spans, as inputs[:3, :S].t(): strides (1, batch)
    step[:3, : len(spans)] = torch.tensor(spans).t()
    span_view = step[:3, : len(spans)].t()
    assert not span_view.is_contiguous() or len(spans) == 1
    tok, pos = inputs[0, : len(tokens)], inputs[1, : len(tokens)]
    greedy_t = torch.tensor(greedy, dtype=torch.int64)
    out_ref = torch.full((len(spans), ref.out_width), -5, dtype=torch.int64)
    out_kern = out_ref.to(DEVICE)
    before = ref.length.clone()
    ref.after_step(tok, pos, greedy_t, span_view, out_ref)
    inputs_d, step_d = inputs.to(DEVICE), step.to(DEVICE)  # (the kernel's: the same layout on its device)
    draft_kernels.after_step(kern, inputs_d[0, : len(tokens)], inputs_d[1, : len(tokens)], greedy_t.to(DEVICE),
                             step_d[:3, : len(spans)].t(), out_kern, block=BLOCK)
    bad = state_mismatch(ref, kern, sink_too=pads <= 1)
    if not torch.equal(out_ref, out_kern.cpu()):
        bad.append("out")
    real = [i for i, (_, n, _) in enumerate(spans) if n > 0]
    found = [int(out_ref[i, k + 2]) for i in real]
    seen = {"found": sum(found), "not_found": len(found) - sum(found),
            "all_accepted": sum(int(out_ref[i, 0]) == spans[i][1] > 1 for i in real),
            "some_rejected": sum(int(out_ref[i, 0]) < spans[i][1] for i in real),
            "overflowed": sum(int(before[spans[i][2]]) + int(out_ref[i, 0]) > ref.max_len for i in real),
            "padding": len(spans) - len(real)}
    return bad, {"spans": spans, "tokens": tokens, "greedy": greedy, "k": k, "min_n": ref.min_n,
                 "max_n": ref.max_n, "pads": pads}, seen


def fill_case(rng: random.Random, ref: DeviceDrafts, kern: DeviceDrafts) -> list[str]:
    width = ref.k + 1
    rows = rng.randint(1, 40)
    sources = torch.tensor([rng.randrange(ref.rows * width) if rng.random() < 0.7 else -1 for _ in range(rows)])
    inputs = torch.randint(0, 1000, (4, rows + 2))
    tok_ref, pos_ref = inputs[0, :rows].clone(), inputs[1, :rows].clone()
    both = inputs.to(DEVICE)
    ref.fill_inputs(tok_ref, pos_ref, sources)
    draft_kernels.fill_inputs(kern, both[0, :rows], both[1, :rows], sources.to(DEVICE), block=16)
    both = both.cpu()
    bad = state_mismatch(ref, kern, sink_too=True)
    if not (torch.equal(tok_ref, both[0, :rows]) and torch.equal(pos_ref, both[1, :rows])):
        bad.append("fill")
    if not torch.equal(both[:, rows:], inputs[:, rows:]) or not torch.equal(both[2:], inputs[2:]):
        bad.append("fill wrote outside its rows")
    return bad


def main() -> None:
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    steps = int(numbers[0]) if numbers else 20
    rng = random.Random(20261205)
    torch.manual_seed(0)
    cases, mismatches, coverage = 0, [], {}
    for k, min_n, max_n in CONFIGS:
        vocab = rng.choice([3, 8, 50])  # small vocabularies: many repeats
        ref, kern = pair(rng, rng.randint(2, 4), rng.choice([64, 96]), k, min_n, max_n, vocab)
        for s in range(steps):
            bad, case, seen = step_case(rng, ref, kern, vocab)
            cases += 1
            for key, value in seen.items():
                coverage[key] = coverage.get(key, 0) + value
            if bad:
                mismatches.append({"after_step": bad, **case})
                for name in STATE:  # go on from the reference's state
                    getattr(kern, name).copy_(getattr(ref, name))
            elif case["pads"] > 1:  # the sink row, raced by the padding spans (not compared): the reference's again,
                for name in STATE:  # so that a later call does not count the race (on a GPU programs run at once)
                    getattr(kern, name)[ref.rows :].copy_(getattr(ref, name)[ref.rows :])
            if s % 4 == 3:
                bad = fill_case(rng, ref, kern)
                cases += 1
                if bad:
                    mismatches.append({"fill_inputs": bad, "k": k})
            if s % 10 == 9:  # new histories now and then (full ones among them)
                for row in rng.sample(range(ref.rows), rng.randint(1, ref.rows)):
                    ref.load(row, random_history(rng, ref.max_len, vocab))
                for name in STATE:
                    getattr(kern, name).copy_(getattr(ref, name))
    print(json.dumps({"cases": cases, "mismatches": mismatches[:10], "mismatch_count": len(mismatches),
                      "coverage": coverage}))


if __name__ == "__main__":
    main()
