"""The Triton model repository of a build: TensorRT-LLM's ``inflight_batcher_llm`` layout.

Five models, for either runtime: ``ensemble`` (preprocessing -> tensorrt_llm -> postprocessing),
``preprocessing`` (tokenize, word lists, limits), ``tensorrt_llm`` (the engine), ``postprocessing``
(detokenize) and ``tensorrt_llm_bls`` (the same pipeline driven from Python). Only ``tensorrt_llm``
differs: TensorRT-LLM's C++ backend (``tensorrtllm``) on the engine, or a decoupled Python model
running the torch runtime that honours the same tensor contract (``torch_repo``).

Tensor names, data types and dims follow TensorRT-LLM 1.x's templates (``triton_backend/all_models/
inflight_batcher_llm/*/config.pbtxt`` in NVIDIA/TensorRT-LLM, e.g. tensorrt_llm@0c8de69a), where the
engine takes ``min_tokens`` and ``seed`` (0.19 and older: ``min_length``, ``random_seed``).

Where streamed text is made: Triton gives an ensemble step no per-request state, and refuses a
step fed by a decoupled model and by an earlier step together ("receives inputs originated from
different decoupled models"), so postprocessing cannot know a stream's earlier tokens. The model
that produces the tokens can: the torch ``tensorrt_llm`` keeps a ``TextStream`` per request (the
detokenizer in-process ``generate`` uses) and hands postprocessing each response's exact text in
``output_text``. TensorRT-LLM's C++ backend streams token ids only; postprocessing decodes each
response's tokens on their own there (upstream's behaviour: a character split over two tokens
streams as U+FFFD), and ``tensorrt_llm_bls``, which sees the whole stream, is exact for both.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.triton import model_config as mc
from trtllm_pipeline.triton.model_config import tensor

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
LOGITS_DATATYPE = "TYPE_FP32"  # generation logits as TensorRT-LLM gathers them (float32)
_MODEL_DTYPES = {"bfloat16": "TYPE_BF16", "float16": "TYPE_FP16"}

# The client contract of `ensemble` and `tensorrt_llm_bls`, identical for both runtimes:
# (name, data type, dims, the tensorrt_llm input it feeds, or None when preprocessing consumes it).
CLIENT_INPUTS = [
    ("text_input", "TYPE_STRING", [1], None),
    ("max_tokens", "TYPE_INT32", [1], None),
    ("stream", "TYPE_BOOL", [1], "streaming"),
    ("temperature", "TYPE_FP32", [1], "temperature"),
    ("top_k", "TYPE_INT32", [1], "runtime_top_k"),
    ("top_p", "TYPE_FP32", [1], "runtime_top_p"),
    ("random_seed", "TYPE_UINT64", [1], "seed"),
    ("end_id", "TYPE_INT32", [1], None),
    ("pad_id", "TYPE_INT32", [1], None),
    ("stop_words", "TYPE_STRING", [-1], None),
    ("bad_words", "TYPE_STRING", [-1], None),
    ("exclude_input_in_output", "TYPE_BOOL", [1], "exclude_input_in_output"),
    ("min_tokens", "TYPE_INT32", [1], "min_tokens"),
    ("return_generation_logits", "TYPE_BOOL", [1], "return_generation_logits"),
]
REQUIRED_INPUTS = ("text_input", "max_tokens")

# ensemble input -> preprocessing input, and preprocessing output -> tensorrt_llm input.
PREPROCESSING_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
                         "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
PREPROCESSING_OUTPUTS = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
                          "REQUEST_OUTPUT_LEN": "request_output_len", "STOP_WORDS_IDS": "stop_words_list",
                          "BAD_WORDS_IDS": "bad_words_list", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id"}


def client_inputs() -> list[dict[str, Any]]:
    return [tensor(name, dtype, dims, optional=name not in REQUIRED_INPUTS) for name, dtype, dims, _ in CLIENT_INPUTS]


def client_outputs() -> list[dict[str, Any]]:
    return [tensor("text_output", "TYPE_STRING", [-1]), tensor("generation_logits", LOGITS_DATATYPE, [-1, -1, -1])]


def model_datatype(cfg: BuildConfig) -> str:
    return _MODEL_DTYPES[cfg.dtype]


# --------------------------------------------------------------------------- shared models


def ensemble_config(cfg: BuildConfig, *, text_from_model: bool) -> dict[str, Any]:
    """``text_from_model``: the tensorrt_llm model streams its own text (``output_text``, torch runtime)."""
    pre = {"model_name": "preprocessing", "model_version": -1,
           "input_map": {inner: outer for outer, inner in PREPROCESSING_INPUTS.items()},
           "output_map": {out: f"_{out}" for out in PREPROCESSING_OUTPUTS}}
    engine_inputs = {trt: f"_{out}" for out, trt in PREPROCESSING_OUTPUTS.items()}
    engine_inputs.update({trt: name for name, _, _, trt in CLIENT_INPUTS if trt})
    engine_outputs = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
                      "generation_logits": "generation_logits"}
    post_inputs = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
    if text_from_model:
        engine_outputs["output_text"] = "_TEXT"
        post_inputs["TEXT"] = "_TEXT"
    engine = {"model_name": "tensorrt_llm", "model_version": -1, "input_map": engine_inputs,
              "output_map": engine_outputs}
    post = {"model_name": "postprocessing", "model_version": -1, "input_map": post_inputs,
            "output_map": {"OUTPUT": "text_output"}}
    return {
        "name": "ensemble", "platform": "ensemble", "max_batch_size": cfg.serving.max_batch_size,
        "input": client_inputs(), "output": client_outputs(),
        "ensemble_scheduling": {"step": [pre, engine, post]},
    }


def preprocessing_config(cfg: BuildConfig, *, tokenizer_dir: Path, end_id: int, pad_id: int) -> dict[str, Any]:
    s = cfg.serving
    return {
        "name": "preprocessing", "backend": "python", "max_batch_size": s.max_batch_size,
        "dynamic_batching": dynamic_batching(cfg),
        "input": [
            tensor("QUERY", "TYPE_STRING", [1]),
            tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", [1]),
            tensor("BAD_WORDS_DICT", "TYPE_STRING", [-1], optional=True),
            tensor("STOP_WORDS_DICT", "TYPE_STRING", [-1], optional=True),
            tensor("END_ID", "TYPE_INT32", [1], optional=True),
            tensor("PAD_ID", "TYPE_INT32", [1], optional=True),
        ],
        "output": [
            tensor("INPUT_ID", "TYPE_INT32", [-1]),
            tensor("REQUEST_INPUT_LEN", "TYPE_INT32", [1]),
            tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", [-1]),
            tensor("BAD_WORDS_IDS", "TYPE_INT32", [2, -1]),
            tensor("STOP_WORDS_IDS", "TYPE_INT32", [2, -1]),
            tensor("OUT_END_ID", "TYPE_INT32", [1]),
            tensor("OUT_PAD_ID", "TYPE_INT32", [1]),
        ],
        "parameters": mc.parameters({
            "tokenizer_dir": tokenizer_dir, "end_id": end_id, "pad_id": pad_id,
            "max_input_len": cfg.build.max_input_len, "max_seq_len": cfg.build.max_seq_len,
        }),
        "instance_group": [{"count": s.instance_count, "kind": "KIND_CPU"}],
    }


def postprocessing_config(cfg: BuildConfig, *, tokenizer_dir: Path, detokenize: bool) -> dict[str, Any]:
    """``detokenize``: decode token ids (TensorRT-LLM); False when every response brings its text (torch)."""
    s = cfg.serving
    return {
        "name": "postprocessing", "backend": "python", "max_batch_size": s.max_batch_size,
        "dynamic_batching": {},
        "input": [
            tensor("TOKENS_BATCH", "TYPE_INT32", [-1, -1]),
            tensor("SEQUENCE_LENGTH", "TYPE_INT32", [-1]),
            tensor("TEXT", "TYPE_STRING", [-1], optional=True),  # exact streamed text (torch runtime)
        ],
        "output": [tensor("OUTPUT", "TYPE_STRING", [-1])],
        "parameters": mc.parameters({"tokenizer_dir": tokenizer_dir, "skip_special_tokens": True,
                                     "detokenize": detokenize}),
        "instance_group": [{"count": s.instance_count, "kind": "KIND_CPU"}],
    }


def bls_config(cfg: BuildConfig, *, tokenizer_dir: Path) -> dict[str, Any]:
    return {
        "name": "tensorrt_llm_bls", "backend": "python", "max_batch_size": cfg.serving.max_batch_size,
        "model_transaction_policy": {"decoupled": True},
        "input": client_inputs(), "output": client_outputs(),
        "parameters": mc.parameters({"tokenizer_dir": tokenizer_dir, "tensorrt_llm_model_name": "tensorrt_llm",
                                     "preprocessing_model_name": "preprocessing"}),
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }


def dynamic_batching(cfg: BuildConfig) -> dict[str, Any]:
    return {"preferred_batch_size": [cfg.serving.max_batch_size],
            "max_queue_delay_microseconds": cfg.serving.max_queue_delay_microseconds,
            "default_queue_policy": {"max_queue_size": 0}}  # 0: unbounded, TensorRT-LLM's default


# --------------------------------------------------------------------------- tensorrt_llm, C++ backend

# TensorRT-LLM 1.x tensorrt_llm inputs (name, dtype, dims, flags): s = scalar (reshape to []),
# o = optional, r = allow_ragged_batch. None dtypes are filled per build (model and logits dtypes).
TRTLLM_INPUTS = [
    ("input_ids", "TYPE_INT32", [-1], "or"), ("encoder_input_features", None, [-1, -1], "or"),
    ("encoder_output_lengths", "TYPE_INT32", [1], "so"), ("input_lengths", "TYPE_INT32", [1], "s"),
    ("request_output_len", "TYPE_INT32", [1], "s"), ("num_return_sequences", "TYPE_INT32", [1], "so"),
    ("draft_input_ids", "TYPE_INT32", [-1], "or"), ("decoder_input_ids", "TYPE_INT32", [-1], "or"),
    ("decoder_input_lengths", "TYPE_INT32", [1], "so"), ("draft_logits", LOGITS_DATATYPE, [-1, -1], "or"),
    ("draft_acceptance_threshold", "TYPE_FP32", [1], "so"), ("end_id", "TYPE_INT32", [1], "so"),
    ("pad_id", "TYPE_INT32", [1], "so"), ("stop_words_list", "TYPE_INT32", [2, -1], "or"),
    ("bad_words_list", "TYPE_INT32", [2, -1], "or"), ("embedding_bias", "TYPE_FP32", [-1], "or"),
    ("beam_width", "TYPE_INT32", [1], "so"), ("temperature", "TYPE_FP32", [1], "so"),
    ("runtime_top_k", "TYPE_INT32", [1], "so"), ("runtime_top_p", "TYPE_FP32", [1], "so"),
    ("runtime_top_p_min", "TYPE_FP32", [1], "so"), ("runtime_top_p_decay", "TYPE_FP32", [1], "so"),
    ("runtime_top_p_reset_ids", "TYPE_INT32", [1], "so"), ("len_penalty", "TYPE_FP32", [1], "so"),
    ("early_stopping", "TYPE_BOOL", [1], "so"), ("repetition_penalty", "TYPE_FP32", [1], "so"),
    ("min_tokens", "TYPE_INT32", [1], "so"), ("beam_search_diversity_rate", "TYPE_FP32", [1], "so"),
    ("presence_penalty", "TYPE_FP32", [1], "so"), ("frequency_penalty", "TYPE_FP32", [1], "so"),
    ("seed", "TYPE_UINT64", [1], "so"), ("return_log_probs", "TYPE_BOOL", [1], "so"),
    ("return_context_logits", "TYPE_BOOL", [1], "so"), ("return_generation_logits", "TYPE_BOOL", [1], "so"),
    ("return_perf_metrics", "TYPE_BOOL", [1], "so"), ("exclude_input_in_output", "TYPE_BOOL", [1], "so"),
    ("stop", "TYPE_BOOL", [1], "so"), ("streaming", "TYPE_BOOL", [1], "so"),
    ("prompt_embedding_table", None, [-1, -1], "or"), ("prompt_table_extra_ids", "TYPE_UINT64", [-1], "or"),
    ("prompt_vocab_size", "TYPE_INT32", [1], "so"),
    ("lora_task_id", "TYPE_UINT64", [1], "so"), ("lora_weights", "TYPE_FP16", [-1, -1], "or"),
    ("lora_config", "TYPE_INT32", [-1, 3], "or"),
]
TRTLLM_OUTPUTS = [
    ("output_ids", "TYPE_INT32", [-1, -1]), ("sequence_length", "TYPE_INT32", [-1]),
    ("cum_log_probs", "TYPE_FP32", [-1]), ("output_log_probs", "TYPE_FP32", [-1, -1]),
    ("context_logits", LOGITS_DATATYPE, [-1, -1]), ("generation_logits", LOGITS_DATATYPE, [-1, -1, -1]),
    ("batch_index", "TYPE_INT32", [1]), ("sequence_index", "TYPE_INT32", [1]),
]
# The executor worker TensorRT-LLM's backend ships at this path in the NGC trtllm container.
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


def trtllm_model_config(cfg: BuildConfig, *, engine_dir: Path) -> dict[str, Any]:
    """TensorRT-LLM's C++ backend on the engine, with every parameter this build decides filled."""
    dtype = model_datatype(cfg)
    fill = {"encoder_input_features": dtype, "prompt_embedding_table": dtype}
    inputs = [tensor(name, kind or fill[name], dims, scalar="s" in flags, optional="o" in flags,
                     ragged="r" in flags) for name, kind, dims, flags in TRTLLM_INPUTS]
    return {
        "name": "tensorrt_llm", "backend": "tensorrtllm", "max_batch_size": cfg.serving.max_batch_size,
        "model_transaction_policy": {"decoupled": True},  # streaming needs it (tensorrtllm_backend#626)
        "dynamic_batching": dynamic_batching(cfg),
        "input": inputs,
        "output": [tensor(name, kind, dims) for name, kind, dims in TRTLLM_OUTPUTS],
        # The backend places the engine on the GPUs itself; Triton's instance is a CPU one.
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": mc.parameters({
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": engine_dir,
            "max_beam_width": cfg.build.max_beam_width,
            "batch_scheduler_policy": "guaranteed_no_evict",
            "kv_cache_free_gpu_mem_fraction": cfg.runtime.kv_cache_free_gpu_mem_fraction,
            "enable_kv_cache_reuse": cfg.runtime.enable_kv_cache_reuse,
            "exclude_input_in_output": cfg.serving.exclude_input_in_output,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "executor_worker_path": EXECUTOR_WORKER,
        }),
    }


# --------------------------------------------------------------------------- writing


def python_model_source(name: str) -> Path:
    """A Python-backend ``model.py`` shipped as package data under ``triton/python_models/``."""
    return Path(str(resources.files("trtllm_pipeline.triton") / "python_models" / name / "model.py"))


def write_repository(cfg: BuildConfig, runtime: str, out: Path, *, engines_dir: Path, engine_dir: Path,
                     tokenizer_dir: Path, end_id: int, pad_id: int) -> dict[str, Any]:
    """Write the five models into ``out``; returns what was written, for the deploy manifest."""
    from trtllm_pipeline.triton import torch_repo

    torch = runtime == "torch"
    configs = {
        "ensemble": ensemble_config(cfg, text_from_model=torch),
        "preprocessing": preprocessing_config(cfg, tokenizer_dir=tokenizer_dir, end_id=end_id, pad_id=pad_id),
        "postprocessing": postprocessing_config(cfg, tokenizer_dir=tokenizer_dir, detokenize=not torch),
        "tensorrt_llm_bls": bls_config(cfg, tokenizer_dir=tokenizer_dir),
        "tensorrt_llm": (torch_repo.model_config(cfg, engines_dir=engines_dir) if torch
                         else trtllm_model_config(cfg, engine_dir=engine_dir)),
    }
    for name in MODELS:
        mc.write(out / name, mc.build(configs[name]))
        version = out / name / "1"
        version.mkdir()
        source = "tensorrt_llm_torch" if name == "tensorrt_llm" and torch else name
        if name != "ensemble" and (name != "tensorrt_llm" or torch):
            shutil.copyfile(python_model_source(source), version / "model.py")
    if torch:
        torch_repo.write_build_config(cfg, out / "tensorrt_llm")
    return {"models": list(MODELS), "runtime": runtime, "end_id": end_id, "pad_id": pad_id,
            "tokenizer_dir": str(tokenizer_dir), "engine_dir": str(engine_dir)}

