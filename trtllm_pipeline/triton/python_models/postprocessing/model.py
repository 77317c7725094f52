"""Triton ``postprocessing``: the text of each response.

With the torch runtime the engine model sends each response's exact text (``TEXT``, made by the
same incremental detokenizer as in-process generation) and it is passed on; no tokenizer is loaded
(``detokenize: false``). TensorRT-LLM's C++ backend sends token ids only: they are decoded here,
each response on its own.
"""

try:  # the serving process's module path, before any package import (runtimes/torch_engine/backend.py)
    import serving_sys_path  # noqa: F401
except ImportError:  # a server this project did not start (TensorRT-LLM's container)
    pass

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_pipeline.triton import health
from trtllm_pipeline.triton.tensors import decode_rows, string_parameters


class TritonPythonModel:
    def initialize(self, args):
        health.mark_stub(Path(args["model_repository"]).parent, args["model_name"])  # its crash shows (health.lost)
        params = string_parameters(json.loads(args["model_config"]))
        self.tokenizer = None
        if params["detokenize"] == "true":
            from trtllm_pipeline.tokenizer import Tokenizer

            self.tokenizer = Tokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            if text is not None:
                output = text.as_numpy()
            elif self.tokenizer is None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    "postprocessing got token ids without text, but was deployed without a tokenizer")))
                continue
            else:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                output = decode_rows(self.tokenizer, tokens, lengths)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.asarray(output, dtype=object))]))
        return responses
