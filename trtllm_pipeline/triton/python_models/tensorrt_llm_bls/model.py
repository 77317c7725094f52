"""Triton ``tensorrt_llm_bls``: the ensemble's pipeline driven from Python (business logic scripting).

Same client contract as ``ensemble``. It calls ``preprocessing`` and then ``tensorrt_llm`` and, as
it sees a request's whole stream, detokenizes with a ``TextStream``: streamed text is exact for
either runtime (TensorRT-LLM's C++ backend included), stop strings are cut as text. One prompt
per request; each request runs in its own thread so that requests overlap. The tokenizer (and
with it transformers and torch) loads on the first request: a deployment used through the
ensemble does not pay for it at startup.
"""

try:  # the serving process's module path, before any package import (runtimes/torch_backend.py)
    import serving_sys_path  # noqa: F401
except ImportError:  # a server this project did not start (TensorRT-LLM's container)
    pass

import functools
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_pipeline.runtimes import TextStream
from trtllm_pipeline.triton.contract import CLIENT_INPUTS, PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS
from trtllm_pipeline.triton.tensors import per_row, string_parameters, texts

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
ENGINE_OUTPUTS = ["output_ids", "sequence_length", "generation_logits"]


class TritonPythonModel:
    def initialize(self, args):
        params = string_parameters(json.loads(args["model_config"]))
        self.tokenizer_dir = params["tokenizer_dir"]
        self.engine_model = params["tensorrt_llm_model_name"]
        self.preprocessing_model = params["preprocessing_model_name"]

    @functools.cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def execute(self, requests):
        for request in requests:
            inputs = {t.name(): t.as_numpy() for t in request.inputs()}
            sender = request.get_response_sender()
            threading.Thread(target=self.run, args=(inputs, sender), daemon=True).start()
        return None

    def run(self, inputs, sender):
        try:
            self.generate(inputs, sender)
        except Exception as exc:  # an answer for the client, whatever failed
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                        flags=FINAL)

    def generate(self, inputs, sender):
        if inputs["text_input"].shape[0] != 1:
            raise ValueError("tensorrt_llm_bls takes one prompt per request")
        pre_inputs = {PREPROCESSING_INPUTS[k]: v for k, v in inputs.items() if k in PREPROCESSING_INPUTS}
        response = self.request(self.preprocessing_model, list(PREPROCESSING_OUTPUTS), pre_inputs).exec()
        if response.has_error():
            raise ValueError(response.error().message())
        engine = {PREPROCESSING_OUTPUTS[name]: pb_utils.get_output_tensor_by_name(response, name).as_numpy()
                  for name in PREPROCESSING_OUTPUTS}
        engine.update({trt: inputs[name] for name, _, _, trt in CLIENT_INPUTS if trt and name in inputs})
        engine["exclude_input_in_output"] = np.array([[True]])  # the prompt's text is added here, if asked
        streaming = per_row(inputs.get("stream"), 1, False)[0]
        exclude = per_row(inputs.get("exclude_input_in_output"), 1, True)[0]
        stop_words = texts(inputs["stop_words"].reshape(-1, 1), "stop_words") if "stop_words" in inputs else []
        text = TextStream(self.tokenizer, stop_words)
        prompt = engine["input_ids"][0, : int(engine["input_lengths"].reshape(-1)[0])].tolist()
        prefix = "" if exclude else self.tokenizer.decode(prompt, skip_special_tokens=True)
        logits = None
        for response in self.request(self.engine_model, ENGINE_OUTPUTS, engine).exec(decoupled=True):
            if response.has_error():
                raise ValueError(response.error().message())
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids is None:  # an empty final response
                continue
            n = int(pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy().reshape(-1)[0])
            piece = text.push(ids.as_numpy().reshape(-1)[:n].tolist())
            found = pb_utils.get_output_tensor_by_name(response, "generation_logits")
            logits = found.as_numpy() if found is not None else logits
            if streaming:
                self.send(sender, prefix + piece, logits if found is not None else None)
                prefix = ""
        tail = text.flush()
        if not streaming:
            self.send(sender, prefix + text.text, logits, final=True)
        elif tail:
            self.send(sender, tail, None, final=True)
        else:
            sender.send(flags=FINAL)

    def request(self, model, outputs, tensors):
        return pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs,
                                         inputs=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    def send(self, sender, piece, logits, final=False):
        outputs = [pb_utils.Tensor("text_output", np.array([[piece.encode("utf-8")]], dtype=object))]
        if logits is not None:
            outputs.append(pb_utils.Tensor("generation_logits", logits))
        sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL if final else 0)
