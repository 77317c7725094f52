"""Triton ``preprocessing``: prompt text to token ids, stop/bad words to word lists, end and pad ids.

Requests outside the engine's limits get an error response here, before any engine time is spent.
The work is ``trtllm_pipeline.triton.tensors.Preprocessor``; this file adapts it to Triton.
"""

try:  # the serving process's module path, before any package import (runtimes/torch_engine/backend.py)
    import serving_sys_path  # noqa: F401
except ImportError:  # a server this project did not start (TensorRT-LLM's container)
    pass

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from trtllm_pipeline.tokenizer import Tokenizer
from trtllm_pipeline.triton import health
from trtllm_pipeline.triton.contract import RequestLimits
from trtllm_pipeline.triton.tensors import Preprocessor, RequestError, string_parameters

OPTIONAL = {"stop_words": "STOP_WORDS_DICT", "bad_words": "BAD_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}


class TritonPythonModel:
    def initialize(self, args):
        health.mark_stub(Path(args["model_repository"]).parent, args["model_name"])  # its crash shows (health.lost)
        params = string_parameters(json.loads(args["model_config"]))
        self.preprocess = Preprocessor(
            Tokenizer(params["tokenizer_dir"]), end_id=int(params["end_id"]),
            pad_id=int(params["pad_id"]), limits=RequestLimits(**json.loads(params["limits"])))

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                outputs = self.preprocess(value("QUERY"), value("REQUEST_OUTPUT_LEN"),
                                          **{arg: value(name) for arg, name in OPTIONAL.items()})
            except RequestError as exc:  # the request's fault
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    str(exc), pb_utils.TritonError.INVALID_ARG)))
                continue
            except Exception as exc:  # a malformed tensor this code did not foresee: still this request's error
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    f"preprocessing failed: {type(exc).__name__}: {exc}")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]))
        return responses
