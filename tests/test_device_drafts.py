"""DeviceDrafts: prompt lookup and greedy acceptance on the device agree with the host's rules (proposer.lookup,
acceptance.accept_greedy), chained steps decode exactly as plain greedy decoding, and nothing reads values on the
host (the calls run on the meta device, which has none) or reallocates the state."""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from trtllm_pipeline.runtimes.torch_engine.speculative.acceptance import accept_greedy
from trtllm_pipeline.runtimes.torch_engine.speculative.device_drafts import DeviceDrafts
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import lookup

STATE = ("history", "length", "next_token", "next_position", "next_drafts", "found")


def host_lookup(hist, k, min_n, max_n):
    return lookup(array("i", hist), k, min_n, max_n)


def random_history(rng: random.Random, vocab: int) -> list[int]:
    kind = rng.randrange(5)
    if kind == 0:  # short
        return [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
    if kind == 1:  # a loop, cut anywhere
        period = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
        return (period * 20)[: rng.randint(2, 20)]
    if kind == 2:  # nothing repeats
        return rng.sample(range(1000, 1100), rng.randint(1, 30))
    hist = [rng.randrange(vocab) for _ in range(rng.randint(4, 20))]
    for _ in range(rng.randint(1, 3)):  # copies of earlier spans
        at = rng.randrange(len(hist))
        hist += hist[at : at + rng.randint(1, 6)] + [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
    return hist


def tensors(*rows):
    return [torch.tensor(r, dtype=torch.int64) for r in rows]


def read(d: DeviceDrafts, row: int) -> list[int]:
    return d.history[row, : int(d.length[row])].tolist()


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("min_n,max_n", [(1, 1), (2, 4), (1, 3)])
def test_a_decode_step_drafts_as_the_host_lookup(k, min_n, max_n):
    rng = random.Random(k * 100 + min_n * 10 + max_n)
    histories = [random_history(rng, vocab=6) for _ in range(40)] + [[5, 6, 7, 5, 6, 7, 5, 6], [3], [3, 3], [1, 2]]
    max_len = max(map(len, histories)) + 1
    d = DeviceDrafts(len(histories), max_len, k, min_n, max_n, "cpu")
    for row, hist in enumerate(histories):
        d.load(row, hist)
        want = host_lookup(hist, k, min_n, max_n)
        assert int(d.found[row]) == bool(want) and d.next_token[row] == hist[-1]
        assert d.next_drafts[row].tolist() == (want or [hist[-1]] * k)
    # one decode span per row (its last token, no drafts), in a shuffled order, token rows after a padding row
    order = list(range(len(histories)))
    rng.shuffle(order)
    feed = [0] + [histories[r][-1] for r in order]
    positions = [0] + [len(histories[r]) - 1 for r in order]
    greedy = [0] + [rng.randrange(6) for _ in order]
    spans = [[0, 0, d.sink]] + [[1 + b, 1, r] for b, r in enumerate(order)] + [[0, 0, d.sink]]
    tokens, positions_t, greedy_t, spans_t = tensors(feed, positions, greedy, spans)
    out = torch.zeros(len(spans), d.out_width, dtype=torch.int64)
    d.after_step(tokens, positions_t, greedy_t, spans_t, out)
    for b, r in enumerate(order):
        hist = histories[r] + [greedy[1 + b]]
        want = host_lookup(hist, k, min_n, max_n)
        assert read(d, r) == hist
        assert int(d.next_token[r]) == greedy[1 + b] and int(d.next_position[r]) == len(hist) - 1
        assert int(d.found[r]) == bool(want)
        assert d.next_drafts[r].tolist() == (want or [greedy[1 + b]] * k)
        assert DeviceDrafts.parse(out[1 + b].tolist(), k) == ([greedy[1 + b]], bool(want), want or [greedy[1 + b]] * k)
    assert out[0, 0] == 0 and out[-1, 0] == 0


def test_verify_spans_accept_as_accept_greedy_and_padding_touches_no_row():
    k = 4
    d = DeviceDrafts(4, 40, k, 2, 4, "cpu")
    prompts = [[1, 2, 3, 4, 1, 2], [9, 8, 7, 9, 8], [4, 4, 4], [6]]
    for row, p in enumerate(prompts):
        d.load(row, p)
    untouched = {name: getattr(d, name)[3].clone() for name in STATE}
    # rows 0 .. 2 verify drafts that the target keeps: none, some, all (and 2 drafts of 4 for row 1)
    rows = [  # (table row, drafts, target's argmax at each token row)
        (0, [3, 4, 1, 2], [5, 0, 0, 0, 0]),
        (1, [7, 9], [7, 9, 8]),
        (2, [4, 4, 4, 4], [4, 4, 4, 4, 2]),
    ]
    feed, positions, greedy, spans = [0, 0], [0, 0], [0, 0], [[0, 0, d.sink]]  # two padding token rows first
    for r, drafts, argmax in rows:
        spans.append([len(feed), 1 + len(drafts), r])
        feed += [prompts[r][-1], *drafts]
        positions += [len(prompts[r]) - 1 + j for j in range(1 + len(drafts))]
        greedy += argmax
    spans.append([0, 0, d.sink])
    tokens, positions_t, greedy_t, spans_t = tensors(feed, positions, greedy, spans)
    out = torch.full((len(spans), d.out_width), 99, dtype=torch.int64)
    ptrs = {name: getattr(d, name).data_ptr() for name in STATE}
    d.after_step(tokens, positions_t, greedy_t, spans_t, out)
    assert {name: getattr(d, name).data_ptr() for name in STATE} == ptrs
    for b, (r, drafts, argmax) in enumerate(rows, start=1):
        emitted = accept_greedy(argmax, drafts)
        hist = prompts[r] + emitted
        got, found, next_drafts = DeviceDrafts.parse(out[b].tolist(), k)
        assert got == emitted
        assert out[b, 1 + len(emitted) : k + 2].tolist() == [-1] * (k + 1 - len(emitted))
        assert read(d, r) == hist and int(d.length[r]) == len(prompts[r]) + len(emitted)
        assert int(d.next_position[r]) == len(prompts[r]) - 1 + len(emitted)
        assert int(d.next_token[r]) == emitted[-1]
        want = host_lookup(hist, k, 2, 4)
        assert (found, next_drafts) == (bool(want), want or [emitted[-1]] * k)
    assert [len(DeviceDrafts.parse(out[b].tolist(), k)[0]) for b in range(1, 4)] == [1, 3, 5]
    assert out[0].tolist() == out[-1].tolist() == [0] + [-1] * (k + 1) + [0] + [-1] * k
    for name in STATE:
        assert torch.equal(getattr(d, name)[3], untouched[name]), name


def test_a_full_history_drops_what_does_not_fit():
    d = DeviceDrafts(1, 5, 4, 1, 2, "cpu")
    d.load(0, [1, 2, 3, 1])
    tokens, positions, greedy, spans = tensors([1, 2, 3, 1, 2], [3, 4, 5, 6, 7], [2, 3, 1, 2, 9], [[0, 5, 0]])
    out = torch.zeros(1, d.out_width, dtype=torch.int64)
    d.after_step(tokens, positions, greedy, spans, out)
    assert DeviceDrafts.parse(out[0].tolist(), 4)[0] == [2, 3, 1, 2, 9]
    assert read(d, 0) == [1, 2, 3, 1, 2] and int(d.next_position[0]) == 8 and int(d.next_token[0]) == 9


def test_load_refuses_what_does_not_fit():
    d = DeviceDrafts(2, 4, 2, 1, 2, "cpu")
    with pytest.raises(ValueError):
        d.load(0, [])
    with pytest.raises(ValueError):
        d.load(0, [1, 2, 3, 4, 5])
    with pytest.raises(ValueError):
        d.load(2, [1])  # the sink


def test_fill_inputs_takes_next_tokens_and_drafts_or_keeps_the_row():
    k = 3
    d = DeviceDrafts(3, 16, k, 1, 2, "cpu")
    d.load(0, [1, 2, 3, 1, 2])  # drafts 3 1 2
    d.load(2, [7, 8])  # none: 8 8 8
    assert d.next_drafts[0].tolist() == [3, 1, 2] and d.next_drafts[2].tolist() == [8, 8, 8]
    tokens, positions = tensors([50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65])
    sources = torch.tensor([0 * 4 + 0, -1, 0 * 4 + 2, 2 * 4 + 0, 2 * 4 + 1, -1])
    ptrs = tokens.data_ptr(), positions.data_ptr()
    d.fill_inputs(tokens, positions, sources)
    assert (tokens.data_ptr(), positions.data_ptr()) == ptrs
    assert tokens.tolist() == [2, 51, 1, 8, 8, 55]
    assert positions.tolist() == [4, 61, 6, 1, 2, 65]


def target(tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A deterministic 'model': its argmax after a token at a position. Mostly a table (so text loops and lookups
    hit), off it every 11th position (so drafts are sometimes wrong)."""
    return torch.where(positions % 11 == 0, (tokens * 7 + positions) % table.shape[0], table[tokens])


@pytest.mark.parametrize("k", [1, 4])
def test_chained_steps_decode_as_plain_greedy_decoding(k):
    rng = random.Random(k)
    vocab, steps = 12, 50
    table = torch.tensor([rng.randrange(vocab) for _ in range(vocab)])
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 8))] for _ in range(3)]
    d = DeviceDrafts(4, 8 + steps * (k + 1), k, 1, 3, "cpu")
    order = [2, 0, 3]  # table rows of the three requests; row 1 stays empty
    for r, p in zip(order, prompts):
        d.load(r, p)
    ptrs = {name: getattr(d, name).data_ptr() for name in STATE}
    # every step: a padding token row, then each request's next token and k drafts, made on the device
    width = k + 1
    sources = torch.tensor([-1] + [r * width + j for r in order for j in range(width)])
    spans = torch.tensor([[1 + b * width, width, r] for b, r in enumerate(order)] + [[0, 0, d.sink]])
    tokens = torch.zeros(len(sources), dtype=torch.int64)
    positions = torch.zeros_like(tokens)
    out = torch.zeros(len(spans), d.out_width, dtype=torch.int64)
    outs = []
    for _ in range(steps):  # nothing read on the host between steps: the outs are read at the end
        d.fill_inputs(tokens, positions, sources)
        d.after_step(tokens, positions, target(tokens, positions, table), spans, out)
        outs.append(out.clone())
    assert {name: getattr(d, name).data_ptr() for name in STATE} == ptrs
    for b, (r, p) in enumerate(zip(order, prompts)):
        emitted = [t for o in outs for t in DeviceDrafts.parse(o[b].tolist(), k)[0]]
        plain, token, position = [], p[-1], len(p) - 1
        while len(plain) < len(emitted):
            token = int(target(torch.tensor([token]), torch.tensor([position]), table)[0])
            plain.append(token)
            position += 1
        assert emitted == plain
        assert read(d, r) == p + emitted
        if k > 1:
            assert len(emitted) > steps * 1.5  # the loops were drafted, and kept
    assert int(d.length[1]) == 0


def test_the_calls_read_no_value_on_the_host():
    # The meta device has shapes and no values: an .item(), a bool(tensor), a mask index or nonzero would raise.
    k, rows, tokens_n, spans_n = 4, 3, 11, 4
    d = DeviceDrafts(rows, 32, k, 2, 4, "meta")

    def meta(*shape):
        return torch.zeros(*shape, dtype=torch.int64, device="meta")

    out = meta(spans_n, d.out_width)
    d.after_step(meta(tokens_n), meta(tokens_n), meta(tokens_n), meta(spans_n, 3), out)
    tokens, positions = meta(tokens_n), meta(tokens_n)
    d.fill_inputs(tokens, positions, meta(tokens_n))
    assert out.shape == (spans_n, 2 * k + 3) and tokens.shape == (tokens_n,)
    assert all(getattr(d, name).dtype == torch.int64 for name in STATE)
    assert d.history.shape == (rows + 1, 33) and d.next_drafts.shape == (rows + 1, k)


@pytest.mark.parametrize("k,min_n,max_n", [(1, 1, 1), (4, 2, 4), (8, 1, 3)])
def test_random_verify_steps_agree_with_the_host(k, min_n, max_n):
    rng = random.Random(7 * k + max_n)
    rows, vocab = 6, 5
    histories = [random_history(rng, vocab) for _ in range(rows)]
    d = DeviceDrafts(rows, 40 + 12 * (k + 1), k, min_n, max_n, "cpu")
    for r, hist in enumerate(histories):
        d.load(r, hist)
    found_any = set()
    for _ in range(12):
        chosen = rng.sample(range(rows), rng.randint(1, rows))
        feed, positions, greedy, spans, expect = [], [], [], [], []
        for r in chosen:
            hist = histories[r]
            drafts = host_lookup(hist, k, min_n, max_n)[: rng.randint(0, k)]
            argmax = [rng.randrange(vocab) for _ in range(len(drafts) + 1)]
            agree = rng.randint(0, len(drafts))
            argmax[:agree] = drafts[:agree]  # the target keeps some of them
            if rng.random() < 0.3:
                spans.append([0, 0, d.sink])
            spans.append([len(feed), 1 + len(drafts), r])
            feed += [hist[-1], *drafts]
            positions += [len(hist) - 1 + j for j in range(1 + len(drafts))]
            greedy += argmax
            expect.append((len(spans) - 1, r, accept_greedy(argmax, drafts)))
        tokens, positions_t, greedy_t, spans_t = tensors(feed, positions, greedy, spans)
        out = torch.zeros(len(spans), d.out_width, dtype=torch.int64)
        d.after_step(tokens, positions_t, greedy_t, spans_t, out)
        for b, r, emitted in expect:
            histories[r] = hist = histories[r] + emitted
            want = host_lookup(hist, k, min_n, max_n)
            found_any.add(bool(want))
            assert DeviceDrafts.parse(out[b].tolist(), k) == (emitted, bool(want), want or [emitted[-1]] * k)
            assert read(d, r) == hist and int(d.next_position[r]) == len(hist) - 1
    for r, hist in enumerate(histories):
        assert read(d, r) == hist
    assert found_any == {True, False} or (min_n, max_n) == (1, 1)
