"""The torch runtime: runs the exported TensorRT-LLM checkpoint in PyTorch, on CPU or CUDA.

The "engine" of this runtime is the validated checkpoint itself (``engines/<config>/checkpoint``)
plus the build manifest that names it. A TP checkpoint runs as ``runtime.tp_mode`` says: merged
(every rank's slice reassembled at load time, checked for consistency, run on one device by a
``LocalExecutor``) or distributed (one process per rank, each loading only its own shard, this
process rank 0: ``runtimes/torch_engine/tp``, a ``TpExecutor``); the math is the engine's (see ``torch_engine/model``).

The flow of a step: this class keeps the requests and the sampling; the ``scheduler`` plans the step (which
requests run, how many tokens each: prefill chunks and decodes side by side under ``max_num_tokens``, with KV
blocks from the ``kv_cache`` manager, which also reuses cached prefixes and whose pool runs out by preempting);
the executor (``torch_engine/executor``) runs the plan's rows. On CUDA the rows of one decode token run as fused
Triton kernels replayed from CUDA graphs (``cuda/``), reading K/V through the same block tables; the other rows
run through the eager model, which stays the CPU path and the reference the kernels are checked against.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import torch

from trtllm_pipeline import artifacts, checkpoint
from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.runtimes.torch_engine import executor as executor_module
from trtllm_pipeline.runtimes.torch_engine import sampling
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TokenEvent
from trtllm_pipeline.runtimes.torch_engine.device_drafting import DeviceDrafting
from trtllm_pipeline.runtimes.torch_engine.executor import Executor, ExecutorLost, LocalExecutor
from trtllm_pipeline.runtimes.torch_engine.kv_cache import KVCacheManager
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.overlap import PENDING, OverlapSteps
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch, PlanRow, logit_span, row_depths, rows_at
from trtllm_pipeline.runtimes.torch_engine.scheduler import Scheduler, Sequence as _Sequence
from trtllm_pipeline.runtimes.torch_engine.scoring import Scoring
from trtllm_pipeline.runtimes.torch_engine.switches import (fast_prefill_buckets, fast_prefill_enabled, fast_trees_enabled,
                                                             invariant_graphs_enabled, prefill_graphs_enabled,
                                                             prefill_wait_enabled, warm_up_enabled)
from trtllm_pipeline.runtimes.torch_engine.tp.executor import TpExecutor
from trtllm_pipeline.runtimes.torch_engine.tp.mode import resolve_tp_mode

log = logging.getLogger(__name__)



@dataclasses.dataclass(eq=False)
class _Request(_Sequence):
    params: SamplingParams = None
    end_id: int = -1
    generator: torch.Generator | None = None
    bad_ids: list[list[int]] = dataclasses.field(default_factory=list)  # bad words, tokenized once
    # device drafting (``cuda.drafted``): its history is on the device and every fast step it is in advances it
    tracked: bool = False
    device_next: list[int] | None = None  # the drafts the device looked up after its last step read (None: none yet)

    def banned(self, ahead: Sequence[int] = ()) -> list[int]:
        """Tokens this request may not produce next: its end id before min_tokens, bad words' last tokens (a word
        whose other tokens end what it has generated). ``ahead``: tokens taken as generated after ``generated``
        (a verify row's earlier drafts): the bans at that later position, as plain decoding would apply them there."""
        out = [self.end_id] if len(self.generated) + len(ahead) < self.params.min_tokens and self.end_id >= 0 else []
        for ids in self.bad_ids:
            if len(ids) == 1 or _ends_with(self.generated, ahead, ids[:-1]):
                out.append(ids[-1])
        return out

    def end_ban(self) -> int:
        """The end id while this request's next token may not end it (before min_tokens), else -1: what a decode
        step's own argmax skips for it (``DecodeGraphs.decode``'s ``bans``)."""
        return self.end_id if self.end_id >= 0 and len(self.generated) < self.params.min_tokens else -1

    def may_ban(self) -> bool:
        """Whether ``banned`` may be anything but empty now (bad words; the end id before min_tokens)."""
        return bool(self.bad_ids) or (self.end_id >= 0 and len(self.generated) < self.params.min_tokens)


def _drafts_before(row: PlanRow) -> list[list[int]]:
    """Per position of a verify row, the drafts before it that the request would have generated there: the earlier
    drafts of a chain, a tree node's ancestors (and itself) in a tree."""
    if row.parents is None:
        return [row.tokens[1 : 1 + j] for j in range(1 + row.draft)]
    out: list[list[int]] = []
    for j, p in enumerate(row.parents):
        out.append([] if p < 0 else out[p] + [row.tokens[j]])
    return out


def _ends_with(generated: Sequence[int], ahead: Sequence[int], tail: Sequence[int]) -> bool:
    """Whether ``generated + ahead`` (without joining them) ends with ``tail`` (not empty)."""
    n, a = len(tail), len(ahead)
    if n <= a:
        return list(ahead[a - n :]) == list(tail)
    return (len(generated) >= n - a and list(generated[len(generated) - (n - a) :]) == list(tail[: n - a])
            and list(ahead) == list(tail[n - a :]))


def pool_blocks(*, device: torch.device, free_bytes: int | None, block_bytes: int, block_size: int,
                max_batch_size: int, max_seq_len: int, fraction: float, blocks: int | None, ranks: int = 1) -> int:
    """Blocks of the KV pool, the null block included: ``blocks`` if given; on CUDA ``fraction`` of the memory
    free once the weights are loaded (TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction``); on CPU as many as
    ``max_batch_size`` sequences of ``max_seq_len`` need. ``block_bytes``: one block over all layers, one rank;
    on CPU the ranks' pools share this machine's memory. Too many for the memory free: UnavailableError."""
    if blocks is None and device.type == "cuda" and free_bytes is not None:
        blocks = int(fraction * free_bytes) // block_bytes
        if blocks < 2:
            raise UnavailableError(
                f"runtime.kv_cache_free_gpu_mem_fraction {fraction} of the {free_bytes / 2**30:.1f} GiB free after "
                f"the weights holds no KV block of {block_bytes / 2**20:.1f} MiB.",
                fix="raise runtime.kv_cache_free_gpu_mem_fraction, or free the GPU")
        return blocks + 1
    need_blocks = blocks if blocks is not None else -(-max_batch_size * max_seq_len // block_size) + 1
    need = need_blocks * block_bytes * (ranks if device.type != "cuda" else 1)
    if free_bytes is not None and need > free_bytes:
        what = (f"runtime.kv_cache_blocks {blocks}" if blocks is not None else
                f"build.max_batch_size {max_batch_size} x build.max_seq_len {max_seq_len}")
        raise UnavailableError(
            f"the torch runtime's KV cache for {what} needs {need / 2**30:.1f} GiB; {device} has "
            f"{free_bytes / 2**30:.1f} GiB free.",
            fix="lower build.max_batch_size or build.max_seq_len, or set runtime.kv_cache_blocks (the pool is "
                "allocated whole, at load)")
    return need_blocks


def resolve_device(requested: str | None) -> torch.device:
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UnavailableError("runtime.device: cuda was asked for but torch sees no CUDA GPU.",
                               fix="use device cpu (or auto), or install a CUDA build of torch")
    return torch.device(requested)


class TorchRuntime(DeviceDrafting, OverlapSteps, Scoring, Runtime):
    name = "torch"

    def __init__(self, checkpoint_dir: Path, tokenizer_dir: Path, *, device: str | None = None,
                 max_batch_size: int = 8, max_seq_len: int = 4096, max_input_len: int | None = None,
                 dtype: str | None = None, fast_decode: bool = True, cuda_graphs: bool = True,
                 graph_batch_sizes: Sequence[int] | None = None, prefill_chunk_tokens: int = 2048,
                 tp_mode: str = "auto", max_num_tokens: int = 8192, kv_block_size: int = 32,
                 kv_cache_blocks: int | None = None, kv_cache_free_gpu_mem_fraction: float = 0.9,
                 enable_kv_cache_reuse: bool = False, speculative=None, batch_invariant: bool = False):
        """``dtype`` overrides the checkpoint's compute dtype (FP8 weights stay FP8 values).

        ``tp_mode``: ``auto`` | ``merged`` | ``distributed`` for a tp>1 checkpoint (``tp.mode``); for
        tp=1, ``distributed`` runs the distributed code path with one rank.

        ``fast_decode``/``cuda_graphs``: the CUDA decode path's Triton kernels and their graphs
        (ignored on CPU); ``graph_batch_sizes``: the batch buckets captured (default: powers of two
        up to ``max_batch_size``); ``prefill_chunk_tokens``: prompt tokens prefilled per step;
        ``max_num_tokens``: tokens a step runs at most (prefill chunks and decodes).

        The KV pool (``kv_cache``): blocks of ``kv_block_size`` tokens; ``kv_cache_blocks`` of them if given, else
        on CUDA ``kv_cache_free_gpu_mem_fraction`` of the memory free after the weights, on CPU enough for
        ``max_batch_size`` x ``max_seq_len``; ``enable_kv_cache_reuse``: the prefix cache.

        ``speculative``: ``config.SpeculativeSection`` (or anything with its fields); None or method ``none``: off.

        ``batch_invariant``: on CUDA (or under Triton's interpreter), every step eager and through kernels whose
        rows do not depend on the rest of the step (``Qwen2Engine.make_batch_invariant``): no fast path, no prefill
        graphs. One process only (tensor parallel's ranks would need their all-reduces in a fixed order too).
        """
        self.device = resolve_device(device)
        self.speculator = None
        self.tree_verify = False  # greedy requests' tree drafts verified as trees (``_speculator``)
        config = checkpoint.read_config(checkpoint_dir)
        layout = checkpoint.CheckpointLayout(config)
        self.tp_mode, self.tp_notice = resolve_tp_mode(tp_mode, layout.tp, self.device)
        if self.tp_notice:
            log.warning("%s", self.tp_notice)
        self.config = config
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, int(config.get("max_position_embeddings") or max_seq_len))
        self.max_input_len = min(max_input_len or self.max_seq_len - 1, self.max_seq_len - 1)
        self.prefill_chunk_tokens = max(1, prefill_chunk_tokens)
        compute_dtype = getattr(torch, dtype) if dtype else getattr(torch, config["dtype"])
        ranks = layout.tp if self.tp_mode == "distributed" else 1
        # On CPU the pool's size is known before the weights load: refuse at once what cannot fit.
        kv_heads = layout.kv_heads_per_rank if ranks > 1 else layout.kv_heads
        kv_itemsize = 1 if layout.kv_cache_quant_algo == "FP8" else compute_dtype.itemsize  # (E4M3: Qwen2Engine)
        block_bytes = 2 * layout.layers * kv_heads * layout.head_size * kv_itemsize * kv_block_size
        self.kv_block_bytes = block_bytes  # one block over all layers, one rank: what the pool is sized by
        sizing = dict(device=self.device, block_bytes=block_bytes, block_size=kv_block_size,
                      max_batch_size=max_batch_size, max_seq_len=self.max_seq_len,
                      fraction=kv_cache_free_gpu_mem_fraction, blocks=kv_cache_blocks and kv_cache_blocks + 1,
                      ranks=ranks)
        if self.device.type != "cuda":
            pool_blocks(free_bytes=executor_module.device_free_bytes(self.device), **sizing)
        engine_args = dict(max_seq_len=self.max_seq_len, dtype=getattr(torch, dtype) if dtype else None)
        if self.tp_mode == "distributed":
            self.executor: Executor = TpExecutor(checkpoint_dir, world_size=layout.tp, device=self.device,
                                                 **engine_args)
            self.device = self.executor.device  # rank 0's: cuda:0 on CUDA
        else:
            _, tensors = checkpoint.load_checkpoint(checkpoint_dir)
            self.executor = LocalExecutor(Qwen2Engine(config, tensors, device=self.device, **engine_args))
            del tensors
        self.engine = self.executor.engine
        from trtllm_pipeline.runtimes.torch_engine.cuda import support  # (no Triton import: a check of the env)

        self.batch_invariant = batch_invariant and (self.device.type == "cuda" or support.interpreting())
        if batch_invariant and not self.batch_invariant:  # (the CPU's eager path: its own torch kernels, as always)
            log.warning("runtime.batch_invariant applies on CUDA; on the %s the eager path runs as usual",
                        self.device.type)
        try:
            if self.batch_invariant:
                if self.tp_mode == "distributed":
                    raise InputError("runtime.batch_invariant runs in one process; this checkpoint's ranks run "
                                     "distributed.", fix="set runtime.tp_mode: merged, or turn runtime.batch_invariant off")
                self.engine.make_batch_invariant()
                fast_decode = False
            # the proposer first: a draft model's weights and KV pool are allocated before the target's pool is
            # sized from the memory left
            self.tokenizer_dir, self.vocab_size = Path(tokenizer_dir), int(config["vocab_size"])
            self.speculator = self._speculator(speculative)
            num_blocks = pool_blocks(free_bytes=self.executor.free_memory(), **sizing)
            self.executor.allocate_kv(num_blocks, kv_block_size)
            self.kv = KVCacheManager(num_blocks, kv_block_size, enable_prefix_cache=enable_kv_cache_reuse)
            self.scheduler = Scheduler(self.kv, max_running=max_batch_size, max_num_tokens=max_num_tokens,
                                       prefill_chunk_tokens=self.prefill_chunk_tokens)
            log.info("KV pool: %d blocks of %d tokens (%.2f GiB per rank, %s), prefix cache %s", num_blocks - 1,
                     kv_block_size, num_blocks * block_bytes / 2**30,
                     str(self.engine.kv_dtype).removeprefix("torch."), "on" if enable_kv_cache_reuse else "off")
            # speculation: the fast path's largest bucket holds every row's 1 + k tokens (a verify step)
            spec_k = 0 if speculative is None or speculative.method == "none" else speculative.num_draft_tokens
            if self.tree_verify:  # a tree row: its nodes are its drafts
                spec_k = max(spec_k, self.tree_nodes)
            self._finish_init(tokenizer_dir, fast_decode, cuda_graphs, graph_batch_sizes, spec_k)
            if self.device.type == "cuda" and warm_up_enabled():
                self.warm_up()
            self.prefill_graphs = self._prefill_graphs()
            self.row_graphs = self._row_graphs()
            if self.row_graphs is not None:
                self.decode_path = "eager forward, single-token steps from CUDA graphs (runtime.batch_invariant)"
            # (a prompt that fits a step whole is then not split to fill a step of first chunks: see Scheduler)
            self.scheduler.whole_first_chunks = self.prefill_graphs is not None
            if self.speculator is not None and self.decoder is not None and not hasattr(self.decoder, "verify"):
                log.warning("speculative decoding: verify steps run eagerly (this fast path, tensor parallel, "
                            "decodes one token per row); rows without drafts stay on it")
            elif self.tree_verify and self.decoder is not None and not self._fast_trees():
                log.warning("speculative decoding: tree drafts verify eagerly (this fast path verifies no trees, or "
                            "TRTLLM_PIPELINE_FAST_TREES=0); linear drafts and plain decodes stay on it")
        except BaseException:
            if self.speculator is not None:
                self.speculator.close()
            self.executor.close()
            raise

    def _finish_init(self, tokenizer_dir: Path, fast_decode: bool, cuda_graphs: bool, graph_batch_sizes,
                     spec_k: int = 0) -> None:
        from trtllm_pipeline.tokenizer import Tokenizer  # not transformers: this runs in Triton's stub too

        self.tokenizer = artifacts.checked_tokenizer(tokenizer_dir, Tokenizer)
        self._requests: dict[Any, _Request] = {}
        self.prefill_graphs = None  # a prompt's first chunk from a CUDA graph (``_prefill_graphs``)
        self.row_graphs = None  # batch-invariant decode steps from CUDA graphs (``_row_graphs``)
        # host seconds per step phase, and rows by kind (``phase_times``): where a loaded step's time goes
        self.phase_s = dict.fromkeys(("plan", "eager", "fast"), 0.0)
        self.phase_rows = dict.fromkeys(("steps", "eager_rows", "eager_tokens", "fast_rows", "fast_prefill_rows",
                                         "chained_steps", "graph_prefills"), 0)
        decoder, self.decode_path = self._fast_decoder(fast_decode, cuda_graphs, graph_batch_sizes, spec_k)
        # fast steps left running while the caller handles the previous step's events, decode steps chained (overlap)
        self.attach_decoder(decoder)

    def warm_up(self) -> float:
        """The eager forward run once now, before any request: its Triton kernels (``cuda/prefill``, ``cuda/norm``)
        compile or load on first use, and on a cold kernel cache that took ~1.4 s inside the first served load that
        sent a prompt eagerly (H100 2026-12-05e: 2,048 eager tokens took 1.82 s at c=32, TTFT mean 420 ms; 13,568
        took 0.42 s on the warm server). Two prompts through the eager model with the fast path detached: one past a
        prefill chunk (a first chunk and a later one: the two attention paths), one short beside it, two tokens
        each (eager decodes). What it leaves: no request, no counted step or token (``stats``), its blocks free or
        cached. Returns its seconds. Off with ``TRTLLM_PIPELINE_WARMUP=0``."""
        t0 = time.perf_counter()
        phase_s, phase_rows = dict(self.phase_s), dict(self.phase_rows)
        kv_counts = (self.kv.queries, self.kv.hits, self.kv.preemptions)
        speculating = self.speculator is not None and self.speculator.enabled
        if speculating:
            self.speculator.enabled = False
        decoder = self.decoder
        self.attach_decoder(None)
        try:
            longest = min(self.max_input_len, self.prefill_chunk_tokens + 3, self.max_seq_len - 2)
            while longest > 1 and not self.kv.fits_ever(longest + 2 + 64):
                longest //= 2
            ids = [(7 + 7919 * i) % self.vocab_size for i in range(longest)]
            self.generate([ids, ids[:37][::-1]], SamplingParams(max_tokens=2, end_id=-1))
        except ExecutorLost:
            raise
        except Exception as exc:  # noqa: BLE001 - speed only: the first requests compile instead, and say so
            log.warning("warm-up: the eager forward failed (%s: %s); requests will compile its kernels on first use",
                        type(exc).__name__, exc)
        finally:
            self.attach_decoder(decoder)
            if speculating:
                self.speculator.enabled = True
            self.phase_s.update(phase_s)
            self.phase_rows.update(phase_rows)
            self.kv.queries, self.kv.hits, self.kv.preemptions = kv_counts
        seconds = time.perf_counter() - t0
        log.info("warm-up: the eager forward's kernels ready in %.1f s", seconds)
        return seconds

    def _fast_decoder(self, fast: bool, graphs: bool, sizes, spec_k: int = 0):
        """The CUDA fast path, compiled and captured now (once per process), or why eager runs."""
        from trtllm_pipeline.runtimes.torch_engine.cuda import support

        if self.device.type != "cuda" and not support.interpreting():
            return None, "eager (CPU)"
        if not fast:
            return None, "eager (runtime.batch_invariant)" if self.batch_invariant else "eager (runtime.fast_decode is off)"
        usable, why = support.available(self.device.type)
        if not usable:
            log.warning("the fast CUDA decode path is off: %s; decoding eagerly", why)
            return None, f"eager ({why})"
        from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import Unsupported
        from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import batch_buckets, row_limit, with_verify_buckets

        try:
            limit = row_limit(self.engine, self.executor.world_size)
            buckets = batch_buckets(self.max_batch_size, sizes, limit)
            decode_buckets = buckets
            if spec_k and self.executor.world_size == 1:
                buckets = with_verify_buckets(buckets, self.max_batch_size, spec_k, limit)
            decoder = self._prepared_decoder(buckets, graphs, limit)
            if spec_k and self.executor.world_size == 1 and hasattr(decoder, "verify_requests"):
                decoder.verify_requests(spec_k, decode_buckets)  # (each verify step attends as its decode batch)
            if spec_k and hasattr(decoder, "prepare_verify"):  # every verify graph now, not inside generation
                if self.tree_verify and getattr(decoder, "tree_tokens", 0):
                    decoder.prepare_verify(trees=True)  # (the tree steps' graphs too)
                else:
                    decoder.prepare_verify()
        except Unsupported as exc:
            log.warning("the fast CUDA decode path cannot run this engine: %s; decoding eagerly", exc)
            return None, f"eager ({exc})"
        except Exception as exc:  # a kernel that does not compile for this shape: serve eagerly, and say so loudly
            # or a launch past the GPU's shared memory (tiles are fitted to it: quant_gemm.fit; this is the net)
            if type(exc).__name__ not in ("CompilationError", "OutOfResources", "SharedMemoryExceeded"):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.error("a fast-path kernel did not compile or launch for this engine (%s); decoding eagerly. Please "
                      "report it with the engine's config.json", first)
            return None, f"eager (a fast-path kernel did not compile or launch: {first})"
        kind = "CUDA graphs" if decoder.use_graphs else "direct launches"
        ranks = f", {self.executor.world_size} ranks" if self.executor.world_size > 1 else ""
        return decoder, (f"triton kernels, {kind} for batches {decoder.buckets}{ranks}, ready in "
                         f"{decoder.setup_seconds:.1f} s")

    def _prepared_decoder(self, buckets: list[int], graphs: bool, limit: int):
        """The executor's fast decoder over ``buckets``, and on one CUDA device ``fast_prefill_buckets(limit)`` too
        (short prompts' rows, ``_split``); where those larger steps cannot be prepared for this engine (a kernel's
        tile past the device's shared memory, memory), the default ones (``FAST_PREFILL_BUCKETS``' first two), else
        the decode buckets alone, said in the log."""
        if not (self.executor.world_size == 1 and self.device.type == "cuda" and fast_prefill_enabled()):
            return self.executor.fast_decoder(buckets, graphs)
        wanted = fast_prefill_buckets(limit)
        for prefill in dict.fromkeys((wanted, wanted[:2])):  # (the same tuple once where they agree)
            extra = sorted(set(prefill) - set(buckets))
            # the verify steps a short prompt's rows take: those buckets, and past them the largest (a loaded
            # engine's prompt beside hundreds of decodes), captured now, not in the first served request's step
            verify = sorted(set(prefill) | {b for b in buckets[-1:] if b > max(prefill)})
            try:
                decoder = self.executor.fast_decoder(sorted(buckets + extra), graphs)
                decoder.prepare_verify(verify)
                return decoder
            except Exception as exc:  # noqa: BLE001 - any failure of the extra buckets: fewer, and say so
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                log.warning("the fast path cannot take %s rows a step for this engine (%s: %s)",
                            sorted(set(extra) | set(verify)), type(exc).__name__, first)
                torch.cuda.empty_cache()
        log.warning("short prompts prefill eagerly")
        return self.executor.fast_decoder(buckets, graphs)

    def _prefill_graphs(self):
        """Prompts' first prefill chunks from CUDA graphs (``cuda/prefill_graphs``), on one CUDA device whose
        eager forward runs the fused layers, unless ``TRTLLM_PIPELINE_PREFILL_GRAPHS=0``; None where they cannot be
        captured (said in the log: the eager forward runs them)."""
        if not (self.device.type == "cuda" and self.executor.world_size == 1 and self.engine.fused()
                and prefill_graphs_enabled() and not self.batch_invariant):
            return None
        from trtllm_pipeline.runtimes.torch_engine.cuda.prefill_graphs import PrefillGraphs, buckets_for

        chunk = min(self.prefill_chunk_tokens, self.scheduler.max_num_tokens)
        buckets = [b for b in buckets_for(chunk) if b <= self.max_seq_len]
        if not buckets:
            return None
        return self._captured(lambda: PrefillGraphs(self.engine, buckets), "prefill graphs",
                              "first chunks prefill eagerly")

    def _row_graphs(self):
        """``runtime.batch_invariant``'s steps of single-token rows from CUDA graphs of the eager forward
        (``cuda/row_graphs``), on one CUDA device unless ``TRTLLM_PIPELINE_INVARIANT_GRAPHS=0``; None where they cannot
        be captured (said in the log: those steps run eagerly, with the same numbers)."""
        if not (self.batch_invariant and self.device.type == "cuda" and invariant_graphs_enabled()):
            return None
        from trtllm_pipeline.runtimes.torch_engine.cuda.row_graphs import RowGraphs

        return self._captured(lambda: RowGraphs(self.engine, self.max_batch_size), "batch-invariant decode graphs",
                              "decode steps run eagerly")

    @staticmethod
    def _captured(make, what: str, instead: str):
        """``make()``'s graphs, prepared (run once, captured); None where that fails, said in the log with what runs
        ``instead``: graphs are speed only, the eager forward computes the same."""
        try:
            graphs = make()
            graphs.prepare()
            return graphs
        except Exception as exc:  # noqa: BLE001 - speed only
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.warning("%s could not be captured (%s: %s); %s", what, type(exc).__name__, first, instead)
            torch.cuda.empty_cache()
            return None

    def _speculator(self, settings):
        """Speculative decoding as configured (``speculative/``), or None. Verify rows run on the CUDA fast path
        where it runs with one rank (``DecodeGraphs.verify``), else through the eager model."""
        if settings is None or settings.method == "none":
            return None
        from trtllm_pipeline.runtimes.torch_engine.speculative.registry import make_proposer
        from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

        tree = getattr(settings, "tree", None)
        self.tree_verify = tree is not None and self.executor.trees
        self.tree_nodes = tree.max_nodes if tree is not None else 0
        if tree is not None and not self.tree_verify:
            log.warning("speculative decoding: tree drafts cannot cross to tensor-parallel ranks; each request drafts "
                        "its tree's most frequent path instead")
        k = settings.num_draft_tokens if tree is None else tree.max_depth  # a tree's depth is its k
        return Speculator(make_proposer(settings, self), k, adaptive=settings.adaptive)

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg, manifest: dict, device: str | None = None,
                    tp_mode: str | None = None) -> "TorchRuntime":
        ckpt = (Path(engine_dir) / manifest["checkpoint"]["dir"]).resolve()
        rt = cfg.runtime
        dtype = rt.compute_dtype
        if dtype == "auto":
            dtype = None if resolve_device(device or rt.device).type == "cuda" else "float32"
        if rt.kernel_cache_dir:  # where Triton keeps compiled kernels between processes
            os.environ.setdefault("TRITON_CACHE_DIR", str(Path(rt.kernel_cache_dir).expanduser()))
        return cls(ckpt, artifacts.checkpoint_tokenizer(ckpt), device=device or rt.device,
                   max_batch_size=cfg.build.max_batch_size, max_seq_len=cfg.build.max_seq_len,
                   max_input_len=cfg.build.max_input_len, dtype=dtype, fast_decode=rt.fast_decode,
                   cuda_graphs=rt.cuda_graphs, graph_batch_sizes=rt.graph_batch_sizes,
                   prefill_chunk_tokens=rt.prefill_chunk_tokens, tp_mode=tp_mode or rt.tp_mode,
                   max_num_tokens=cfg.build.max_num_tokens, kv_block_size=rt.kv_block_size,
                   kv_cache_blocks=rt.kv_cache_blocks, kv_cache_free_gpu_mem_fraction=rt.kv_cache_free_gpu_mem_fraction,
                   enable_kv_cache_reuse=rt.enable_kv_cache_reuse, speculative=rt.speculative,
                   batch_invariant=rt.batch_invariant)

    def describe(self) -> dict[str, Any]:
        layout = checkpoint.CheckpointLayout(self.config)
        first = self.engine.layers[0]["dense"]
        ranks = self.executor.ranks()
        gemm = None
        if first.fp8:
            gemm = "torch._scaled_mm (FP8 tensor cores)" if first.scaled_mm else "emulated (FP8 values, compute-dtype matmul)"
            if first.fast_accum:
                gemm = "torch._scaled_mm (FP8 tensor cores, fast accumulation)"
            if first.invariant:
                gemm = "cuda/invariant_gemm (FP8 tensor cores, one tile shape)"
        return {
            "weight_format": self.engine.format,
            "linear": first.describe(),
            "emulated": first.format != "none" and not first.scaled_mm,
            "runtime": self.name,
            "device": str(self.device) + (f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""),
            "dtype": str(self.engine.dtype).removeprefix("torch."),
            "quant_algo": layout.quant_algo,
            "kv_cache_quant_algo": layout.kv_cache_quant_algo,
            "kv_cache_dtype": str(self.engine.kv_dtype).removeprefix("torch."),
            "prefill_chunk_tokens": self.prefill_chunk_tokens,
            "max_batch_size": self.max_batch_size,
            "fp8_gemm": gemm,
            "checkpoint_tp": layout.tp,
            "tp_mode": self.tp_mode,
            "world_size": self.executor.world_size,
            **({"tp_notice": self.tp_notice} if self.tp_notice else {}),
            "decode_path": self.decode_path,
            "batch_invariant": self.batch_invariant,
            # What a step reads over every rank: the fast path's packed weights where it runs, else the
            # eager model's (replicated KV heads are read by each rank holding them).
            "weight_bytes": (self.decoder.weight_bytes() if self.decoder is not None
                             else sum(r["weight_bytes"] for r in ranks)),
            "kv_bytes_per_token": sum(r["kv_bytes_per_token"] for r in ranks),
            "kv_pool": {"blocks": self.kv.usable_blocks, "block_size": self.kv.block_size,
                        "tokens": self.kv.usable_blocks * self.kv.block_size,
                        "prefix_cache": self.kv.enable_prefix_cache},
            "ranks": ranks,
            "speculative": self._spec_description(),
            "torch": torch.__version__,
        }

    def _spec_description(self) -> str:
        sp = self.speculator
        if sp is None:
            return "off"
        where = "on the fast path" if hasattr(self.decoder, "verify") else "eagerly"
        trees = f", trees of up to {self.tree_nodes} nodes verified {where if self._fast_trees() else 'eagerly'}" \
            if self.tree_verify else ""
        device = "; greedy requests draft on the device, their verify steps chained" if self.device_drafting else ""
        return (f"{sp.proposer.name}, up to {sp.k} drafts{' (adaptive)' if sp.adaptive else ''}, verified {where}"
                f"{trees}{device}")

    @property
    def processes(self) -> list[int]:
        """The process ids running this runtime's ranks (this one first)."""
        return [r["pid"] for r in self.executor.ranks()]

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (the runtime cannot run afterwards)."""
        if getattr(self, "speculator", None) is not None:
            self.speculator.close()
        self.executor.close()

    def unavailable(self) -> str | None:
        failure = self.executor.failure
        return None if failure is None else f"{failure.message} ({failure.fix})"

    # ---- requests -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Requests running and waiting, the KV pool's ``kv_stats`` (usage 0..1, prefix-cache tokens queried and
        hit, preemptions), and the steps' totals: chained, tokens through the eager model, prefill chunks on the fast
        path, host seconds in eager forwards (a plain dict: the metrics endpoint reads it)."""
        n = self.phase_rows
        # where the steps' time went (totals since load): what a served load's ITL and TTFT are read against
        steps = {"steps_chained": n["chained_steps"], "eager_tokens": n["eager_tokens"],
                 "fast_prefill_chunks": n["fast_prefill_rows"], "graph_prefills": n["graph_prefills"],
                 "eager_seconds": round(self.phase_s["eager"], 6)}
        return {"requests_running": len(self.scheduler.running), "requests_waiting": len(self.scheduler.waiting),
                **self.kv.stats(), **steps, **(self.speculator.stats() if self.speculator is not None else {})}

    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        if self.executor.failure is not None:  # the tensor-parallel group is gone: say so, at once
            raise self.executor.failure
        params.check()
        prompt = [int(t) for t in prompt_ids]
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already active")
        if not prompt:
            raise InputError("the prompt is empty.", fix="send at least one token")
        if len(prompt) > self.max_input_len:
            raise InputError(f"the prompt has {len(prompt)} tokens; this engine takes at most {self.max_input_len}.",
                             fix="shorten the prompt or rebuild with a larger build.max_input_len")
        if bad := [t for t in prompt if not 0 <= t < self.vocab_size]:
            raise InputError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1}).")
        if params.end_id is not None and params.end_id >= self.vocab_size:
            raise InputError(f"end_id {params.end_id} is outside the vocabulary (0..{self.vocab_size - 1}, or -1).")
        # Its longest life: prompt + max_tokens, cut at max_seq_len (it ends with "length" there).
        longest = min(len(prompt) + params.max_tokens, self.max_seq_len)
        if not self.kv.fits_ever(longest):
            raise InputError(f"the request needs up to {longest} tokens of KV cache; the whole pool holds "
                             f"{self.kv.usable_blocks * self.kv.block_size} ({self.kv.usable_blocks} blocks of "
                             f"{self.kv.block_size}).",
                             fix="lower max_tokens or shorten the prompt, or give the pool more memory "
                                 "(runtime.kv_cache_free_gpu_mem_fraction, runtime.kv_cache_blocks)")
        end_id = self.tokenizer.eos_token_id if params.end_id is None else params.end_id
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        bad_ids = [ids for ids in (self.tokenizer.encode(w, add_special_tokens=False) for w in params.bad_words) if ids]
        req = _Request(request_id, prompt, params=params, end_id=end_id, generator=gen, bad_ids=bad_ids)
        self._requests[request_id] = req
        self.scheduler.add(req)

    def cancel(self, request_id: Any) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            self._finish(req)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[TokenEvent]:
        """Plan the step (``scheduler``), run its rows: decodes on the fast path where it runs, the rest (prefill
        chunks; every row without the fast path) through the eager model, in one forward. A request whose part of
        the step fails is dropped with an ``error`` event and the step goes on for the others (``_isolated``)."""
        t0 = time.perf_counter()
        launched, events = self._launched, []
        try:
            # the step still running: its tokens taken as known (``_pend``) if the next one may chain on it, else
            # read now, before anything reads the requests
            chained = launched is not None and launched.chainable and self._pend(launched)
            if chained:
                self._launched = None  # (``_chain`` launches the next one)
            else:
                events = self._settle_launched()
        except ExecutorLost as exc:
            return self._fail_everything(exc)
        ts = time.perf_counter()
        # (chained: the pending requests were launched on as drafting nothing this step, ``Speculator.drafts_next``;
        # their budgets tick on, and only requests whose tokens are known may propose)
        self._propose()
        plan = self.scheduler.schedule()
        if self.decoder is not None and plan.preempted:  # their tables go; they are recomputed eagerly first
            self.decoder.release(plan.preempted)
            self._untrack(plan.preempted)  # (their histories on the device go with their table rows)
        fast, eager = self._split(plan.rows)
        t1 = time.perf_counter()
        early, late = None, 0.0  # eager rows launched before the running step's tokens are read, and their settling
        try:
            if chained:
                if self._chain(fast, eager, launched):  # launched on the device's tokens: then the previous ones
                    events = self._settle_pending(launched)
                    self._count(fast, eager, t0, ts, t1, t1)
                    return events
                early = self._launch_eager_early(eager)
                events = self._settle_pending(launched)  # a step that cannot chain: it waits for them
                fast = self._known(fast)
                eager = eager if early is not None else self._known(eager)
            if early is None:
                events += self._isolated(self._run_eager, eager)
            t2 = time.perf_counter()
            if self._may_leave_running(fast):
                events += self._launch_fast(fast)
            else:
                events += self._isolated(self._run_fast, fast)
            if early is not None:  # (their sampling waits for their forward; the fast rows queued behind it)
                t4 = time.perf_counter()
                events += self._settle_early(eager, early)
                late = time.perf_counter() - t4
        except ExecutorLost as exc:  # no request can go on: each ends with the reason
            return self._fail_everything(exc)
        self._count(fast, eager, t0, ts, t1, t2, late)
        return events

    def _count(self, fast: list[PlanRow], eager: list[PlanRow], t0: float, ts: float, t1: float, t2: float,
               late: float = 0.0) -> None:
        """A step's host seconds by phase (``phase_times``) and its rows by kind (``late``: eager rows' settling
        after the fast rows' launch, an eager phase's)."""
        t3 = time.perf_counter()
        ph, n = self.phase_s, self.phase_rows
        ph["plan"] += t1 - ts
        ph["eager"] += t2 - t1 + late
        ph["fast"] += t3 - t2 + ts - t0 - late
        n["steps"] += 1
        n["eager_rows"] += len(eager)
        n["eager_tokens"] += sum(len(r.tokens) for r in eager)
        n["fast_rows"] += len(fast)
        n["fast_prefill_rows"] += sum(1 for r in fast if not r.is_decode and not r.draft)

    def phase_times(self) -> dict[str, float]:
        """Totals since start: host seconds in planning (drafts, schedule, split), in the eager rows (prefill
        chunks; their sampling, which waits for the device) and in the fast-path rows (launch, then the wait for
        the tokens), and the steps and rows they covered. Differences of two readings time a stretch of load."""
        return {**{f"{k}_s": v for k, v in self.phase_s.items()}, **self.phase_rows}

    def _propose(self) -> None:
        """Drafts for the decoding requests that may speculate (``Sequence.draft``), each within what it may still
        emit. Requests with banned tokens (min_tokens' end id, bad words) speculate too: verification applies at
        each position the bans plain decoding would (``_verify``)."""
        sp = self.speculator
        if sp is None or not sp.enabled:
            return
        from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import DraftRequest
        from trtllm_pipeline.runtimes.torch_engine.speculative.tree import DraftTree

        asks, seqs = [], []
        for req in self.scheduler.running:
            req.draft, req.draft_parents = [], None
            if not req.decoding:
                continue
            room = min(req.params.max_tokens - len(req.generated), self.max_seq_len - req.length) - 1
            k = min(room, sp.budget(req.request_id)) if room > 0 else 0
            pending = req.generated[-1] == PENDING
            if self._drafts_for(req, k, pending):  # drafted on the device (``device_drafting``)
                continue
            if k > 0 and not pending:  # (pending: launched on as drafting nothing; never from it)
                asks.append(DraftRequest(req.request_id, req.prompt, req.generated, k))
                seqs.append(req)
        for req, ask, drafts in zip(seqs, asks, sp.propose(asks)):
            if isinstance(drafts, DraftTree):
                self._take_tree(req, drafts, ask.k)
            else:
                req.draft = [int(t) for t in drafts[: ask.k]]
            if not req.draft:
                sp.found_nothing(req.request_id)

    def _take_tree(self, req: _Request, tree, k: int) -> None:
        """A proposed tree as ``req``'s drafts, at most ``k`` deep. A greedy request verifies it where the executor
        can, cut to as many nodes as a chain could have drafts (its nodes take cache positions one after another,
        so the row never passes max_seq_len nor needs more blocks than the request's longest life); a sampled
        request (the rejection rule here is a chain's) and the rest take its most frequent path. A chain is a linear
        row."""
        tree = tree.limited(k)
        room = min(req.params.max_tokens - len(req.generated), self.max_seq_len - req.length) - 1
        if self.tree_verify and req.params.greedy and not tree.is_chain():
            tree = tree.truncated(room)
            req.draft, req.draft_parents = [int(t) for t in tree.tokens], list(tree.parents)
        else:
            req.draft = [int(t) for t in tree.chain()[:k]]

    def _fast_trees(self) -> int:
        """The longest tree verify row the fast path's verify step takes (``DecodeGraphs.verify``'s ``parents``;
        ``graphs.TREE_TOKENS``), 0 where it takes none (no fast path, tensor parallel, ``fast_trees_enabled`` off)."""
        return getattr(self.decoder, "tree_tokens", 0) if fast_trees_enabled() else 0

    def _split(self, rows: list[PlanRow]) -> tuple[list[PlanRow], list[PlanRow]]:
        """Rows for the fast path and for the eager model. Fast: decodes, then, where the decoder verifies (one
        rank), verify rows and short prefill chunks, as long as all their tokens fit its largest batch: a chunk's
        tokens are rows of one step there, as a verify row's are (``DecodeGraphs.verify``), so a short prompt costs
        one graph replay instead of an eager forward whose launches take ~27 ms of host time whatever its length
        (H200, random 7B: the served c=32 load spent half its time in 128-token prefills). Eager: the rest (long
        chunks, and decodes past the largest batch). Unless ``TRTLLM_PIPELINE_PREFILL_WAIT=0``, a short chunk with no
        room left beside another on the fast path waits for the next step (planned again then: nothing ran or
        advanced) instead of an eager forward: a wave of short prompts then prefills as a few full fast steps, the
        first prompts' first tokens early, instead of all of them after one eager forward. A tree verify row goes to
        the fast path where its verify step takes trees (``_fast_trees``) and the row is no longer than it takes."""
        if self.decoder is None:
            return [], list(rows)
        largest = self.decoder.buckets[-1]
        room = largest if hasattr(self.decoder, "verify") else 0
        prefill = fast_prefill_enabled()
        wait = prefill and room > 0 and prefill_wait_enabled()
        fast, eager = [], []
        decodes = min(largest, sum(1 for r in rows if r.is_decode and r.sample))
        room -= decodes
        chunks = 0  # prefill chunks on the fast path this step
        trees = self._fast_trees()
        for row in rows:
            short = prefill and not row.is_decode and not row.draft
            if row.is_decode and row.sample and decodes:
                fast.append(row)
                decodes -= 1
            elif (row.draft or short) and (row.parents is None or len(row.tokens) <= trees) and \
                    len(row.tokens) <= room:
                fast.append(row)
                room -= len(row.tokens)
                chunks += short
            elif wait and short and chunks and len(row.tokens) <= largest:
                continue  # the next step's (see above)
            else:
                eager.append(row)
        return fast, eager

    def _fail_everything(self, exc: ExecutorLost) -> list[TokenEvent]:
        reqs = list(self._requests.values())
        for req in reqs:
            self._finish(req)
        return [TokenEvent(r.request_id, [], "error", error=f"{exc.message} ({exc.fix})") for r in reqs]

    def _isolated(self, phase, rows: list[PlanRow]) -> list[TokenEvent]:
        """``phase(rows)``; when it raises, the same phase once per row, so that only the requests that fail on
        their own are dropped. Phases change no state until they have succeeded."""
        if not rows:
            return []
        try:
            return phase(rows)
        except ExecutorLost:
            raise
        except Exception as exc:
            if len(rows) == 1:
                return [self._failed(self._requests[rows[0].request_id], exc)]
            # where it raised: an assertion's message is often empty (H100 2026-12-07: "AssertionError: " alone)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            log.warning("torch runtime: a %s step of %d rows failed (%s: %s, at %s:%d); retrying them one by one",
                        phase.__name__.strip("_"), len(rows), type(exc).__name__, exc, Path(where.filename).name,
                        where.lineno)
        events: list[TokenEvent] = []
        for row in rows:
            try:
                events += phase([row])
            except ExecutorLost:
                raise
            except Exception as exc:
                events.append(self._failed(self._requests[row.request_id], exc))
        return events

    def _failed(self, req: _Request, exc: Exception) -> TokenEvent:
        log.error("torch runtime: request %r failed and was dropped: %s: %s", req.request_id, type(exc).__name__, exc,
                  exc_info=not isinstance(exc, InputError))
        self._finish(req)
        message = exc.message if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        return TokenEvent(req.request_id, [], "error", error=message)

    def _run_eager(self, rows: list[PlanRow]) -> list[TokenEvent]:
        """The rows through the eager model in one forward; logits at each sampling row's last token, and at every
        position of a verify row's (``_settle``)."""
        return self._settle(rows, self._eager_logits(rows))

    def _eager_logits(self, rows: list[PlanRow]) -> torch.Tensor | None:
        """The rows' forward and the logits ``_settle`` reads (launched: nothing here waits for the device on a graph's
        first chunks)."""
        self._untrack(r.request_id for r in rows)  # (a tracked request's history on the device misses this step)
        hidden = self._forward(rows)
        last = list(itertools.accumulate(len(r.tokens) for r in rows))  # each row's last token, packed index + 1
        index = [p for r, end in zip(rows, last) for p in range(end - logit_span(r), end)]
        # (a view where the positions are one run, as a lone request's are: no index tensor made, no gather)
        return self.executor.logits(rows_at(hidden, index)) if index else None

    def _settle(self, rows: list[PlanRow], logits: torch.Tensor | None,
                greedy: torch.Tensor | None = None, device: dict | None = None) -> list[TokenEvent]:
        """The step ran: ``logits`` holds each row's ``logit_span`` positions, packed in row order (``greedy``: their
        argmax, where the step computed it). Sampling rows get their next token, verify rows their accepted drafts
        and one token (``_verify``); then the cache counts what was kept and the tokens are recorded. ``device``: the
        tracked rows' results by request (``_device_results``), which settle from those (``_settle_tracked``)."""
        device = device or {}
        spans = list(itertools.accumulate((logit_span(r) for r in rows), initial=0))
        reqs = [self._requests[r.request_id] for r in rows]
        sampled = [i for i, r in enumerate(rows) if r.sample and not r.draft and r.request_id not in device]
        verify = [i for i, r in enumerate(rows) if r.draft and r.request_id not in device]
        tokens = []
        if sampled:
            at = [spans[i] for i in sampled]
            tokens = self._sample([reqs[i] for i in sampled], rows_at(logits, at), rows_at(greedy, at))
        emitted = []
        if verify:
            at = [p for i in verify for p in range(spans[i], spans[i + 1])]
            emitted = self._verify([rows[i] for i in verify], [reqs[i] for i in verify], rows_at(logits, at),
                                   rows_at(greedy, at))
        for row, req in zip(rows, reqs):  # the step succeeded: now it counts (verify rows: as they are recorded)
            if not row.draft and row.request_id not in device:
                self.scheduler.advance(req, len(row.tokens))
        events = self._record_all([reqs[i] for i in sampled], tokens)
        for i, out in zip(verify, emitted):
            events.append(self._record_verified(rows[i], reqs[i], out))
        for row, req in zip(rows, reqs):
            if row.request_id in device:
                events.append(self._settle_tracked(row, req, device[row.request_id], pended=False))
        return events

    def _verify(self, rows: list[PlanRow], reqs: list[_Request], logits: torch.Tensor,
                greedy: torch.Tensor | None) -> list[list[int]]:
        """Each verify row's emitted tokens (``speculative.acceptance``): its accepted drafts and one token of the
        target's; ``logits``: the rows' 1 + draft positions, packed (``greedy``: their argmax, if known, bans not
        applied). At each position the target's choice is plain decoding's there: the same bans (``_Request.banned``
        with the row's earlier drafts as generated: the end id while fewer than min_tokens, bad words completed by
        the drafts) masked out before the argmax (greedy) or ``filtered_probs`` (the rejection rule), so a banned
        draft is never kept and the token after the kept ones is never a banned one."""
        from trtllm_pipeline.runtimes.torch_engine.speculative import acceptance

        spans = list(itertools.accumulate((1 + r.draft for r in rows), initial=0))
        # the tokens banned at each position: plain decoding's there, its earlier drafts (a tree's: its ancestors)
        # taken as generated
        bans = [[req.banned(ahead) for ahead in _drafts_before(row)] if req.may_ban() else None
                for row, req in zip(rows, reqs)]
        argmax = []
        if any(req.params.greedy for req in reqs):  # one host read for every greedy row
            chosen = greedy if greedy is not None else logits.argmax(-1)
            # positions with bans: the argmax over their masked logits (the fast path's in-step argmax ignores
            # bans), as plain sampling takes it
            masked = [(spans[i] + j, b) for i, req in enumerate(reqs) if req.params.greedy and bans[i]
                      for j, b in enumerate(bans[i]) if b]
            if masked:
                at = torch.tensor([p for p, _ in masked], device=logits.device)
                chosen = chosen.clone()
                # logits[at] is a copy already: banned in place
                chosen[at] = sampling.ban(logits[at], [b for _, b in masked], inplace=True).argmax(-1)
            argmax = chosen.tolist()
        out = []
        for i, (row, req) in enumerate(zip(rows, reqs)):
            drafts = row.tokens[1:]
            if row.parents is not None:  # (only greedy requests verify trees: ``_take_tree``)
                out.append(acceptance.accept_tree_greedy(argmax[spans[i] : spans[i + 1]], row.tokens, row.parents))
            elif req.params.greedy:
                out.append(acceptance.accept_greedy(argmax[spans[i] : spans[i + 1]], drafts))
            else:
                span = logits[spans[i] : spans[i + 1]]
                probs = sampling.filtered_probs(span if bans[i] is None else sampling.ban(span, bans[i]),
                                                [req.params] * (1 + row.draft))
                out.append(acceptance.accept_sampled(probs, drafts, req.generator))
        return out

    def _record_verified(self, row: PlanRow, req: _Request, tokens: list[int]) -> TokenEvent:
        """A verify row's tokens recorded one by one (the request may end at any); the cache keeps the row's
        tokens up to the last accepted draft, the rest rolled back (a tree's accepted path moved into place first)."""
        accepted = len(tokens) - 1
        depth = None if row.parents is None else max(row_depths(row.parents))
        self.speculator.verified(req.request_id, row.draft, accepted, depth)
        event = self._record_run(req, tokens)
        if event.finish_reason:
            return event
        if row.parents is not None:
            self._move_path(row, tokens[:-1])
        self.scheduler.verified(req, 1 + accepted)
        return event

    def _move_path(self, row: PlanRow, kept: list[int]) -> None:
        """A tree row's kept drafts' K/V (written at their row indices) moved to the positions right after the row's
        first token, where the cache keeps them (nothing to move where the path is the row's first nodes)."""
        from trtllm_pipeline.runtimes.torch_engine.speculative.acceptance import tree_path

        path = tree_path(row.tokens, row.parents, kept)
        if path != list(range(1, len(path) + 1)):
            self.executor.move_kv(row.block_table, [row.start + j for j in path],
                                  [row.start + 1 + d for d in range(len(path))])

    def _run_fast(self, rows: list[PlanRow]) -> list[TokenEvent]:
        """The rows on the CUDA fast path: a decode step, or, when some rows carry drafts, a verify step (every
        row's tokens as rows of one step, ``DecodeGraphs.verify``)."""
        args = ([r.tokens for r in rows], [r.block_table for r in rows], [r.start for r in rows],
                [r.request_id for r in rows])
        tracked = self._tracked(rows, [self._requests[r.request_id] for r in rows])
        given = {"tracked": tracked} if tracked else {}
        if any(not r.is_decode for r in rows):  # drafts or prefill chunks: logits at each row's ``logit_span`` only
            trees = [r.parents for r in rows]  # (tree rows: a tree step, ``DecodeGraphs.verify``)
            tree = any(p is not None for p in trees)
            logits, greedy = self.decoder.verify(*args, **({"parents": trees} if tree else {}), **given)
            ends = itertools.accumulate(len(r.tokens) for r in rows)
            index = [p for r, end in zip(rows, ends) for p in range(end - logit_span(r), end)]
            if len(index) != logits.shape[0]:
                logits, greedy = rows_at(logits, index), rows_at(greedy, index)
        else:
            logits = self.decoder.decode([t[0] for t in args[0]], *args[1:], **given)
            greedy = self.decoder.greedy(len(rows))
        device = self._device_results(rows, tracked, self.decoder.drafts_posted() if tracked else None)
        return self._settle(rows, logits, greedy, device)

    def _sample(self, reqs: list[_Request], logits: torch.Tensor,
                greedy: torch.Tensor | None = None) -> list[int | Exception]:
        """One token per request, sampled as one batch; if that raises, row by row (with the seeded rows'
        generators rewound first), so that only a row that cannot be sampled gets its exception."""
        rows = [sampling.Row(r.params, r.banned(), r.generator) for r in reqs]
        seeded = {i: r.generator.get_state() for i, r in enumerate(reqs) if r.generator is not None and
                  r.params.seed is not None}
        try:
            return list(sampling.sample(logits, rows, greedy))
        except Exception as exc:
            log.warning("torch runtime: sampling %d rows failed (%s: %s); sampling them one by one",
                        len(rows), type(exc).__name__, exc)
        out: list[int | Exception] = []
        for i, row in enumerate(rows):
            if i in seeded:
                row.generator.set_state(seeded[i])
            try:
                out.append(sampling.sample(logits[i : i + 1], [row])[0])
            except Exception as exc:
                out.append(exc)
        return out

    def _record_all(self, reqs: list[_Request], tokens: list[int | Exception]) -> list[TokenEvent]:
        return [self._failed(req, token) if isinstance(token, Exception) else self._record(req, token)
                for req, token in zip(reqs, tokens)]

    def _record_run(self, req: _Request, tokens: list[int]) -> TokenEvent:
        """Several tokens of one step recorded one by one, as one event: up to the one that ends the request, if any
        does (its ``finish_reason`` then set)."""
        emitted: list[int] = []
        for token in tokens:
            event = self._record(req, token)
            emitted += event.token_ids
            if event.finish_reason:
                return TokenEvent(req.request_id, emitted, event.finish_reason)
        return TokenEvent(req.request_id, emitted)

    def _record(self, req: _Request, token: int) -> TokenEvent:
        p = req.params
        if token == req.end_id and len(req.generated) >= p.min_tokens:
            self._finish(req)
            return TokenEvent(req.request_id, [], "end_id")
        req.generated.append(token)
        if len(req.generated) >= p.max_tokens or req.length >= self.max_seq_len:
            self._finish(req)
            return TokenEvent(req.request_id, [token], "length")
        return TokenEvent(req.request_id, [token])

    def _finish(self, req: _Request) -> None:
        self.scheduler.finish(req)
        if self.speculator is not None:
            self.speculator.release(req.request_id)
        if self.decoder is not None:
            self.decoder.release([req.request_id])
        self._requests.pop(req.request_id, None)

    def _forward(self, rows: list[PlanRow]) -> torch.Tensor:
        """Hidden states [N, hidden] of the rows' tokens, packed in row order: prompts' first chunks (every row's) from
        a prefill graph where one holds them (``_prefill_graphs``), else the eager forward."""
        end = max(r.start + len(r.tokens) for r in rows)
        if end > self.max_seq_len:
            raise InputError(f"a sequence of {end} tokens exceeds this engine's max_seq_len {self.max_seq_len}.")
        graphs = self.prefill_graphs
        if graphs is not None and all(r.start == 0 and r.parents is None for r in rows) and \
                graphs.shape_for([len(r.tokens) for r in rows]):
            self.phase_rows["graph_prefills"] += len(rows)
            return graphs.forward([(r.tokens, r.block_table) for r in rows])
        decodes = self.row_graphs
        if decodes is not None and len(rows) <= decodes.max_rows and all(len(r.tokens) == 1 for r in rows):
            return decodes.forward([(r.tokens[0], r.start, r.block_table) for r in rows])
        return self.executor.forward(PagedBatch.of(rows))
