"""The Python side of TensorRT-LLM's tensor contract: prompts under the engine's limits, word lists."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_pipeline.chat import encode_prompt
from trtllm_pipeline.model.builtin import builtin_model_dir
from trtllm_pipeline.triton.contract import RequestLimits
from trtllm_pipeline.tokenizer import Tokenizer
from trtllm_pipeline.triton.tensors import Preprocessor, RequestError, decode_rows, word_list, words_from_list


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(builtin_model_dir("tiny-qwen2"))  # what preprocessing and postprocessing load


@pytest.fixture
def pre(tokenizer):
    limits = RequestLimits(max_input_tokens=16, max_seq_len=24, max_text_bytes=16 * 20, max_batch=8)
    return Preprocessor(tokenizer, end_id=tokenizer.eos_token_id, pad_id=tokenizer.eos_token_id, limits=limits)


def batch(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def test_word_list_is_tensorrt_llms_format_and_decodes_back(tokenizer):
    words = ["Question:", "\n\n", "naïve café"]
    lists = word_list(tokenizer, words)
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in words]
    flat = sum(ids, [])
    assert lists.shape == (2, len(flat)) and lists.dtype == np.int32
    assert lists[0].tolist() == flat
    ends = np.cumsum([len(x) for x in ids]).tolist()
    assert lists[1].tolist() == ends + [-1] * (len(flat) - len(ends))
    assert words_from_list(tokenizer, lists) == tuple(words)
    assert word_list(tokenizer, []).tolist() == [[0], [-1]]
    assert words_from_list(tokenizer, word_list(tokenizer, [""])) == ()


def test_preprocessing_matches_in_process_tokenization_and_pads_a_batch(pre, tokenizer):
    out = pre(batch("hello world, this is long", "hi"), np.array([[5], [3]], dtype=np.int32),
              stop_words=np.array([[b"Question:", b""], [b"", b""]], dtype=object))
    long_ids = encode_prompt(tokenizer, "hello world, this is long", raw=True)
    short_ids = encode_prompt(tokenizer, "hi", raw=True)
    assert out["INPUT_ID"][0].tolist() == long_ids
    assert out["INPUT_ID"][1].tolist() == short_ids + [tokenizer.eos_token_id] * (len(long_ids) - len(short_ids))
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(long_ids)], [len(short_ids)]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[5], [3]]
    assert out["STOP_WORDS_IDS"].shape[:2] == (2, 2)
    assert words_from_list(tokenizer, out["STOP_WORDS_IDS"][0]) == ("Question:",)
    assert words_from_list(tokenizer, out["STOP_WORDS_IDS"][1]) == ()
    assert out["OUT_END_ID"].tolist() == [[tokenizer.eos_token_id]] * 2
    custom = pre(batch("hi"), np.array([[1]], dtype=np.int32), end_id=np.array([[-1]], dtype=np.int32))
    assert custom["OUT_END_ID"].tolist() == [[-1]]


@pytest.mark.parametrize(("text", "max_tokens", "message"), [
    ("", 4, "empty"),
    ("hi", 0, "at least 1"),
    ("hi", -3, "at least 1"),
    ("word " * 40, 2, "at most 16"),
    ("hi there", 30, "max_seq_len of 24"),
])
def test_requests_outside_the_engine_limits_are_refused(pre, text, max_tokens, message):
    with pytest.raises(RequestError, match=message):
        pre(batch(text), np.array([[max_tokens]], dtype=np.int32))


def test_invalid_utf8_is_refused(pre):
    with pytest.raises(RequestError, match="UTF-8"):
        pre(np.array([[b"\xff\xfe"]], dtype=object), np.array([[2]], dtype=np.int32))


def test_postprocessing_decodes_each_row_to_its_length(tokenizer):
    ids = tokenizer.encode("the answer is 42", add_special_tokens=False)
    tokens = np.array([[ids + [0, 0]], [ids[:2] + [0] * (len(ids))]], dtype=np.int32)
    lengths = np.array([[len(ids)], [2]], dtype=np.int32)
    out = decode_rows(tokenizer, tokens, lengths)
    assert out.shape == (2, 1)
    assert out[0, 0].decode() == "the answer is 42"
    assert out[1, 0].decode() == tokenizer.decode(ids[:2])


def test_a_prompt_too_large_for_the_engine_is_refused_before_it_is_tokenized(pre, tokenizer, monkeypatch):
    calls = []
    monkeypatch.setattr(tokenizer, "encode", lambda *a, **k: calls.append(a) or [1])
    with pytest.raises(RequestError, match=r"text_input is 400000 bytes; this engine takes at most 16 tokens"):
        pre(batch("x" * 400_000), np.array([[2]], dtype=np.int32))
    assert not calls


@pytest.mark.parametrize("missing", ["text_input", "max_tokens"])
def test_missing_required_inputs_are_named(pre, missing):
    text, length = batch("hi"), np.array([[2]], dtype=np.int32)
    with pytest.raises(RequestError, match=f"{missing} is missing"):
        pre(None if missing == "text_input" else text, None if missing == "max_tokens" else length)


def test_too_many_stop_words_are_refused(pre):
    words = np.array([[f"w{i}".encode() for i in range(65)]], dtype=object)
    with pytest.raises(RequestError, match="65 entries; at most 64"):
        pre(batch("hi"), np.array([[2]], dtype=np.int32), stop_words=words)


def test_request_limits_follow_the_config():
    from conftest import load

    from trtllm_pipeline.triton.contract import request_limits

    limits = request_limits(load("tiny-qwen2-fp8-tp1"), max_token_bytes=95)
    assert (limits.max_input_tokens, limits.max_seq_len, limits.max_text_bytes) == (6144, 8192, 6144 * 95)
    assert limits.text_problem("text_input", 6144 * 95) is None
    assert "no text of more than" in limits.text_problem("text_input", 6144 * 95 + 1)
    assert limits.max_body_bytes > 6 * limits.max_text_bytes
