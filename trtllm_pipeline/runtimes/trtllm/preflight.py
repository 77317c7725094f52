"""Can this machine build and run a config's TensorRT-LLM engines? Pre-flight checks and the memory estimate.

Each check is cheap and needs no TensorRT-LLM: a missing package, too few or too old GPUs, or too
little free memory cost seconds here instead of a failed build. Problems come back as
``Problem(problem, fix)`` pairs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trtllm_pipeline.checkpoint import WEIGHT_BYTES, linear_weight_bytes
from trtllm_pipeline.errors import Problem
from trtllm_pipeline.machine import Gpu, trtllm_status
from trtllm_pipeline.machine import gpus as machine_gpus
from trtllm_pipeline.model.catalog import ModelShape
from trtllm_pipeline.model.source import known_shape
from trtllm_pipeline.runtimes.trtllm.commands import FP8_PLUGINS

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
# The GPUs each weight format builds and runs on with TensorRT-LLM 1.2: (lowest SM, what needs it).
# Sources: ModelOpt's support matrix (FP4 Blackwell and later, FP8 and W4A8 Ada and later, INT8 and W4A16
# Ampere and later) and TensorRT-LLM's builder.py build(), which raises for INT8/INT4 weights and
# SmoothQuant on SM100-SM119 ("INT8/INT4 quantization is not supported on SM>=100").
FORMAT_MIN_SM = {
    "fp8": (89, "FP8 weights need FP8 tensor cores (Ada, Hopper or newer)"),
    "int4_awq": (80, "INT4 weight-only GEMMs need Ampere or newer"),
    "w4a8_awq": (89, "W4A8 runs FP8 activations on FP8 tensor cores (Ada or Hopper)"),
    "int8_sq": (80, "INT8 SmoothQuant GEMMs need Ampere or newer"),
    "int8_wo": (80, "INT8 weight-only GEMMs need Ampere or newer"),
    "nvfp4": (100, "NVFP4 needs FP4 tensor cores (Blackwell, SM100 or newer)"),
}
NO_INT_SM = range(100, 120)  # builder.py: no INT8/INT4 weights, no SmoothQuant on these
INT_FORMATS = ("int4_awq", "w4a8_awq", "int8_sq", "int8_wo")


# The CUTLASS fpA_intB kernels behind the groupwise plugin take these group sizes only
# (fpA_intB_gemm_template.h: "Only group size 64 and 128 supported for fine grained kernels", 128 for W4A(fp)8).
GROUP_SIZES = {"int4_awq": (64, 128), "w4a8_awq": (128,)}


def format_problems(cfg: "BuildConfig") -> list[Problem]:
    """Settings TensorRT-LLM's kernels cannot run (the torch runtime can): the INT4 group size."""
    q = cfg.quantization
    sizes = GROUP_SIZES.get(q.format)
    if sizes and q.group_size not in sizes:
        return [Problem(f"quantization.awq_block_size {q.group_size}: TensorRT-LLM's {q.format} kernels take group "
                        f"size {' or '.join(map(str, sizes))} only",
                        f"set awq_block_size: {sizes[-1]} where the model's dimensions allow it, or use the torch "
                        "runtime (`--runtime torch`)")]
    return []


def format_gpu_problem(fmt: str, sm: int, gpu_name: str) -> Problem | None:
    """Why TensorRT-LLM 1.2 cannot build ``fmt`` for a GPU of compute capability ``sm``, or None."""
    if fmt not in FORMAT_MIN_SM:
        return None
    low, why = FORMAT_MIN_SM[fmt]
    fix = {"nvfp4": "use a Blackwell GPU (B200, GB200, RTX 50), or fp8 / int4_awq on Hopper",
           "w4a8_awq": "use an Ada or Hopper GPU (L40S, H100, H200), or int4_awq elsewhere"}.get(
        fmt, "use a newer GPU or quantization.format: none")
    if sm < low:
        return Problem(f"quantization.format {fmt}: {why}; GPU {gpu_name} is SM{sm}", fix)
    if fmt in INT_FORMATS and sm in NO_INT_SM:
        return Problem(f"quantization.format {fmt}: TensorRT-LLM 1.2 builds no INT8/INT4 weights or SmoothQuant on "
                       f"SM100-SM119 (builder.py); GPU {gpu_name} is SM{sm}",
                       "use fp8 or nvfp4 on this GPU, or an Ampere/Ada/Hopper GPU for this format")
    return None


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
    q = cfg.quantization
    act = _DTYPE_BYTES[cfg.dtype]
    fp8 = q.format == "fp8"
    h, hd = shape.hidden_size, shape.head_dim
    layers = math.ceil(shape.num_hidden_layers / pp)
    q_heads, kv_heads = shape.num_attention_heads // tp, max(1, shape.num_key_value_heads // tp)
    inter = shape.intermediate_size // tp
    qkv_rows = (q_heads + 2 * kv_heads) * hd
    linear_params = layers * (qkv_rows * h + h * q_heads * hd + 3 * h * inter)
    out_features = layers * (qkv_rows + h + 2 * inter + h)
    total = linear_weight_bytes(q.quant_algo, linear_params, act, q.group_size, out_features)
    linear = linear_params * (WEIGHT_BYTES[q.quant_algo] if q.quant_algo else act)
    scales = layers * 5 * 2 * 4 if fp8 else total - linear  # FP8: weight + activation scale (fp32) per linear
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
        "weight_format": f"{q.format} linears, {cfg.dtype} embedding/lm_head" if q.quant_algo else cfg.dtype,
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
    problems = format_problems(cfg)
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
    fmt_problem = format_gpu_problem(cfg.quantization.format, sm, used[0].name)
    if fmt_problem and not (fp8 and sm < FP8_MIN_SM and cfg.quantization.format == "fp8"):
        problems.append(fmt_problem)
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
