"""The torch runtime's ``tensorrt_llm`` model: a decoupled Python model honouring the engine's contract.

It declares the subset of TensorRT-LLM's ``tensorrt_llm`` inputs that the ensemble feeds, with the
same names, types and dims, and the same outputs plus ``output_text`` (each response's exact text,
see ``repository``). The model itself is ``python_models/tensorrt_llm_torch/model.py``; it loads the
engine with ``runtimes.registry.load_runtime`` from the build config written beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, machine
from trtllm_pipeline.config import BuildConfig, config_from_dict
from trtllm_pipeline.triton import model_config as mc
from trtllm_pipeline.triton.model_config import tensor
from trtllm_pipeline.triton.contract import LOGITS_DATATYPE, TRTLLM_INPUTS, dynamic_batching

BUILD_CONFIG_FILE = "build_config.json"
HONOURED_INPUTS = ("input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "stop_words_list",
                   "bad_words_list", "streaming", "temperature", "runtime_top_k", "runtime_top_p", "seed",
                   "min_tokens", "exclude_input_in_output", "return_generation_logits", "stop")


def model_config(cfg: BuildConfig, *, engines_dir: Path) -> dict[str, Any]:
    inputs = [tensor(name, kind, dims, scalar="s" in flags, optional="o" in flags, ragged="r" in flags)
              for name, kind, dims, flags in TRTLLM_INPUTS if name in HONOURED_INPUTS]
    return {
        "name": "tensorrt_llm", "backend": "python", "max_batch_size": cfg.serving.max_batch_size,
        "model_transaction_policy": {"decoupled": True},
        "dynamic_batching": dynamic_batching(cfg),
        "input": inputs,
        "output": [
            tensor("output_ids", "TYPE_INT32", [-1, -1]),
            tensor("sequence_length", "TYPE_INT32", [-1]),
            tensor("generation_logits", LOGITS_DATATYPE, [-1, -1, -1]),
            tensor("output_text", "TYPE_STRING", [-1]),
        ],
        # One instance: it owns the runtime, whose loop thread batches every request continuously.
        "instance_group": [instance_group(cfg)],
        "parameters": mc.parameters({
            "engines_dir": Path(engines_dir).resolve(),
            "build_config": BUILD_CONFIG_FILE,
            "exclude_input_in_output": cfg.serving.exclude_input_in_output,
        }),
    }


def instance_group(cfg: BuildConfig) -> dict[str, Any]:
    """KIND_GPU on GPU 0 where the runtime runs on CUDA (Triton then counts the model on that GPU and gives the
    instance its device id), else KIND_CPU."""
    kind = cfg.serving.instance_kind
    if kind == "auto":
        kind = "gpu" if cfg.runtime.device != "cpu" and machine.gpus() else "cpu"
    return {"count": 1, "kind": "KIND_GPU", "gpus": [0]} if kind == "gpu" else {"count": 1, "kind": "KIND_CPU"}


def write_build_config(cfg: BuildConfig, model_dir: Path) -> None:
    """The validated config as JSON, so the served model does not depend on the YAML file staying put."""
    artifacts.write_json_atomic(model_dir / BUILD_CONFIG_FILE, {"name": cfg.name, "config": cfg.to_dict()})


def read_build_config(model_dir: Path) -> BuildConfig:
    data = json.loads((model_dir / BUILD_CONFIG_FILE).read_text(encoding="utf-8"))
    return config_from_dict(data["config"], name=data["name"])
