"""The Triton model repository of a build: TensorRT-LLM's ``inflight_batcher_llm`` layout.

Five models, for either runtime: ``ensemble`` (preprocessing -> tensorrt_llm -> postprocessing),
``preprocessing`` (tokenize, word lists, limits), ``tensorrt_llm`` (the engine), ``postprocessing``
(detokenize) and ``tensorrt_llm_bls`` (the same pipeline driven from Python). Only ``tensorrt_llm``
differs, and each backend supplies it as an ``EngineModel``: TensorRT-LLM's C++ backend
(``tensorrtllm``) on the engine (``trtllm_repo``), or a decoupled Python model running the torch
runtime that honours the same tensor contract (``torch_repo``). The contract itself is ``contract``.

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

import dataclasses
import json
import shutil
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from trtllm_pipeline.triton import model_config as mc
from trtllm_pipeline.triton.contract import (CLIENT_INPUTS, LOGITS_DATATYPE, NUM_OUTPUT_TOKENS, PREPROCESSING_INPUTS,
                                             PREPROCESSING_OUTPUTS, REQUIRED_INPUTS, RequestLimits, dynamic_batching)
from trtllm_pipeline.triton.model_config import tensor

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
_MODEL_DTYPES = {"bfloat16": "TYPE_BF16", "float16": "TYPE_FP16"}


@dataclasses.dataclass(frozen=True)
class EngineModel:
    """The repository's ``tensorrt_llm`` model, as a backend makes it."""

    config: dict[str, Any]  # its config.pbtxt, as a ModelConfig dict
    python_model: str | None = None  # python_models/<name>/model.py to copy in, for a Python-backend model
    streams_text: bool = False  # its responses carry their exact text (output_text): postprocessing passes it on
    write_files: Callable[[Path], None] | None = None  # anything else it reads, written into its directory


def client_inputs() -> list[dict[str, Any]]:
    return [tensor(name, dtype, dims, optional=name not in REQUIRED_INPUTS) for name, dtype, dims, _ in CLIENT_INPUTS]


def client_outputs() -> list[dict[str, Any]]:
    return [tensor("text_output", "TYPE_STRING", [-1]), tensor("generation_logits", LOGITS_DATATYPE, [-1, -1, -1])]


def model_datatype(cfg: "BuildConfig") -> str:
    return _MODEL_DTYPES[cfg.dtype]


# --------------------------------------------------------------------------- shared models


def ensemble_config(cfg: "BuildConfig", *, text_from_model: bool) -> dict[str, Any]:
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


def preprocessing_config(cfg: "BuildConfig", *, tokenizer_dir: Path, end_id: int, pad_id: int,
                         limits: RequestLimits) -> dict[str, Any]:
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
            "limits": json.dumps(limits.to_dict()),
        }),
        "instance_group": [{"count": s.instance_count, "kind": "KIND_CPU"}],
    }


def postprocessing_config(cfg: "BuildConfig", *, tokenizer_dir: Path, detokenize: bool) -> dict[str, Any]:
    """``detokenize``: decode token ids (TensorRT-LLM); False when every response brings its text (torch)."""
    s = cfg.serving
    return {
        # No dynamic batcher: one response per execution. With one, the responses of a stream that queued while
        # the instance was busy ran as one batch and reached the client together (nv_inference_exec_count fell
        # below nv_inference_count; up to a whole 32-token answer in one burst under load).
        "name": "postprocessing", "backend": "python", "max_batch_size": s.max_batch_size,
        "input": [
            tensor("TOKENS_BATCH", "TYPE_INT32", [-1, -1]),
            tensor("SEQUENCE_LENGTH", "TYPE_INT32", [-1]),
            tensor("TEXT", "TYPE_STRING", [-1], optional=True),  # exact streamed text (torch runtime)
        ],
        "output": [tensor("OUTPUT", "TYPE_STRING", [-1])],
        "parameters": mc.parameters({"tokenizer_dir": tokenizer_dir, "skip_special_tokens": True,
                                     "detokenize": detokenize}),
        # One instance: the responses of a stream pass through it one by one, in order (with two, an
        # ensemble's consecutive responses are processed side by side and can arrive swapped).
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }


def bls_config(cfg: "BuildConfig", *, tokenizer_dir: Path, limits: RequestLimits, end_id: int,
               pad_id: int) -> dict[str, Any]:
    # Besides the ensemble's outputs, how many generated tokens each response stands for (a streamed response
    # may carry several): the name Triton's vLLM backend and OpenAI frontend use.
    outputs = [*client_outputs(), tensor(NUM_OUTPUT_TOKENS, "TYPE_INT32", [1])]
    return {
        "name": "tensorrt_llm_bls", "backend": "python", "max_batch_size": cfg.serving.max_batch_size,
        "model_transaction_policy": {"decoupled": True},
        "input": client_inputs(), "output": outputs,
        "parameters": mc.parameters({"tokenizer_dir": tokenizer_dir, "tensorrt_llm_model_name": "tensorrt_llm",
                                     "preprocessing_model_name": "preprocessing",
                                     # what preprocessing knows, for the short prompts the BLS tokenizes itself
                                     "end_id": end_id, "pad_id": pad_id,
                                     "limits": json.dumps(limits.to_dict())}),
        "instance_group": [{"count": cfg.serving.bls_instance_count, "kind": "KIND_CPU"}],
    }


# --------------------------------------------------------------------------- writing


def python_model_source(name: str) -> Path:
    """A Python-backend ``model.py`` shipped as package data under ``triton/python_models/``."""
    return Path(str(resources.files("trtllm_pipeline.triton") / "python_models" / name / "model.py"))


def write_repository(cfg: "BuildConfig", runtime: str, engine: EngineModel, out: Path, *, engine_dir: Path,
                     tokenizer_dir: Path, end_id: int, pad_id: int, limits: RequestLimits) -> dict[str, Any]:
    """Write the five models into ``out``; returns what was written, for the deploy manifest."""
    configs = {
        "ensemble": ensemble_config(cfg, text_from_model=engine.streams_text),
        "preprocessing": preprocessing_config(cfg, tokenizer_dir=tokenizer_dir, end_id=end_id, pad_id=pad_id,
                                              limits=limits),
        "postprocessing": postprocessing_config(cfg, tokenizer_dir=tokenizer_dir, detokenize=not engine.streams_text),
        "tensorrt_llm_bls": bls_config(cfg, tokenizer_dir=tokenizer_dir, limits=limits, end_id=end_id, pad_id=pad_id),
        "tensorrt_llm": engine.config,
    }
    sources = {name: name for name in MODELS if name not in ("ensemble", "tensorrt_llm")}
    if engine.python_model:
        sources["tensorrt_llm"] = engine.python_model
    for name in MODELS:
        mc.write(out / name, mc.build(configs[name]))
        version = out / name / "1"
        version.mkdir()
        if name in sources:
            shutil.copyfile(python_model_source(sources[name]), version / "model.py")
    if engine.write_files:
        engine.write_files(out / "tensorrt_llm")
    return {"models": list(MODELS), "runtime": runtime, "end_id": end_id, "pad_id": pad_id,
            "tokenizer_dir": str(tokenizer_dir), "engine_dir": str(engine_dir), "limits": limits.to_dict()}
