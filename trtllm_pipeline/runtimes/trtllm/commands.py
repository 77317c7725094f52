"""The TensorRT-LLM 1.2.x command lines: trtllm-build, one MPI rank per GPU, tritonserver per rank.

Every flag used here was checked against TensorRT-LLM's own sources of the 1.2 line and is pinned
in ``tests/fixtures/trtllm_1_2_build_args.json`` (file, commit, type, choices, default):
``tensorrt_llm/commands/build.py`` (parse_arguments), ``tensorrt_llm/plugin/plugin.py``
(PluginConfig, cli_plugin_args) and ``triton_backend/scripts/launch_triton_server.py`` (the mpirun
line). ``trtllm/backend.plan`` prints them all, with the pre-flight verdicts, for ``build --dry-run``.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from trtllm_pipeline.config import FP8_CONTEXT_FMHA_FORMATS
from trtllm_pipeline.endpoints import restricted_api_flags, triton_endpoint_flags
from trtllm_pipeline.machine import gpus as machine_gpus

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

TRITON_MODEL = "tensorrt_llm"  # the Triton model that ranks > 0 load (the engine itself)
# Plugins whose only setting is fp8 (default disable in 1.2); their kernels are Hopper-only.
FP8_PLUGINS = ("low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin", "gemm_swiglu_plugin")


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """A trtllm-build output's config.json (pretrained_config, build_config)."""
    return json.loads((Path(engine_dir) / "config.json").read_text(encoding="utf-8"))


def _switch(on: bool) -> str:
    return "enable" if on else "disable"


def use_fp8_context_fmha(cfg: "BuildConfig") -> bool:
    """On exactly when the KV cache is FP8, unless the config says otherwise."""
    value = cfg.build.use_fp8_context_fmha
    return cfg.quantization.kv_cache == "fp8" if value is None else value


def fused_mlp(cfg: "BuildConfig") -> bool:
    """trtllm-build turns --use_fused_mlp off for any quant_algo but FP8 (commands/build.py main): say so."""
    return cfg.build.use_fused_mlp and cfg.quantization.quant_algo in (None, "FP8")


# What trtllm-build 1.2 does for each weight format without being told, traced to TensorRT-LLM's sources
# (tests/fixtures/trtllm_1_2_quant_formats.json holds the same facts with file and commit).
FORMAT_BUILD_NOTES = {
    "int4_awq": [
        "W4A16_AWQ: trtllm-build enables weight_only_groupwise_quant_matmul_plugin=<dtype> itself (builder.py "
        "build(): weight-only per-group quant mode); it is no CLI flag (plugin/plugin.py@c20322ff cli_plugin_args)",
        "loads INT4 as preprocess_weights_for_mixed_gemm(weight.T, quint4x2, float16 activations), scales transposed "
        "to (in/group, out) in the model dtype, prequant scales as (1, in) (models/modeling_utils.py@01ea6d79 "
        "preprocess_perlayer_weights)",
    ],
    "w4a8_awq": [
        "W4A8_AWQ: weight_only_groupwise_quant_matmul_plugin=<dtype> set by the builder (builder.py build()), "
        "FP8 activations (preprocess_weights_for_mixed_gemm(..., float8_e4m3fn))",
        "scales: weights_scaling_factor / weights_scaling_factor_2, prequant / activation_scaling_factor, "
        "alpha = activation_scaling_factor * weights_scaling_factor_2 (models/modeling_utils.py@01ea6d79)",
    ],
    "int8_sq": [
        "W8A8_SQ_PER_CHANNEL: INT8 GEMMs built by TensorRT (builder int8 flag); the SmoothQuant plugins serve the "
        "*_PLUGIN quant_algos only (quantization/mode.py W8A8_SQ_PLUGIN_LIST)",
    ],
    "int8_wo": [
        "W8A16: trtllm-build quantizes the checkpoint's weights per output channel while loading each rank "
        "(weight_only_quantize_dict, models/modeling_utils.py@01ea6d79 preprocess_perlayer_weights) and enables "
        "weight_only_quant_matmul_plugin=<dtype> (builder.py build())",
    ],
    "nvfp4": [
        "NVFP4: --gemm_plugin nvfp4 (the builder defaults to it unless --gemm_plugin disable is given: "
        "plugin/plugin.py@c20322ff from_arguments, builder.py build())",
        "block scales interleaved at load (nvfp4_block_scale_interleave); alpha = activation_scaling_factor * "
        "weights_scaling_factor_2 (models/modeling_utils.py@01ea6d79 preprocess_perlayer_weights)",
    ],
}


def build_notes(cfg: "BuildConfig") -> list[str]:
    """The plan's account of the format's flags and what trtllm-build does for the format on its own."""
    q = cfg.quantization
    notes = list(FORMAT_BUILD_NOTES.get(q.format, []))
    if q.quant_algo not in (None, "FP8"):
        notes.append(f"--use_fused_mlp disable: trtllm-build forces it off for {q.quant_algo} "
                     "(commands/build.py@65f1d153 main)")
    if q.format in FP8_CONTEXT_FMHA_FORMATS:
        notes.append(f"--use_fp8_context_fmha {_switch(use_fp8_context_fmha(cfg))}: kept by the builder for "
                     f"{', '.join(FP8_CONTEXT_FMHA_FORMATS)} weights, on with an FP8 KV cache (builder.py build())")
    elif q.quant_algo:
        notes.append(f"--use_fp8_context_fmha left out: the builder turns FP8 context FMHA off for {q.quant_algo} "
                     "(builder.py build())")
    return notes


def build_workers(cfg: "BuildConfig", gpu_count: int | None = None) -> int:
    """min(world size, GPUs); trtllm-build itself caps --workers at the visible GPU count."""
    if cfg.build.workers is not None:
        return cfg.build.workers
    world = cfg.parallelism.world_size
    gpus = len(machine_gpus()) if gpu_count is None else gpu_count
    return min(world, gpus) if gpus else world  # planned elsewhere: assume the engine's own GPUs


def trtllm_build_command(cfg: "BuildConfig", checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
                         gpu_count: int | None = None) -> list[str]:
    """The trtllm-build argument list for ``cfg`` (flags and values as TensorRT-LLM 1.2.x defines them)."""
    b, p = cfg.build, cfg.build.plugins
    cmd = ["trtllm-build", "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir),
           "--gpt_attention_plugin", p.gpt_attention_plugin, "--gemm_plugin", p.gemm_plugin]
    # FP8-only plugins default to disable in 1.2: name them only when they are on.
    for name in FP8_PLUGINS:
        if getattr(p, name) == "fp8":
            cmd += [f"--{name}", "fp8"]
    cmd += ["--kv_cache_type", b.kv_cache_type, "--use_paged_context_fmha", _switch(b.use_paged_context_fmha)]
    # For weights other than FP8, W4A8 and NVFP4 the builder forces FP8 context FMHA off itself; the flag is left out.
    if cfg.quantization.format in FP8_CONTEXT_FMHA_FORMATS:
        cmd += ["--use_fp8_context_fmha", _switch(use_fp8_context_fmha(cfg))]
    cmd += ["--use_fused_mlp", _switch(fused_mlp(cfg)), "--multiple_profiles", _switch(b.multiple_profiles),
            "--max_batch_size", str(b.max_batch_size), "--max_input_len", str(b.max_input_len),
            "--max_seq_len", str(b.max_seq_len), "--max_num_tokens", str(b.max_num_tokens),
            "--max_beam_width", str(b.max_beam_width), "--workers", str(build_workers(cfg, gpu_count))]
    if b.gather_generation_logits:
        cmd.append("--gather_generation_logits")
    return cmd + list(b.extra_args)


def engine_world_size(engine_dir: str | os.PathLike, cfg: "BuildConfig") -> int:
    """The built engine's world size (its config.json), else the config's tp*pp."""
    try:
        mapping = read_engine_config(Path(engine_dir))["pretrained_config"]["mapping"]
        return int(mapping.get("world_size", mapping.get("tp_size", 1) * mapping.get("pp_size", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        return cfg.parallelism.world_size


def engine_run_command(cfg: "BuildConfig", engine_dir: str | os.PathLike, argv: Sequence[str]) -> list[str]:
    """``argv`` as it must run for this engine: one MPI process per rank when the world size is above 1."""
    world = engine_world_size(engine_dir, cfg)
    return list(argv) if world == 1 else ["mpirun", "-n", str(world), "--allow-run-as-root", *argv]


def server_launch_command(cfg: "BuildConfig", repo_dir: str | os.PathLike, tritonserver: str, http_port: int,
                          grpc_port: int, metrics_port: int, host: str = "127.0.0.1",
                          http_host: str | None = None) -> list[str]:
    """tritonserver for a TensorRT-LLM model repository, as TensorRT-LLM's launch_triton_server.py starts it.

    World size 1: one plain tritonserver. Above 1: one ``mpirun --allow-run-as-root`` with a
    ``-n 1 tritonserver ...`` segment per rank joined by ``:``; ranks > 0 load only the engine
    model (``tensorrt_llm``), every segment names the same ports, and each rank gets its own
    Python-backend shared-memory prefix, as upstream's launcher writes them. Added here: the
    endpoints bind ``host`` (Triton's default is every interface); HTTP binds ``http_host`` when given
    (loopback, behind ``serve``'s HTTP front); Triton's admin APIs are closed (``endpoints.restricted_api_flags``).
    """
    world = cfg.parallelism.world_size
    segments = []
    restricted = restricted_api_flags()  # one admin key for every rank's server
    for rank in range(world):
        seg = [tritonserver, f"--model-repository={repo_dir}",
               *triton_endpoint_flags(http_host=http_host or host, http_port=http_port, host=host,
                                      grpc_port=grpc_port, metrics_port=metrics_port)]
        if rank > 0:
            seg += ["--model-control-mode=explicit", f"--load-model={TRITON_MODEL}"]
        seg += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
                *restricted]
        segments.append(seg)
    if world == 1:
        return segments[0]
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank, seg in enumerate(segments):
        cmd += ([":"] if rank else []) + ["-n", "1", *seg]
    return cmd


def generate_argv(cfg: "BuildConfig") -> list[str]:
    return ["trtllm-pipeline", "generate", "-c", cfg.file, "PROMPT"]


def quoted(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)
