"""The client without a server: unreachable servers, parameters, where `--url default` points, templating."""

from __future__ import annotations

import pytest
from conftest import free_ports, load, run_cli
from transformers import AutoTokenizer

from trtllm_pipeline import client, endpoints
from trtllm_pipeline.model.builtin import builtin_model_dir
from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.chat import encode_prompt, served_prompt


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_unreachable_server_is_unavailable_not_a_traceback(protocol):
    (port,) = free_ports(1)
    with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}"):
        client.TritonClient(f"127.0.0.1:{port}", protocol)


def test_cli_generate_url_without_a_server_exits_3():
    (port,) = free_ports(1)
    result = run_cli("generate", "hello", "--url", f"127.0.0.1:{port}", "--raw")
    assert result.returncode == 3, result.stderr
    assert "cannot reach" in result.stderr and "Traceback" not in result.stderr


def test_unknown_parameters_are_named():
    with pytest.raises(InputError, match="temprature"):
        client.TritonClient._values("hi", {"temprature": 0.5}, stream=False)
    values = client.TritonClient._values("hi", {"stop_words": ("a", "b"), "top_k": None}, stream=True)
    assert values == {"text_input": "hi", "max_tokens": client.DEFAULT_MAX_TOKENS, "stream": True,
                      "stop_words": ["a", "b"]}


def test_url_default_is_the_configs_serving_address(tmp_path):
    cfg = load("tiny-qwen2-fp8-tp1")
    assert endpoints.resolve_url("default", "grpc", cfg, tmp_path) == "127.0.0.1:8001"
    assert endpoints.resolve_url("default", "http", cfg, tmp_path) == "127.0.0.1:8000"
    assert endpoints.resolve_url("10.0.0.5:9001", "grpc", None) == "10.0.0.5:9001"
    with pytest.raises(InputError, match="-c"):
        endpoints.resolve_url("default", "grpc", None)


def test_served_prompt_tokenizes_on_the_server_as_in_process():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir("tiny-qwen2"))
    text = served_prompt(tokenizer, "What is 2+2?", system="Be brief.")
    # The server adds the special tokens itself (BOS), as preprocessing does.
    assert tokenizer.encode(text, add_special_tokens=True) == encode_prompt(tokenizer, "What is 2+2?", raw=False,
                                                                            system="Be brief.")
