"""The torch engine model's host (``triton/torch_server.TorchModelServer``) answering the BLS on its direct socket,
in-process on the tiny checkpoint (no Triton: the served path is test_serve's): a BLS request that asks for no text
and has no stop string keeps its token ids only (``_TokenIds``: nobody reads the engine's text) and streams
``direct.Tokens`` frames; one with a stop string still has its text cut in the engine; both give in-process
``generate``'s tokens."""

from __future__ import annotations

import types
import uuid

import numpy as np
import pytest

from trtllm_pipeline.runtimes.base import SamplingParams, TextStream
from trtllm_pipeline.triton import direct
from trtllm_pipeline.triton.contract import BLS_ID_PREFIX, BLS_PARAMETER
from trtllm_pipeline.triton.torch_server import TorchModelServer, _TokenIds

ENGINE_OUTPUTS = ["output_ids", "sequence_length", "generation_logits"]  # the BLS's (tensorrt_llm_bls/model.py)
PROMPT = [11, 23, 37, 41, 59, 61, 73]
# pb_utils without custom metrics: the server runs without them, as on a Python backend that has none
PB = types.SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, TritonError=RuntimeError)


@pytest.fixture(scope="module")
def runtime(quantized):
    from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

    ckpt = quantized("tiny-qwen2-bf16-tp1").checkpoint_dir
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=4, max_seq_len=256)
    yield rt
    rt.close()


def _inputs(max_tokens: int, stop_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    # TensorRT-LLM's word list: [ids, end offsets padded with -1]; preprocessing's empty one without a word
    words = (np.array([[stop_ids, [len(stop_ids)] + [-1] * (len(stop_ids) - 1)]], dtype=np.int32) if stop_ids
             else np.array([[[0], [-1]]], np.int32))
    return {"input_ids": np.array([PROMPT], dtype=np.int32), "input_lengths": np.array([[len(PROMPT)]], np.int32),
            "request_output_len": np.array([[max_tokens]], np.int32), "end_id": np.array([[-1]], np.int32),
            "pad_id": np.array([[0]], np.int32), "stop_words_list": words, "streaming": np.array([[True]]),
            "exclude_input_in_output": np.array([[True]])}


def _header(outputs=ENGINE_OUTPUTS) -> dict:
    return {"request_id": f"{BLS_ID_PREFIX}{uuid.uuid4().hex}", "outputs": outputs,
            "parameters": {BLS_PARAMETER: True}}


def _stream(where: str, header: dict, inputs: dict) -> list[tuple[dict, dict]]:
    sock = direct.open_stream(where, header, inputs)
    assert sock is not None
    return list(direct.responses(sock))


def test_a_bls_request_without_text_or_stop_strings_keeps_ids_only_and_streams_the_same_tokens(runtime):
    expected = runtime.generate([PROMPT], SamplingParams(max_tokens=12, end_id=-1))[0].token_ids
    # a stop string made of generated tokens 4..5: the engine must still cut there
    stop_ids = expected[4:6]
    stop_word = runtime.tokenizer.decode(stop_ids)
    stopped = runtime.generate([PROMPT], SamplingParams(max_tokens=12, end_id=-1, stop_words=(stop_word,)))[0]
    assert stop_word and stopped.finish_reason == "stop"
    where = f"\0trtllm-pipeline-test-{uuid.uuid4().hex}"
    server = TorchModelServer(runtime, PB, exclude_input_in_output=True, direct_address=where)
    try:
        plain = server._parse(direct.Request(_header(), _inputs(12)), sender=None)
        cut = server._parse(direct.Request(_header(), _inputs(12, stop_ids)), sender=None)
        texted = server._parse(direct.Request(_header(ENGINE_OUTPUTS + ["output_text"]), _inputs(12)), sender=None)
        assert isinstance(plain.rows[0].text, _TokenIds)
        assert isinstance(cut.rows[0].text, TextStream) and isinstance(texted.rows[0].text, TextStream)
        # one after the other: each alone in the batch, as in generate (a batch's shape may flip a near tie)
        results = {"plain": _stream(where, _header(), _inputs(12)),
                   "cut": _stream(where, _header(), _inputs(12, stop_ids))}
    finally:
        server.close()
    for name, want in (("plain", expected), ("cut", stopped.token_ids)):
        frames = results[name]
        assert frames[-1][0]["flags"] == direct.FINAL and not any("error" in h for h, _ in frames)
        got = [t for _, a in frames if "output_ids" in a
               for t in a["output_ids"].reshape(-1)[: int(a["sequence_length"].reshape(-1)[0])].tolist()]
        assert got == want, name
        assert all(set(a) <= {"output_ids", "sequence_length"} and a["output_ids"].dtype == np.int32
                   for _, a in frames)
