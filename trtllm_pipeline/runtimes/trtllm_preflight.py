"""Can this machine build and run a config's TensorRT-LLM engines? Pre-flight checks and the memory estimate.

Each check is cheap and needs no TensorRT-LLM: a missing package, too few or too old GPUs, or too
little free memory cost seconds here instead of a failed build. Problems come back as
``Problem(problem, fix)`` pairs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trtllm_pipeline.errors import Problem
from trtllm_pipeline.machine import Gpu, trtllm_status
from trtllm_pipeline.machine import gpus as machine_gpus
from trtllm_pipeline.model.catalog import ModelShape
from trtllm_pipeline.model.source import known_shape
from trtllm_pipeline.runtimes.trtllm_commands import FP8_PLUGINS

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

GB = 10**9
GIB = 2**30
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
# CUDA context, TensorRT and cuBLAS workspaces, NCCL / custom all-reduce buffers: an estimate of
# what a TensorRT-LLM process holds besides weights, KV cache and activations.
RUNTIME_OVERHEAD_BYTES = 2 * GIB
FP8_MIN_SM = 89  # Ada and Hopper have FP8 tensor cores
LOW_LATENCY_SM = 90  # the CUTLASS low-latency FP8 kernels dispatch on Hopper only


# --------------------------------------------------------------------------- memory


def estimate_memory(cfg: "BuildConfig", shape: ModelShape) -> dict[str, Any]:
    """Bytes per GPU of one rank: weights (by dtype and quant format), KV cache, activations, overhead.

    Weights follow the TensorRT-LLM checkpoint the quantize stage writes: FP8 linears (1 byte)
    with per-tensor scales; embedding and lm_head stay in ``dtype`` (ModelOpt excludes lm_head)
    and are sharded over TP (``use_parallel_embedding``, vocabulary padded to a multiple of TP);
    KV heads are replicated when TP exceeds them. The KV cache is the minimum for
    ``max_batch_size`` sequences of ``max_seq_len`` tokens (the runtime takes more:
    ``kv_cache_free_gpu_mem_fraction`` of what is free after loading).
    """
    tp, pp, b = cfg.parallelism.tp, cfg.parallelism.pp, cfg.build
    act = _DTYPE_BYTES[cfg.dtype]
    fp8 = cfg.quantization.format == "fp8"
    h, hd = shape.hidden_size, shape.head_dim
    layers = math.ceil(shape.num_hidden_layers / pp)
    q_heads, kv_heads = shape.num_attention_heads // tp, max(1, shape.num_key_value_heads // tp)
    inter = shape.intermediate_size // tp
    qkv_rows = (q_heads + 2 * kv_heads) * hd
    linear_params = layers * (qkv_rows * h + h * q_heads * hd + 3 * h * inter)
    linear = linear_params * (1 if fp8 else act)
    scales = layers * 5 * 2 * 4 if fp8 else 0  # weight + activation scale (fp32) per quantized linear
    small = (layers * (qkv_rows + 2 * h) + h) * act  # qkv bias, two norms per layer, final norm
    vocab_rank = math.ceil(shape.vocab_size / tp)
    embedding = vocab_rank * h * act
    lm_head = vocab_rank * h * act
    weights = linear + scales + small + embedding + lm_head
    kv_elem = 1 if cfg.quantization.kv_cache == "fp8" else act
    kv_cache = b.max_batch_size * b.max_beam_width * b.max_seq_len * 2 * layers * kv_heads * hd * kv_elem
    # Largest live activations of one forward over max_num_tokens (qkv output, residual and norm,
    # fused fc+gate output), plus fp32 logits of the whole padded vocabulary per sequence.
    activations = b.max_num_tokens * (qkv_rows + 2 * h + 2 * inter) * act
    logits = b.max_batch_size * b.max_beam_width * vocab_rank * tp * 4
    total = weights + kv_cache + activations + logits + RUNTIME_OVERHEAD_BYTES
    return {
        "per_gpu": True,
        "tp": tp,
        "weight_format": "fp8 linears, " + cfg.dtype + " embedding/lm_head" if fp8 else cfg.dtype,
        "weights_bytes": weights,
        "weights_breakdown": {"linear": linear, "scales": scales, "norms_and_bias": small,
                              "embedding": embedding, "lm_head": lm_head},
        "kv_cache_bytes": kv_cache,
        "kv_cache_dtype": "fp8" if kv_elem == 1 else cfg.dtype,
        "activations_bytes": activations + logits,
        "overhead_bytes": RUNTIME_OVERHEAD_BYTES,
        "total_bytes": total,
    }


def memory_line(est: dict[str, Any]) -> str:
    return (f"memory per GPU (estimate, tp={est['tp']}): weights {est['weights_bytes'] / GB:.2f} GB "
            f"({est['weight_format']}), KV cache {est['kv_cache_bytes'] / GB:.2f} GB ({est['kv_cache_dtype']}), "
            f"activations {est['activations_bytes'] / GB:.2f} GB, overhead {est['overhead_bytes'] / GB:.2f} GB "
            f"= {est['total_bytes'] / GB:.2f} GB")


# --------------------------------------------------------------------------- pre-flight


def preflight(cfg: "BuildConfig", *, gpus: list[Gpu] | None = None) -> list[Problem]:
    """Why this machine cannot build and run ``cfg``'s engines, each problem with its fix.

    ``gpus`` defaults to the GPUs visible here (tests pass made-up ones).
    """
    problems = []
    _, trt_problem = trtllm_status()
    if trt_problem:
        problems.append(trt_problem)
    devices = machine_gpus() if gpus is None else list(gpus)
    world = cfg.parallelism.world_size
    if len(devices) < world:
        problems.append(Problem(f"tp*pp = {world} needs {world} CUDA GPU(s), {len(devices)} visible",
                                f"run on a machine with {world} GPUs (CUDA_VISIBLE_DEVICES), or lower parallelism.tp"))
    used = devices[:world]
    if not used:
        return problems
    sm = min(g.sm for g in used)
    fp8 = cfg.quantization.format == "fp8" or cfg.quantization.kv_cache == "fp8"
    if fp8 and sm < FP8_MIN_SM:
        problems.append(Problem(f"FP8 needs SM{FP8_MIN_SM}+ (Ada, Hopper); GPU {used[0].name} is SM{sm}",
                                "use an Ada/Hopper GPU, or a bf16 config (quantization.format: none)"))
    hopper_only = [p for p in FP8_PLUGINS if getattr(cfg.build.plugins, p) == "fp8"]
    if hopper_only and sm != LOW_LATENCY_SM:
        problems.append(Problem(
            f"{', '.join(hopper_only)} fp8 runs on Hopper (SM90) only; GPU {used[0].name} is SM{sm}",
            f"set build.plugins.{hopper_only[0]}: disable, or use an H100/H200"))
    shape = known_shape(cfg.model)
    if shape is not None:
        est = estimate_memory(cfg, shape)
        short = [g for g in used if g.free_gib * GIB < est["total_bytes"]]
        if short:
            g = short[0]
            problems.append(Problem(
                f"GPU {g.index} ({g.name}) has {g.free_gib * GIB / GB:.1f} GB free; one rank needs about "
                f"{est['total_bytes'] / GB:.1f} GB ({memory_line(est)})",
                "raise parallelism.tp, use FP8, or lower build.max_batch_size / build.max_seq_len"))
    return problems
