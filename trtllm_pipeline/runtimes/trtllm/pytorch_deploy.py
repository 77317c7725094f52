"""What TensorRT-LLM's PyTorch backend (>= 1.0; the only flow from 1.3 on) is given: no engine, the unified HF
checkpoint, and either a Triton ``llmapi`` model or a ``trtllm-serve`` launch.

Every key and option here is TensorRT-LLM's, transcribed from its sources with file and commit in
``tests/fixtures/trtllm_pytorch_llmapi.json``; the contract tests compare what is written with it,
key by key:

* ``check_hf_checkpoint``: what the LLM API reads of ModelOpt's unified checkpoint
  (``hf_quant_config.json``'s ``quantization.quant_algo`` / ``kv_cache_quant_algo``, the weights,
  the config, the tokenizer), against the format the config asks for.
* ``llm_args``: the LLM arguments (``model``, ``backend: pytorch``, parallelism, limits,
  ``kv_cache_config``), written as the llmapi model's ``model.yaml`` (plus its ``triton_config``)
  or as the YAML ``trtllm-serve --extra_llm_api_options`` merges over its own options.
* ``llmapi_config``: the llmapi model's ``config.pbtxt`` (its inputs and outputs as upstream's).
* ``trtllm_serve_argv``: the ``trtllm-serve`` command line.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_pipeline.config import MODELOPT_FORMATS
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.triton import model_config as mc

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

LLMAPI_MODEL = "tensorrt_llm"  # the llmapi model's name (its config.pbtxt), as clients address it
MODEL_YAML = "model.yaml"
EXTRA_OPTIONS = "extra_llm_api_options.yaml"
LAUNCH = "trtllm-serve.json"
# Upstream's model.py and helpers.py (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/) are
# TensorRT-LLM's code: found where it is installed, never copied into this package.
LLMAPI_SOURCES = ("model.py", "helpers.py")
LLMAPI_DIR_ENV = "TRTLLM_LLMAPI_MODEL_DIR"
# tensorrt_llm.quantization.mode.QUANT_ALGO_LIST (tests/fixtures/trtllm_1_2_quant_formats.json).
QUANT_ALGOS = {"W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
               "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
               "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "W4A8_QSERVE_PER_GROUP",
               "W4A8_QSERVE_PER_CHANNEL", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES", "MIXED_PRECISION",
               "NVFP4", "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8", "W4A8_MXFP4_MXFP8", "W4A16_MXFP4", "NO_QUANT"}

# The llmapi model's tensors (upstream config.pbtxt): (name, data type, dims, optional).
LLMAPI_INPUTS = [
    ("text_input", "TYPE_STRING", [-1], False), ("image_url", "TYPE_STRING", [-1], True),
    ("streaming", "TYPE_BOOL", [1], True), ("sampling_param_best_of", "TYPE_INT32", [1], True),
    ("sampling_param_temperature", "TYPE_FP32", [1], True), ("sampling_param_top_k", "TYPE_INT32", [1], True),
    ("sampling_param_top_p", "TYPE_FP32", [1], True), ("sampling_param_frequency_penalty", "TYPE_FP32", [1], True),
    ("sampling_param_presence_penalty", "TYPE_FP32", [1], True), ("sampling_param_max_tokens", "TYPE_INT32", [1], True),
    ("sampling_param_stop", "TYPE_STRING", [-1], True), ("sampling_param_seed", "TYPE_UINT64", [1], True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", [1], True),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", [1], True), ("return_finish_reason", "TYPE_BOOL", [1], True),
    ("return_stop_reason", "TYPE_BOOL", [1], True), ("return_cumulative_logprob", "TYPE_BOOL", [1], True),
    ("stop", "TYPE_BOOL", [1], True), ("lora_id", "TYPE_UINT64", [1], True), ("lora_name", "TYPE_STRING", [1], True),
    ("lora_path", "TYPE_STRING", [1], True), ("lora_ckpt_source", "TYPE_STRING", [1], True),
]
LLMAPI_OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]), ("finish_reason", "TYPE_STRING", [-1]), ("stop_reason", "TYPE_STRING", [-1]),
    ("cumulative_logprob", "TYPE_FP32", [-1]), ("kv_cache_reused_block", "TYPE_INT32", [-1]),
    ("kv_cache_missed_block", "TYPE_INT32", [-1]), ("kv_cache_alloc_new_blocks", "TYPE_INT32", [-1]),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", [-1]), ("kv_cache_hit_rate", "TYPE_FP32", [-1]),
    ("arrival_time_ns", "TYPE_INT64", [1]), ("first_scheduled_time_ns", "TYPE_INT64", [1]),
    ("first_token_time_ns", "TYPE_INT64", [1]), ("last_token_time_ns", "TYPE_INT64", [1]),
    ("acceptance_rate", "TYPE_FP32", [1]), ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]),
]


# --------------------------------------------------------------------------- the checkpoint


def check_hf_checkpoint(cfg: "BuildConfig", model_dir: Path) -> dict[str, Any]:
    """What the LLM API will load from ``model_dir``, or InputError naming what it would not."""
    fix = f"re-run quantize (`trtllm-pipeline quantize -c {cfg.file_arg} --force`) with export_hf_checkpoint: true"
    if not (model_dir / "config.json").is_file():
        raise InputError(f"{model_dir} has no config.json: not an HF checkpoint the LLM API can load.", fix=fix)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if not config.get("architectures"):
        raise InputError(f"{model_dir}/config.json names no architectures (the LLM API picks its model by them).",
                         fix=fix)
    if not sorted(model_dir.glob("*.safetensors")):
        raise InputError(f"{model_dir} holds no *.safetensors weights.", fix=fix)
    if not (model_dir / "tokenizer_config.json").is_file():
        raise InputError(f"{model_dir} has no tokenizer (tokenizer_config.json): the LLM API loads it from there.",
                         fix=fix)
    expected = MODELOPT_FORMATS[cfg.quantization.format]
    kv_expected = "FP8" if cfg.quantization.kv_cache == "fp8" else None
    found: dict[str, Any] = {"dir": str(model_dir), "architectures": config["architectures"],
                             "quant_algo": None, "kv_cache_quant_algo": None}
    path = model_dir / "hf_quant_config.json"
    if expected is None:
        if path.is_file():
            raise InputError(f"{path} says the checkpoint is quantized, but quantization.format is none.", fix=fix)
        return found
    if not path.is_file():
        raise InputError(f"{model_dir} has no hf_quant_config.json: the LLM API would load it unquantized.", fix=fix)
    quant = json.loads(path.read_text(encoding="utf-8")).get("quantization")
    if not isinstance(quant, dict):
        raise InputError(f"{path} has no 'quantization' object (what ModelConfig.load_modelopt_quant_config reads).",
                         fix=fix)
    algo, kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if algo not in QUANT_ALGOS:
        raise InputError(f"{path}: quant_algo {algo!r} is not one TensorRT-LLM knows.", fix=fix)
    if algo != expected or kv != kv_expected:
        raise InputError(f"{path}: quant_algo {algo!r}, kv_cache_quant_algo {kv!r}; the config asks for "
                         f"{expected!r} and {kv_expected!r}.", fix=fix)
    inline = (config.get("quantization_config") or {}).get("quant_algo")
    if inline is not None and inline != algo:
        raise InputError(f"{model_dir}/config.json's quantization_config says {inline!r}, hf_quant_config.json "
                         f"{algo!r}.", fix=fix)
    return {**found, "quant_algo": algo, "kv_cache_quant_algo": kv, "exclude_modules": quant.get("exclude_modules")}


# --------------------------------------------------------------------------- what is written


def llm_args(cfg: "BuildConfig", model_dir: str | Path) -> dict[str, Any]:
    """The LLM API arguments for ``cfg`` (model.yaml's, and the trtllm-serve options' YAML)."""
    b, r = cfg.build, cfg.runtime
    return {
        "model": str(model_dir),
        "backend": "pytorch",
        "tensor_parallel_size": cfg.parallelism.tp,
        "pipeline_parallel_size": cfg.parallelism.pp,
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_beam_width": b.max_beam_width,
        # dtype auto: the KV cache as the checkpoint's kv_cache_quant_algo says (FP8 when quantized so).
        "kv_cache_config": {"free_gpu_memory_fraction": r.kv_cache_free_gpu_mem_fraction,
                            "enable_block_reuse": r.enable_kv_cache_reuse, "dtype": "auto"},
    }


def model_yaml(cfg: "BuildConfig", model_dir: str | Path) -> dict[str, Any]:
    """The llmapi model's 1/model.yaml: the LLM arguments and the Triton settings model.py reads."""
    # decoupled: streamed responses (upstream's default is false, one response per request); max_batch_size
    # 0: no Triton-level batching ("not supported"), the LLM batches in flight itself.
    return {**llm_args(cfg, model_dir), "triton_config": {"max_batch_size": 0, "decoupled": True}}


def llmapi_config() -> dict[str, Any]:
    """The llmapi model's config.pbtxt, as upstream's: no max_batch_size or transaction policy (model.py
    sets both from model.yaml's triton_config)."""
    return {"name": LLMAPI_MODEL, "backend": "python", "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "input": [mc.tensor(n, t, d, optional=o) for n, t, d, o in LLMAPI_INPUTS],
            "output": [mc.tensor(n, t, d) for n, t, d in LLMAPI_OUTPUTS]}


def extra_llm_api_options(cfg: "BuildConfig") -> dict[str, Any]:
    """What trtllm-serve's options cannot say: the KV cache's block reuse and data type."""
    return {"kv_cache_config": llm_args(cfg, "")["kv_cache_config"]}


def trtllm_serve_argv(cfg: "BuildConfig", model_dir: str | Path, tokenizer_dir: str | Path, options: str | Path, *,
                      host: str, port: int, binary: str = "trtllm-serve") -> list[str]:
    args = llm_args(cfg, model_dir)
    return [binary, str(model_dir), "--backend", "pytorch", "--tokenizer", str(tokenizer_dir), "--host", host,
            "--port", str(port), "--tp_size", str(args["tensor_parallel_size"]),
            "--pp_size", str(args["pipeline_parallel_size"]), "--max_batch_size", str(args["max_batch_size"]),
            "--max_num_tokens", str(args["max_num_tokens"]), "--max_seq_len", str(args["max_seq_len"]),
            "--max_beam_width", str(args["max_beam_width"]),
            "--kv_cache_free_gpu_memory_fraction", str(args["kv_cache_config"]["free_gpu_memory_fraction"]),
            "--extra_llm_api_options", str(options)]


def llmapi_sources(env: dict[str, str]) -> Path | None:
    """Upstream's llmapi ``1/`` directory (model.py, helpers.py): ``$TRTLLM_LLMAPI_MODEL_DIR``, else beside
    an installed tensorrt_llm, where its wheel or checkout carries ``triton_backend/``."""
    candidates = [Path(env[LLMAPI_DIR_ENV])] if env.get(LLMAPI_DIR_ENV) else []
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        candidates += [base / "triton_backend/all_models/llmapi/tensorrt_llm/1" for base in (root, root.parent)]
    return next((c for c in candidates if all((c / name).is_file() for name in LLMAPI_SOURCES)), None)
