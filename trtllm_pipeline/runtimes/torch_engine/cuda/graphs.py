"""CUDA graphs of the decode step, one per batch bucket, replayed with the step's inputs copied in.

A decode step is ~230 small kernels; launched one by one from Python the host cannot keep up with the
GPU (17-29 ms/token at the 7B shape, against ~2 ms of GPU work). Captured once per batch size in a
CUDA graph, a step is one launch. Batches are padded up to the next bucket (powers of two up to
``max_batch_size``): padding rows decode a dummy token at position 0 of the null block (``kv_cache``), which
no request owns, so they cost a little bandwidth and change nothing. The block tables stay on the device
between steps (``DecodeGraphs``): a step's inputs are each row's token, position and table row. Without CUDA (the Triton interpreter in the
CPU tests) the same class runs the kernels directly, so the padding logic is tested everywhere.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from typing import Sequence

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import attention, decode_step
from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep, StepBuffers
from trtllm_pipeline.runtimes.torch_engine.plan import row_depths

log = logging.getLogger(__name__)

# The longest tree verify row the fast step takes (its first token and its nodes): each token row finds its
# ancestors' keys through the shifts of the ``attention.TREE_WINDOW`` positions before its own, its row's tokens but
# the first (every node's ancestor, in place); longer tree rows verify eagerly (``TorchRuntime._split``). 65: a tree
# of the config's most nodes (64).
TREE_TOKENS = attention.TREE_WINDOW.value + 1
# a step's pinned inputs, by row: tokens, positions, table rows, bans; a chained step's sources; a tree step's
# virtual positions and slot shifts (``tree_inputs``)
SOURCES_ROW, TREE_ROW = 4, 5
STAGING_ROWS = TREE_ROW + 1 + attention.TREE_WORDS


# The most rows one fast step takes: its kernels hold all of a step's rows in one tile, and 512 rows of the GLU's
# two accumulators and operand stages need 240 KiB of shared memory where Hopper has 227 (seen on the H200: a
# speculative verify bucket of 32 x 9 rows). More rows than this run eagerly.
MAX_FAST_ROWS = 256
# ... unless every linear of a step that large runs on cuBLAS (BF16 / FP8 on one GPU from
# ``decode_step.LIBRARY_MIN_BATCH`` rows), tiled over the rows, with the per-row attention and norm kernels around it:
# then this many (a loaded engine's batch; its KV pool, not the kernels, bounds it).
MAX_LIBRARY_ROWS = 1024


def row_limit(engine, world_size: int) -> int:
    """The most rows a fast step of ``engine`` takes: ``MAX_LIBRARY_ROWS`` where its large steps' linears are all
    cuBLAS's (BF16 or FP8 weights, one rank), else ``MAX_FAST_ROWS``."""
    library = world_size == 1 and getattr(engine, "format", None) in ("none", "fp8")
    return MAX_LIBRARY_ROWS if library and decode_step.LIBRARY_MIN_BATCH <= MAX_FAST_ROWS else MAX_FAST_ROWS


def batch_buckets(max_batch_size: int, sizes: Sequence[int] | None = None, limit: int = MAX_FAST_ROWS) -> list[int]:
    """The batch sizes to capture: ``sizes`` if given, else powers of two, always up to the maximum (at most
    ``limit``: ``row_limit``)."""
    top = min(max_batch_size, limit)
    if sizes:
        chosen = {int(s) for s in sizes if 1 <= int(s) <= top}
    else:
        chosen = {1 << i for i in range(top.bit_length()) if 1 << i <= top}
    chosen.add(top)
    return sorted(chosen)


def with_verify_buckets(buckets: Sequence[int], max_batch_size: int, k: int, limit: int) -> list[int]:
    """``buckets`` and speculative verify steps' own: each bucket's requests with 1 + ``k`` tokens each, and a full
    batch's, at most ``limit`` rows (rows with drafts past it verify eagerly). Without the smaller ones a lone
    request's 1 + 8 rows ran in the full batch's bucket (H100 2026-12-06, SmolLM2, max_batch_size 8: 72 rows, a
    verify step ~0.98 ms by the run's totals against 0.79 timed at 9)."""
    rows = {min(b * (1 + k), limit) for b in [*buckets, max_batch_size]}
    return sorted(set(buckets) | rows)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` rows."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} rows exceed the largest captured batch {buckets[-1]}")
    return buckets[i]


class DecodeGraphs:
    """Decode steps for any batch up to ``buckets[-1]``, each bucket captured once (on CUDA).

    The block tables live on the device ([S, W], S = the largest bucket + 1, W = max_seq_len / block size), in
    rows this class hands out per request (``decode``'s ``request_ids``; ``release`` gives a row back) and keeps
    up to date from a pinned host copy: a step copies in only its [3, B] inputs (token, position, table row),
    plus the whole table once when a request's table has changed (a new block every block_size tokens), not the
    B x W tables every step. The last row stays all null blocks: the padding rows'.
    """

    def __init__(self, step: DecodeStep, buckets: Sequence[int], *, use_graphs: bool = True):
        self.step = step
        self.buckets = list(buckets)
        self.width = step.engine.slot_blocks  # block table entries a row can have (max_seq_len / block size)
        self.use_graphs = use_graphs and step.engine.device.type == "cuda"
        self.buffers: dict[int, StepBuffers] = {}
        self.staging: dict[int, list[torch.Tensor]] = {}  # pinned host copies of each bucket's inputs (two sets)
        self.sources: dict[int, torch.Tensor] = {}  # a chained step's sources on the device (``decode``)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.verify_buffers: dict[int, StepBuffers] = {}  # speculative verify steps: the same buffers, two passes
        # speculation's k and its verify buckets by decode bucket (``verify_requests``): a step verifying R requests
        # runs in the bucket of R's decode bucket x (1 + k), with that decode batch's attention (``verify_buffers``)
        self.verify_k = 0
        self.verify_bucket_of: dict[int, int] = {}
        self._verify_decode: list[int] = []
        self.verify_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # tree verify steps (``verify``'s ``parents``): the verify buffers plus each row's virtual position and slot
        # shifts ([1 + TREE_WORDS, B] on the device), a graph of their own, so that steps without tree rows run the
        # kernels unchanged
        self.tree_buffers: dict[int, StepBuffers] = {}
        self.tree_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._tree_bucket_of: dict[tuple[int, int], int] = {}  # (least bucket, verify bucket) -> ``_tree_bucket``'s
        self.setup_seconds = 0.0
        self._cuda = step.engine.device.type == "cuda"
        # Two sets of pinned host buffers used in turn (``_fill``, ``_read_back``): a chained step (``decode``'s
        # ``sources``) is filled while the previous one may not have copied its inputs in yet, and its tokens come
        # back while the next one runs. Each set's event marks its last copy done.
        self._turn = 0
        self._copied: list = [None, None]  # event after each set's input copy to the device
        self._greedy_host = [torch.zeros(self.buckets[-1], dtype=torch.long, pin_memory=self._cuda) for _ in range(2)]
        self._read: list = [None, None]  # event after each set's greedy tokens reached the host
        self._last = None  # (greedy tokens on the host, their event) of the last step
        self._last_greedy: torch.Tensor | None = None  # its greedy tokens on the device: a chained step's inputs
        self.read_back = True  # each step's argmax copied to the host behind it (off where nothing chains on it)
        self._tables_copied = None  # event after the pinned tables' last copy to the device (``_table_rows``)
        self._tables_pending = False  # that copy not waited for yet
        rows = self.buckets[-1] + 1
        self.padding_row = rows - 1
        self.tables = torch.zeros((rows, self.width), dtype=torch.long, device=step.engine.device)
        self.tables_host = torch.zeros((rows, self.width), dtype=torch.long, pin_memory=self.use_graphs)
        self._host = self.tables_host.numpy()
        self._row_of: dict = {}  # request id -> its table row
        self._known = [0] * rows  # entries of each row's table already written
        self._tail = [0] * rows  # each row's last entry written (a Python int: read every step for every row)
        self._free_rows = list(range(rows - 2, -1, -1))
        self.drafted = None  # prompt lookup on the device (``attach_drafts``: ``cuda.drafted``)
        self._posted = None  # the last step's tracked rows' results on their way to the host (``drafts_posted``)

    tree_tokens = TREE_TOKENS  # the capability the runtime asks for (``TorchRuntime._split``): tree rows verified

    def prepare(self) -> None:
        """Compile every kernel for every bucket and capture the graphs (once per process)."""
        start = time.perf_counter()
        for batch in reversed(self.buckets):  # largest first: later captures reuse its memory
            mark = time.perf_counter()
            buf = self.buffers[batch] = self.step.buffers(batch, self.tables)
            # rows: the step's inputs (tokens, positions, table rows, bans), and a chained step's sources (``decode``)
            # and a tree verify step's virtual positions and slot shifts (``verify``): STAGING_ROWS
            self.staging[batch] = [torch.zeros((STAGING_ROWS, batch), dtype=torch.long, pin_memory=self._cuda)
                                   for _ in range(2)]
            self.sources[batch] = torch.zeros(batch, dtype=torch.long, device=self.tables.device)
            self._fill(batch, [], [], [])
            if self._cuda:  # compiles the kernels outside the capture (on the CPU, Triton's interpreter: nothing to
                self.step.run(buf)  # compile, and a step of padding rows costs as much as a real one)
            if self.use_graphs:
                self.graphs[batch] = self._capture(buf)
            # (a cold kernel cache compiles here: a slow start's log says which bucket took the time)
            log.info("fast decode path: batch bucket %d compiled and captured in %.1f s", batch,
                     time.perf_counter() - mark)
        if self.use_graphs:
            torch.cuda.synchronize()
        self.setup_seconds = time.perf_counter() - start
        log.info("fast decode path ready: %d batch buckets %s, %s, in %.1f s", len(self.buckets), self.buckets,
                 "CUDA graphs" if self.use_graphs else "direct launches", self.setup_seconds)

    def verify_requests(self, k: int, decode_buckets: Sequence[int]) -> None:
        """Speculation drafts up to ``k`` tokens a request: a step verifying R requests (each 1 + at most k tokens)
        runs in the bucket ``b x (1 + k)`` of R's decode bucket b (``with_verify_buckets`` made them) with b's
        attention, so that its rows compute what 1-token steps of b rows do. Before ``prepare_verify``."""
        self.verify_k = k
        self.verify_bucket_of = {b: b * (1 + k) for b in decode_buckets if b * (1 + k) in self.buckets}
        self._verify_decode = sorted(self.verify_bucket_of)  # (searched at every verify step)

    def _verify_bucket(self, token_lists: Sequence[Sequence[int]]) -> int:
        """The bucket a verify step runs in: its requests' (``verify_requests``) where every row is a request's
        token and its drafts, else the smallest that holds its tokens (a prompt's chunk, a tree)."""
        n = sum(len(toks) for toks in token_lists)
        if self.verify_bucket_of and max(len(toks) for toks in token_lists) <= 1 + self.verify_k:
            decode = self._verify_decode
            i = bisect.bisect_left(decode, len(token_lists))
            if i < len(decode) and self.verify_bucket_of[decode[i]] >= n:
                return self.verify_bucket_of[decode[i]]
        return bucket_for(n, self.buckets)

    def prepare_verify(self, batches: Sequence[int] | None = None, trees: bool = False) -> None:
        """Capture the verify graphs of ``batches``' buckets (None: every bucket: speculative decoding is on; the
        runtime's short-prefill buckets otherwise) now. Captured on first use instead, each verify bucket a request's
        draft length (or a prompt's length) first reaches cost a capture (a synchronize and every kernel of the step
        recorded: milliseconds) inside generation, the first requests' and a benchmark's timed run's. ``trees``: the
        tree verify steps' graphs too (tree speculation is on)."""
        if not self.buffers:
            self.prepare()
        start = time.perf_counter()
        for batch in reversed(sorted({bucket_for(b, self.buckets) for b in batches or self.buckets})):
            self._verify_buffers(batch)
            if trees:
                self._verify_buffers(batch, tree=True)
        seconds = time.perf_counter() - start
        self.setup_seconds += seconds
        log.info("fast verify steps ready: batch buckets %s%s, in %.1f s", sorted(self.verify_buffers),
                 " (tree steps too)" if trees else "", seconds)

    def attach_drafts(self, k: int, min_n: int, max_n: int, max_len: int, max_spans: int) -> None:
        """Prompt lookup on the device for the requests ``decode``/``verify`` call tracked (``cuda.drafted``): up to
        ``k`` drafts, n-grams ``min_n`` .. ``max_n``, histories of up to ``max_len`` tokens, ``max_spans`` tracked
        requests a step at most. Once per decoder."""
        if self.drafted is not None:
            return
        if not self.buffers:
            self.prepare()
        from trtllm_pipeline.runtimes.torch_engine.cuda.drafted import DraftedSteps

        self.drafted = DraftedSteps(self.buckets, self.tables.shape[0], k=k, min_n=min_n, max_n=max_n,
                                    max_len=max_len, max_spans=max_spans, device=self.tables.device,
                                    use_graphs=self.use_graphs)
        for batch in self.buckets:
            self.drafted.capture(batch, self.buffers[batch])

    def load_history(self, request_id, tokens: Sequence[int]) -> None:
        """``request_id``'s tokens so far (prompt + generated) as its history on the device (device drafting)."""
        self.drafted.load(self._row_for(request_id), tokens)

    def drafts_posted(self):
        """The last step's tracked rows' results, as ``DraftedSteps.result`` takes them (None: it had none)."""
        return self._posted

    def decode(self, tokens: Sequence[int], tables: Sequence[Sequence[int]], positions: Sequence[int],
               request_ids: Sequence | None = None, sources: Sequence[int] | None = None,
               bans: Sequence[int] | None = None, tracked: Sequence[int] | None = None) -> torch.Tensor:
        """Float32 logits [len(tokens), vocab] of one decode step: row i's token at ``positions[i]``, its K/V in
        the blocks ``tables[i]`` (a view valid until the next call). ``request_ids``: each row's request, whose
        table row persists between steps (``release`` it when the request leaves); None: rows 0.. this step.

        ``sources``: a chained step, launched before the previous step's tokens (``decode``'s or ``verify``'s) were
        read: row i feeds that step's greedy token of its row ``sources[i]``, taken on the device (``tokens[i]`` is then a placeholder), or
        where ``sources[i]`` is negative, ``tokens[i]`` (a request that joined the decodes since). Every step's argmax
        tokens also come to the host by themselves (``greedy_host``), without waiting for a later step.

        ``bans``: per row, a token its argmax (``greedy``) skips, negative for none (the end id before min_tokens: so
        a chained step may feed on the argmax of a row with ``min_tokens`` left); None: none at all.

        ``tracked``: per row, device drafting's 0 / 1 / 2 (``cuda.drafted``); None: no row is."""
        keys = request_ids if request_ids is not None else [("row", i) for i in range(len(tokens))]
        rows = self._table_rows(keys, tables)
        if request_ids is None:
            self.release(keys)
        if not self.buffers:
            self.prepare()
        n = len(tokens)
        batch = bucket_for(n, self.buckets)
        buf = self.buffers[batch]
        self._fill(batch, tokens, positions, rows, sources, bans)
        if sources is not None:  # after the inputs' copy, before the replay: in stream order, the previous step's
            self._chain_tokens(buf.inputs[0, :n], self.sources[batch][:n], min(sources) < 0)
        spans = self._stage_drafts(batch, buf, tracked, rows, [1] * n)
        if self.use_graphs:
            self.graphs[batch].replay()
        else:
            self.step.run(buf)
        self._post_drafts(batch, buf, spans)
        self._read_back(buf.greedy, n)
        return buf.logits[:n]

    def _stage_drafts(self, batch: int, buf, tracked, rows: Sequence[int], lengths: Sequence[int]) -> list:
        """The tracked rows' spans staged for ``drafted`` (a pending row's inputs made on the device now, after the
        inputs' copy); [] where none is tracked."""
        if not tracked or not any(tracked):
            return []
        spans, first = [], 0
        for state, row, n in zip(tracked, rows, lengths):
            if state:
                spans.append((first, n, row, state == 2))
            first += n
        pending = self.drafted.stage(batch, self._turn, spans)
        if self._cuda:  # (the pinned set is free again once this copy is done too)
            self._copied[self._turn] = _recorded(self._copied[self._turn])
        if pending:
            self.drafted.prep(batch, buf)
        return spans

    def _post_drafts(self, batch: int, buf, spans: list) -> None:
        self._posted = self.drafted.post(batch, buf, len(spans), self._turn) if spans else None

    def _chain_tokens(self, tokens: torch.Tensor, sources: torch.Tensor, mixed: bool) -> None:
        """``tokens`` (copied in) replaced on the device by the previous step's argmax of rows ``sources``; ``mixed``:
        rows whose source is negative keep theirs (one gather where every row chains, as at steady load)."""
        if not mixed:
            torch.index_select(self._last_greedy, 0, sources, out=tokens)
            return
        taken = self._last_greedy.index_select(0, sources.clamp(min=0))
        torch.where(sources >= 0, taken, tokens, out=tokens)

    def greedy_host(self) -> tuple[torch.Tensor, object | None]:
        """The last step's argmax tokens (``decode``'s or ``verify``'s, every token row) on the host (pinned) and the
        event after which they are there (None: they are already): reading them waits for that step only, not for a
        step launched after it."""
        return self._last

    def verify(self, token_lists: Sequence[Sequence[int]], tables: Sequence[Sequence[int]], starts: Sequence[int],
               request_ids: Sequence, sources: Sequence[int] | None = None,
               parents: Sequence[Sequence[int] | None] | None = None,
               tracked: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Speculative decoding's verify step: request i feeds ``token_lists[i]`` at positions ``starts[i] ..``,
        every token a row of one step (all of a request's rows name its one table row), so the weights are read
        once for all of them; the step runs attention twice (``StepBuffers.attention_passes``), from a graph of its
        own per batch bucket (``prepare_verify``, or on first use). Float32 logits and their argmax, [total tokens]
        rows in order. ``sources``: per token row, as ``decode``'s (a chained step).

        ``parents``: per request, None (a linear row) or its tree row's parent index per token (``PlanRow.parents``,
        at most ``TREE_TOKENS`` tokens): where any is given the step is a tree step (``tree_inputs``: each node
        rotated at, and attending as a 1-token step at, its context length + depth, over the context and its
        ancestors, its K/V at its index in the row), from a graph of its own, in a bucket that attends as its
        requests' decode batch (``_tree_bucket``); a step without trees runs the kernels as before. ``tracked``: as
        ``decode``'s."""
        rows = self._table_rows(request_ids, tables)
        if not self.buffers:
            self.prepare()
        tokens = [t for toks in token_lists for t in toks]
        positions = [start + j for toks, start in zip(token_lists, starts) for j in range(len(toks))]
        expanded = [row for toks, row in zip(token_lists, rows) for _ in toks]
        tree = None
        if parents is not None and any(p is not None for p in parents):
            tree = tree_inputs(token_lists, starts, parents)
        batch = self._verify_bucket(token_lists) if tree is None else self._tree_bucket(token_lists)
        buf = self._verify_buffers(batch, tree=tree is not None)
        n = len(tokens)
        self._fill(batch, tokens, positions, expanded, sources, tree=tree)
        if sources is not None:
            self._chain_tokens(buf.inputs[0, :n], self.sources[batch][:n], min(sources) < 0)
        spans = self._stage_drafts(batch, buf, tracked, rows, [len(toks) for toks in token_lists])
        if self.use_graphs:
            (self.tree_graphs if tree is not None else self.verify_graphs)[batch].replay()
        else:
            self.step.run(buf)
        self._post_drafts(batch, buf, spans)
        self._read_back(buf.greedy, n)
        return buf.logits[:n], buf.greedy[:n]

    def _tree_bucket(self, token_lists: Sequence[Sequence[int]]) -> int:
        """The bucket a tree step runs in: the smallest that holds its tokens and whose verify step splits the keys
        and tiles them as its requests' decode batch does, that is as ``_verify_bucket``'s (a tree node then
        computes a 1-token step's logits bit for bit, as a chain's verify row does: a lone request's tree of 5-7
        nodes ran in bucket 8, whose 16 key splits were not the 1-token step's 32). At batch 1: buckets 2 and 4
        attend as 1 does; 8 does not."""
        exact = self._verify_bucket(token_lists)
        least = bucket_for(sum(len(toks) for toks in token_lists), self.buckets)
        found = self._tree_bucket_of.get((least, exact))
        if found is None:
            want = self.step.attention_of(self._verify_buffers(exact))
            found = next(b for b in self.buckets[self.buckets.index(least):]
                         if b >= exact or self.step.attention_of(self._verify_buffers(b)) == want)
            self._tree_bucket_of[least, exact] = found
        return found

    def _verify_buffers(self, batch: int, tree: bool = False):
        """The bucket's buffers (shared with its decode graph: the two never run at once) with two attention
        passes, and their graph (``tree``: a tree step's, with its own tree inputs)."""
        if tree:
            buf = self.tree_buffers.get(batch)
            if buf is None:
                inputs = torch.zeros((1 + attention.TREE_WORDS, batch), dtype=torch.long, device=self.tables.device)
                buf = self.tree_buffers[batch] = dataclasses.replace(self._verify_buffers(batch), tree=inputs)
                if self.use_graphs:  # the attention kernel's TREE variant compiled outside the capture, by a step
                    self._fill(batch, [], [], [], tree=([], [[]] * attention.TREE_WORDS))  # of padding rows only
                    self.step.run(buf)
                    self.tree_graphs[batch] = self._capture(buf)
                    torch.cuda.synchronize()
            return buf
        buf = self.verify_buffers.get(batch)
        if buf is None:
            requests = {v: b for b, v in self.verify_bucket_of.items()}.get(batch)
            buf = self.verify_buffers[batch] = (dataclasses.replace(self.buffers[batch], attention_passes=2)
                                                if requests is None
                                                else self.step.verify_buffers(self.buffers[batch], requests))
            if self.use_graphs:
                self.verify_graphs[batch] = self._capture(buf)
                torch.cuda.synchronize()
        return buf

    def _capture(self, buf):
        """One step over ``buf`` captured as a CUDA graph, its kernels' carveout pinned first (compiled already)."""
        self.step.pin_carveout(buf)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step.run(buf)
        return graph

    def _table_rows(self, keys, tables) -> list[int]:
        """Each request's table row on the device, its table brought up to date there."""
        rows, changed = [], False
        if self._tables_pending:  # (the pinned tables' last copy may still be queued behind a running step, which
            self._tables_copied.synchronize()  # must read the tables as they were: wait for that copy first)
            self._tables_pending = False
        for key, table in zip(keys, tables):
            row = self._row_for(key)
            known = self._known[row]
            if known > len(table) or (known and self._tail[row] != table[known - 1]):
                known = 0  # another table than the one written (the request was recomputed): write it all
            if len(table) > known:
                self._host[row, known : len(table)] = table[known:]
                self._known[row] = len(table)
                self._tail[row] = table[-1]
                changed = True
            rows.append(row)
        if changed:
            self.tables.copy_(self.tables_host, non_blocking=True)
            if self._cuda:
                self._tables_copied, self._tables_pending = _recorded(self._tables_copied), True
        return rows

    def _row_for(self, key) -> int:
        """``key``'s table row, handed out on first use."""
        row = self._row_of.get(key)
        if row is None:
            row = self._row_of[key] = self._free_rows.pop()
            self._known[row] = 0
        return row

    def decode_padded(self, rows: torch.Tensor) -> torch.Tensor:
        """``decode`` of the inputs as ``plan.decode_inputs`` lays them out ([2 + width, n] int64: tokens,
        positions, each row's whole table down its column): a tensor-parallel rank's step."""
        tables = rows[2:].t().tolist()
        return self.decode(rows[0].tolist(), tables, rows[1].tolist())

    def release(self, request_ids) -> None:
        """These requests decode no more (finished, or preempted): their table rows go back."""
        for key in request_ids:
            row = self._row_of.pop(key, None)
            if row is not None:
                self._free_rows.append(row)

    def time_replay(self, batch: int, replays: int = 50) -> float | None:
        """Milliseconds per replay of the graph holding ``batch`` rows, back to back, by CUDA events (its inputs:
        the last step's, so call it with the runtime idle); None without graphs."""
        graph = self.graphs.get(bucket_for(batch, self.buckets))
        if graph is None:
            return None
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (this engine's; a tensor-parallel rank's shard)."""
        return self.step.weight_bytes()

    def greedy(self, n: int) -> torch.Tensor:
        """The argmax tokens of the last ``decode`` of ``n`` rows, computed inside the step."""
        return self.buffers[bucket_for(n, self.buckets)].greedy[:n]

    def _fill(self, batch: int, tokens, positions, rows, sources=None, bans=None, tree=None) -> None:
        """The step's inputs into this turn's pinned set, copied to the device ahead of the replay on the stream.
        The set was last used two fills ago; its copy is done unless two steps were chained past it (then wait).
        ``tree``: a tree step's (virtual positions, slot shift words) per token row (``tree_inputs``)."""
        self._turn ^= 1
        if (copied := self._copied[self._turn]) is not None:
            copied.synchronize()
        staging = self.staging[batch][self._turn]
        write_step_inputs(staging.numpy(), tokens, positions, rows, self.padding_row, bans)
        self.buffers[batch].inputs.copy_(staging[:4], non_blocking=True)
        if sources is not None:
            staging.numpy()[SOURCES_ROW, : len(sources)] = sources
            self.sources[batch].copy_(staging[SOURCES_ROW], non_blocking=True)
        if tree is not None:
            host, n = staging.numpy(), len(tokens)
            host[TREE_ROW, :n] = tree[0]
            host[TREE_ROW + 1 : STAGING_ROWS, :n] = tree[1]
            host[TREE_ROW:STAGING_ROWS, n:] = 0  # padding rows: position 0, nothing shifted
            self.tree_buffers[batch].tree.copy_(staging[TREE_ROW:STAGING_ROWS], non_blocking=True)
        if self._cuda:
            self._copied[self._turn] = _recorded(self._copied[self._turn])

    def _read_back(self, greedy: torch.Tensor, n: int) -> None:
        """The step's argmax tokens to this turn's pinned host buffer, behind the step on the stream (its tokens of
        two steps ago were read by then: a caller chains one step at most)."""
        self._last_greedy = greedy
        if not self.read_back:
            return
        host = self._greedy_host[self._turn][:n]
        host.copy_(greedy[:n], non_blocking=self._cuda)
        if self._cuda:
            self._read[self._turn] = _recorded(self._read[self._turn])
        self._last = (host, self._read[self._turn])


def _recorded(event):
    """``event`` (a new one if None) recorded on the current stream."""
    event = event if event is not None else torch.cuda.Event()
    event.record()
    return event


def tree_inputs(token_lists: Sequence[Sequence[int]], starts: Sequence[int],
                parents: Sequence[Sequence[int] | None]) -> tuple[list[int], list[list[int]]]:
    """A tree verify step's virtual position and slot shifts per token row (``attention.decode_attention``'s
    ``tree``): a tree row's token i at its start plus its depth, its ancestors' keys, which sit at the slots of their
    row indices, read at the positions of their depths (an ancestor of depth d, j = depth - d positions back: shift
    index - d in byte j % 8 of word j // 8); a linear row's tokens (``parents`` None) at their positions, nothing
    shifted. Returns (virtual positions, ``attention.TREE_WORDS`` lists of each row's word)."""
    rot, words = [], []
    for toks, start, par in zip(token_lists, starts, parents):
        if par is None:
            rot += range(start, start + len(toks))
            words += [[0] * attention.TREE_WORDS for _ in toks]
            continue
        if len(par) != len(toks) or len(toks) > TREE_TOKENS:
            raise ValueError(f"a tree row of {len(toks)} tokens ({len(par)} parents): the fast step takes "
                             f"{TREE_TOKENS} at most, one parent per token")
        depths = row_depths(par)
        for i, depth in enumerate(depths):
            rot.append(start + depth)
            mine = [0] * attention.TREE_WORDS
            a = par[i]
            while a > 0:  # its ancestors up to the row's first token (index 0, depth 0: in place)
                j = depth - depths[a]
                mine[j // 8] |= (a - depths[a]) << (8 * (j % 8))  # (at most 62: the sign bit stays clear)
                a = par[a]
            words.append(mine)
    return rot, [list(w) for w in zip(*words)] if words else [[] for _ in range(attention.TREE_WORDS)]


def write_step_inputs(out, tokens: Sequence[int], positions: Sequence[int], rows: Sequence[int],
                      padding_row: int, bans: Sequence[int] | None = None) -> None:
    """Fill ``out`` ([4+, batch] int64, a numpy view of the pinned staging tensor: written in place, no temporary
    tensors on the step's path) with tokens, positions, table rows and bans (-1: none); padding rows: token 0 at
    position 0, in the padding table row (all null blocks), no ban."""
    n = len(tokens)
    out[0, :n] = tokens
    out[1, :n] = positions
    out[2, :n] = rows
    out[3, :n] = -1 if bans is None else bans
    out[:2, n:] = 0
    out[2, n:] = padding_row
    out[3, n:] = -1


def prepared(engine, buckets: Sequence[int], *, use_graphs: bool = True,
             step: DecodeStep | None = None) -> DecodeGraphs:
    """The fast decode path over ``engine`` (or its already built ``step``), compiled and captured;
    ``decode_step.Unsupported`` if it cannot run it. A tensor-parallel rank's engine gets its collectives in
    the step, so every rank of the group must prepare, and then decode, in step with the others."""
    graphs = DecodeGraphs(step or DecodeStep(engine), buckets, use_graphs=use_graphs)
    graphs.prepare()
    return graphs
