"""The torch runtime's switches: environment variables that turn one of its speed paths off, each the A/B of a GPU
measurement (``benchmarks/h200_run.sh``), and the fast path's prefill buckets they bound. Read when an engine loads
(or a step is split), so a test or a benchmark sets them before it loads one.
"""

from __future__ import annotations

import os

from trtllm_pipeline.errors import InputError


# The fast path's batch buckets past the decode ones for short prefill chunks (``_split``): a 128-token prompt, 256
# rows (``graphs.MAX_FAST_ROWS``: a short prompt beside the running decodes), and where the engine's steps take more
# rows (``graphs.row_limit``: BF16 and FP8 on one GPU, up to 1,024) a wave of short prompts in one step. Past the
# largest, prompts prefill in an eager forward, whose launches cost ~27 ms of host time whatever its length (H200,
# random 7B FP8 served at c=64, 2026-12-05: 38% of the engine loop's samples were eager prefills of waves of
# 128-token prompts); a 1,024-row step is one graph replay, ~16 ms of FP8 compute for 1,024 of the 7B's tokens.
FAST_PREFILL_BUCKETS = (128, 256, 512, 1024)


def fast_prefill_buckets(limit: int) -> tuple[int, ...]:
    """``FAST_PREFILL_BUCKETS`` up to ``limit`` rows (``graphs.row_limit``), or up to
    ``TRTLLM_PIPELINE_FAST_PREFILL_ROWS`` where that is smaller (256: the buckets before waves fitted, the A/B of
    ``benchmarks/h200_run.sh``)."""
    top = limit
    given = os.environ.get("TRTLLM_PIPELINE_FAST_PREFILL_ROWS", "").strip()
    if given:
        try:
            top = min(limit, int(given))
        except ValueError:
            raise InputError(f"TRTLLM_PIPELINE_FAST_PREFILL_ROWS={given!r} is not a number of rows.",
                             fix="set it to 256, 512 or 1024, or unset it") from None
    return tuple(b for b in FAST_PREFILL_BUCKETS if b <= top) or FAST_PREFILL_BUCKETS[:1]


def fast_prefill_enabled() -> bool:
    """Short prefill chunks on the fast path (``_split``): on unless ``TRTLLM_PIPELINE_FAST_PREFILL=0`` (the eager
    forward then takes every chunk: the A/B of ``benchmarks/h200_run.sh``)."""
    return os.environ.get("TRTLLM_PIPELINE_FAST_PREFILL", "1").strip() != "0"


def fast_trees_enabled() -> bool:
    """Tree verify rows on the fast path's verify step where it takes them (``_split``): on unless
    ``TRTLLM_PIPELINE_FAST_TREES=0`` (they verify eagerly then: the A/B; not yet timed on a GPU)."""
    return os.environ.get("TRTLLM_PIPELINE_FAST_TREES", "1").strip() != "0"


def prefill_graphs_enabled() -> bool:
    """Prompts' first prefill chunks from a CUDA graph (``cuda/prefill_graphs``): on unless
    ``TRTLLM_PIPELINE_PREFILL_GRAPHS=0`` (the eager forward's host launches: the A/B)."""
    return os.environ.get("TRTLLM_PIPELINE_PREFILL_GRAPHS", "1").strip() != "0"


def warm_up_enabled() -> bool:
    """``TorchRuntime.warm_up`` at load on CUDA: on unless ``TRTLLM_PIPELINE_WARMUP=0``."""
    return os.environ.get("TRTLLM_PIPELINE_WARMUP", "1").strip() != "0"


def prefill_wait_enabled() -> bool:
    """Short prefill chunks with no room on this step's fast path wait for the next one instead of an eager forward
    (``_split``): on unless ``TRTLLM_PIPELINE_PREFILL_WAIT=0``. H100 2026-12-05e, served 7B FP8 128 -> 256, warm
    server: waiting, no token went eager at any level and TTFT p50 fell at c=8/32/64 to 29/85/138 ms from 56/98/171
    (the run before it, 256-row fast steps without waiting), tokens/s 2,227/7,246/11,233 against 2,140/7,233/11,141."""
    return os.environ.get("TRTLLM_PIPELINE_PREFILL_WAIT", "1").strip() != "0"


PAGED_PREFILL_ROWS = ("later", "all", "none")


def paged_prefill_rows() -> str:
    """Which rows of an eager (fused) forward attend through ``cuda/paged_prefill``'s kernel, keys read through their
    block tables in one launch: ``later`` (the default: later chunks and single-token rows, which otherwise gather
    their blocks, repeat KV heads and run a masked SDPA; H100: a 512-token chunk after 1,536 cached 50 us a layer
    against 109), ``all`` (first chunks too, so a token's attention is the same bits however its prompt is chunked or
    cached; over a whole first chunk SDPA's flash kernel is faster: 75 against 98 us at 2,048), ``none`` (SDPA for
    every row: the A/B). ``TRTLLM_PIPELINE_PAGED_PREFILL``."""
    given = os.environ.get("TRTLLM_PIPELINE_PAGED_PREFILL", "later").strip() or "later"
    if given not in PAGED_PREFILL_ROWS:
        raise InputError(f"TRTLLM_PIPELINE_PAGED_PREFILL={given!r} names no rows.",
                         fix=f"set it to one of {', '.join(PAGED_PREFILL_ROWS)}, or unset it")
    return given


def fp8_fast_accum() -> bool:
    """cuBLAS's FP8 GEMMs (``torch._scaled_mm``: prefill, mixed steps, the fast path's library linears) keep each
    output's whole K in the tensor cores' FP8 accumulator (``use_fast_accum=True``, ~14 bits: DeepSeek-V3's report,
    3.3.2) instead of promoting it to float32 every few K blocks, when ``TRTLLM_PIPELINE_FP8_FAST_ACCUM=1``. The
    FP8 GEMMs of TensorRT-LLM's and vLLM's Hopper paths accumulate so: TensorRT-LLM's PyTorch backend (trtllm-bench's
    default since 1.0) runs an FP8 linear past 8 rows through ``torch.ops.trtllm.cublas_scaled_mm``
    (``_torch/modules/linear.py``@00bbf71e), whose ``cublas_gemm_caller(..., true)`` sets
    ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` (``cpp/tensorrt_llm/thop/cublasScaledMM.cpp``@0846822a). Off by default: on
    an H100 a 7B layer's four prefill GEMMs took 0.95-1.06x the time with it, 1.2-2.3x the error against float64
    (``benchmarks/fp8_fast_accum.py``, h100-2026-12-07e), though 2048/128 at 512 rows made 3,574 output tokens/s with
    it against 3,403 (one H100, h100-2026-12-07h): an accuracy choice left to the build. The decode step's own Triton
    FP8 kernels (``cuda/linear``) are not affected."""
    return os.environ.get("TRTLLM_PIPELINE_FP8_FAST_ACCUM", "0").strip() == "1"


def invariant_graphs_enabled() -> bool:
    """``runtime.batch_invariant``'s decode steps from CUDA graphs of the eager forward (``cuda/row_graphs``): on
    unless ``TRTLLM_PIPELINE_INVARIANT_GRAPHS=0`` (every step's host launches then: the A/B)."""
    return os.environ.get("TRTLLM_PIPELINE_INVARIANT_GRAPHS", "1").strip() != "0"


def fold_pqs_enabled() -> bool:
    """The decode step's 4/8-bit GEMMs (``quant_gemm``, batch > 1) take their input already times the AWQ pre-quant
    scale, made by the norm kernel before them, instead of multiplying each K tile by it, where
    ``TRTLLM_PIPELINE_FOLD_PQS=1``. The same product and rounding either way (the same tokens). Off by default: the
    GEMM alone went 57.7 -> 49.4 us (the INT4 GLU at M 8 without the scales in its loop, ncu, H100 2026-12-07f), but
    the step with the fold as built (the norm writing the gate's input apart, the GEMM reading a second input tile)
    was slower: INT4 batch 8 / 16 at context 2048 4.493 / 5.570 ms against 4.439 / 5.272 without (H100
    2026-12-07h, one machine)."""
    return os.environ.get("TRTLLM_PIPELINE_FOLD_PQS", "0").strip() == "1"


def tiled_weights_enabled(default: bool) -> bool:
    """The INT4 batch-1 GEMV on Hopper reads a tile-by-tile copy of each packed weight (``quant_gemv_ws.tile_weights``:
    1-2% of a step, 3 GiB more device memory at 7B) where ``TRTLLM_PIPELINE_TILED_WEIGHTS=1``; ``0``: never; unset:
    ``default`` (``quant_gemv_ws.TILED_WEIGHTS``, which the benchmarks' variants set)."""
    value = os.environ.get("TRTLLM_PIPELINE_TILED_WEIGHTS", "").strip()
    return default if value not in ("0", "1") else value == "1"
