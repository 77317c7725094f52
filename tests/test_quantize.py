"""The quantize stage: real ModelOpt FP8 PTQ of the built-in model, TensorRT-LLM export per TP, cache."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from conftest import CONFIGS, load, run_cli
from trtllm_pipeline import artifacts, checkpoint
from trtllm_pipeline.config import config_from_dict
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.quantize import quantize

HF_TO_TRT = {
    "self_attn.o_proj": "attention.dense",
    "mlp.gate_proj": "mlp.fc",
    "mlp.up_proj": "mlp.gate",
    "mlp.down_proj": "mlp.proj",
}
E4M3_REL = 2.0**-4  # half an ulp of a 3-bit mantissa, relative
E4M3_SUBNORMAL = 2.0**-9  # smallest E4M3 step, in units of the scale


def _hf_weights(result) -> dict:
    model_dir = result.manifest["source"]["model_dir"]
    return load_file(os.path.join(model_dir, "model.safetensors"))


def _dequantized(tensors: dict, name: str) -> torch.Tensor:
    w = tensors[name + ".weight"]
    if w.dtype == torch.float8_e4m3fn:
        return w.float() * tensors[name + ".weights_scaling_factor"].float()
    return w.float()


def test_fp8_tp2_checkpoint_layout(quantized):
    result = quantized("tiny-qwen2-fp8-tp2")
    ckpt = result.checkpoint_dir
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architecture"] == "Qwen2ForCausalLM"
    assert config["quantization"]["quant_algo"] == "FP8"
    assert config["quantization"]["kv_cache_quant_algo"] is None
    assert config["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert config["rotary_base"] == 10000.0 and config["qwen_type"] == "qwen2" and config["rank"] == 0
    assert sorted(p.name for p in ckpt.glob("rank*.safetensors")) == ["rank0.safetensors", "rank1.safetensors"]
    for rank in range(2):
        tensors = load_file(ckpt / f"rank{rank}.safetensors")
        for module in checkpoint.LINEAR_MODULES:
            prefix = f"transformer.layers.0.{module}"
            assert tensors[prefix + ".weight"].dtype == torch.float8_e4m3fn
            for scale in ("weights_scaling_factor", "activation_scaling_factor"):
                value = tensors[f"{prefix}.{scale}"]
                assert value.dtype == torch.float32 and torch.isfinite(value).all() and (value > 0).all()
    # Manifest: resolved model directory, hashes, versions, unified HF checkpoint alongside.
    manifest = result.manifest
    assert os.path.isdir(manifest["source"]["model_dir"])
    assert manifest["inputs"]["model"]["content_sha256"] and manifest["versions"]["nvidia-modelopt"]
    assert (result.hf_checkpoint_dir / "hf_quant_config.json").is_file()
    assert (ckpt / "tokenizer" / "tokenizer.json").is_file()


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_rank_shapes_follow_tensor_parallel_rules(quantized, tp):
    ckpt = quantized(f"tiny-qwen2-fp8-tp{tp}").checkpoint_dir
    layout = checkpoint.CheckpointLayout(checkpoint.read_config(ckpt))
    hd, kv_per_rank = layout.head_size, max(1, layout.kv_heads // tp)
    shards = [load_file(ckpt / f"rank{r}.safetensors") for r in range(tp)]
    p = "transformer.layers.0."
    for s in shards:
        assert s[p + "attention.qkv.weight"].shape == ((layout.heads // tp + 2 * kv_per_rank) * hd, layout.hidden)
        assert s[p + "mlp.fc.weight"].shape == (layout.intermediate // tp, layout.hidden)  # split by output rows
        assert s[p + "mlp.proj.weight"].shape == (layout.hidden, layout.intermediate // tp)  # split by input cols
        assert s[p + "attention.dense.weight"].shape == (layout.hidden, layout.heads * hd // tp)
    if tp > layout.kv_heads:  # 2 KV heads over 4 ranks: each KV head is held by two ranks
        q = layout.heads // tp * hd
        kv = lambda r: s_view(shards[r][p + "attention.qkv.weight"])[q:]
        assert torch.equal(kv(0), kv(1)) and torch.equal(kv(2), kv(3)) and not torch.equal(kv(0), kv(2))


def s_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp8_shards_reassemble_to_the_hf_weights(quantized, tp):
    result = quantized(f"tiny-qwen2-fp8-tp{tp}")
    hf = _hf_weights(result)
    _, merged = checkpoint.load_checkpoint(result.checkpoint_dir)
    layers = checkpoint.CheckpointLayout(checkpoint.read_config(result.checkpoint_dir)).layers
    for i in range(layers):
        pairs = {f"transformer.layers.{i}.{trt}": hf[f"model.layers.{i}.{src}.weight"] for src, trt in HF_TO_TRT.items()}
        a = f"model.layers.{i}.self_attn."
        pairs[f"transformer.layers.{i}.attention.qkv"] = torch.cat([hf[a + "q_proj.weight"], hf[a + "k_proj.weight"],
                                                                   hf[a + "v_proj.weight"]])
        for name, want in pairs.items():
            got, want = _dequantized(merged, name), want.float()
            scale = merged[name + ".weights_scaling_factor"].float()
            # FP8 rounding; q/k/v and fc/gate share the largest of their scales, which costs at most
            # one more rounding step for the re-quantized parts.
            bound = 2 * (want.abs() * E4M3_REL + scale * E4M3_SUBNORMAL)
            assert torch.all((got - want).abs() <= bound), name
            assert torch.allclose(got, want, rtol=0.13, atol=float(scale) * 2)
    assert torch.equal(merged["lm_head.weight"], hf["lm_head.weight"])  # not quantized
    assert torch.equal(merged["transformer.vocab_embedding.weight"], hf["model.embed_tokens.weight"])


def test_bf16_exports_the_exact_hf_weights(quantized):
    result = quantized("tiny-qwen2-bf16-tp1")
    assert result.hf_checkpoint_dir is None  # nothing quantized: the source is the HF checkpoint
    hf = _hf_weights(result)
    config, merged = checkpoint.load_checkpoint(result.checkpoint_dir)
    assert config["quantization"]["quant_algo"] is None
    for i in range(config["num_hidden_layers"]):
        for src, trt in HF_TO_TRT.items():
            assert torch.equal(merged[f"transformer.layers.{i}.{trt}.weight"], hf[f"model.layers.{i}.{src}.weight"])
        a = f"model.layers.{i}.self_attn."
        qkv = torch.cat([hf[a + f"{x}_proj.weight"] for x in "qkv"])
        assert torch.equal(merged[f"transformer.layers.{i}.attention.qkv.weight"], qkv)
        assert torch.equal(merged[f"transformer.layers.{i}.attention.qkv.bias"],
                           torch.cat([hf[a + f"{x}_proj.bias"] for x in "qkv"]))
    assert torch.equal(merged["transformer.ln_f.weight"], hf["model.norm.weight"])


def test_unchanged_inputs_are_a_cache_hit(quantized, engines_dir):
    first = quantized("tiny-qwen2-fp8-tp1")
    stamp = (first.checkpoint_dir / "rank0.safetensors").stat().st_mtime_ns
    again = quantize(load("tiny-qwen2-fp8-tp1"), engines_dir=engines_dir)
    assert again.cache_hit and again.manifest["inputs_hash"] == first.manifest["inputs_hash"]
    assert (first.checkpoint_dir / "rank0.safetensors").stat().st_mtime_ns == stamp


def test_calibration_change_requantizes(tmp_path):
    data = yaml.safe_load((CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text())
    first = quantize(config_from_dict(data, name="t"), engines_dir=tmp_path)
    data["quantization"]["calibration"]["num_samples"] = 8
    second = quantize(config_from_dict(data, name="t"), engines_dir=tmp_path)
    assert not first.cache_hit and not second.cache_hit
    assert second.manifest["inputs_hash"] != first.manifest["inputs_hash"]
    assert quantize(config_from_dict(data, name="t"), engines_dir=tmp_path).cache_hit


def test_local_jsonl_calibration_with_text_column(tmp_path, data_dir):
    data = yaml.safe_load((CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text())
    data["quantization"]["calibration"] = {"dataset": str(data_dir / "gsm8k" / "train.jsonl"),
                                           "text_column": "question", "num_samples": 8, "max_seq_len": 64}
    result = quantize(config_from_dict(data, name="local"), engines_dir=tmp_path)
    recorded = result.manifest["inputs"]["calibration_data"]
    assert recorded["text_column"] == "question" and len(recorded["content_sha256"]) == 64
    data["quantization"]["calibration"]["text_column"] = "article"
    with pytest.raises(InputError, match=r"has no column 'article'; it has \['question', 'answer'\]"):
        quantize(config_from_dict(data, name="local"), engines_dir=tmp_path)


def _copy_checkpoint(quantized, tmp_path, name="tiny-qwen2-fp8-tp2"):
    """A private copy of a quantized build to damage (the session's copy stays intact)."""
    import shutil

    shutil.copytree(quantized(name).checkpoint_dir.parent, tmp_path / name)
    return tmp_path / name / "checkpoint"


def test_truncated_shard_is_named(quantized, tmp_path):
    ckpt = _copy_checkpoint(quantized, tmp_path)
    blob = (ckpt / "rank1.safetensors").read_bytes()
    (ckpt / "rank1.safetensors").write_bytes(blob[: len(blob) // 2])
    proc = run_cli("build", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp2.yaml"), "--engines-dir", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rank1.safetensors" in proc.stderr and "truncated" in proc.stderr


@pytest.mark.parametrize("damage", ["wrong_dtype", "missing_scale"])
def test_damaged_tensor_is_named(quantized, tmp_path, damage):
    ckpt = _copy_checkpoint(quantized, tmp_path)
    tensors = load_file(ckpt / "rank0.safetensors")
    name = "transformer.layers.1.mlp.proj"
    if damage == "wrong_dtype":
        tensors[name + ".weight"] = tensors[name + ".weight"].to(torch.bfloat16)
        expect = f"{name}.weight is torch.bfloat16, expected torch.float8_e4m3fn"
    else:
        del tensors[name + ".activation_scaling_factor"]
        expect = f"{name}.activation_scaling_factor is missing"
    save_file(tensors, ckpt / "rank0.safetensors")
    proc = run_cli("build", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp2.yaml"), "--engines-dir", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rank0.safetensors" in proc.stderr and expect in proc.stderr


def test_interrupted_write_leaves_nothing_complete(tmp_path):
    final = tmp_path / "checkpoint"
    with pytest.raises(RuntimeError):
        with artifacts.atomic_dir(final) as tmp:
            (tmp / "rank0.safetensors").write_bytes(b"partial")
            raise RuntimeError("killed")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    # A temporary directory left by a process that died is swept by the next writer.
    stale = tmp_path / ".checkpoint.tmp-999999999-1"
    stale.mkdir()
    with artifacts.atomic_dir(final) as tmp:
        (tmp / "x").write_text("ok")
    assert not stale.exists() and artifacts.read_manifest(final) is None  # no manifest: not complete


def test_7b_dry_run_and_offline_failure(tmp_path):
    cfg = str(CONFIGS / "r1-distill-qwen-7b-fp8-tp4.yaml")
    dry = run_cli("quantize", "-c", cfg, "--dry-run", "--engines-dir", str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    assert "28 layers, 28 heads, 4 KV heads" in dry.stdout and "tp=4" in dry.stdout
    assert "abisee/cnn_dailymail (3.0.0)" in dry.stdout and "512 samples x 512 tokens" in dry.stdout
    real = run_cli("quantize", "-c", cfg, "--engines-dir", str(tmp_path),
                   env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert real.returncode == 3 and "Traceback" not in real.stderr
    assert "not in the local Hugging Face cache" in real.stderr and "Fix:" in real.stderr
    assert not (tmp_path / "r1-distill-qwen-7b-fp8-tp4").exists()


# --------------------------------------------------------------------------- what is loaded, what is left behind


class _Payload:
    """Unpickling this creates ``path``: proof that a pickle was loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _local_model(tmp_path, weights_as: str | None, pickle_marker=None):
    import pickle
    import shutil

    from trtllm_pipeline.model.builtin import builtin_model_dir

    model = tmp_path / "model"
    shutil.copytree(builtin_model_dir("tiny-qwen2"), model)
    if weights_as is None:
        (model / "model.safetensors").unlink()
    elif weights_as != "model.safetensors":
        (model / "model.safetensors").rename(model / weights_as)
    if pickle_marker is not None:
        (model / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(pickle_marker)))
    data = yaml.safe_load((CONFIGS / "tiny-qwen2-bf16-tp1.yaml").read_text())
    data["model"]["source"] = str(model)
    return config_from_dict(data, name="local")


@pytest.mark.parametrize("weights_as, message", [
    ("unrelated.safetensors", "are not the model's weights"),  # the probe: safetensors beside a pickle
    (None, "only pickled weights (pytorch_model.bin), which are never loaded"),
])
def test_pickled_weights_are_refused_with_the_fix(tmp_path, weights_as, message):
    marker = tmp_path / "unpickled"
    cfg = _local_model(tmp_path, weights_as, pickle_marker=marker)
    with pytest.raises(InputError, match="no model.safetensors") as exc:
        quantize(cfg, engines_dir=tmp_path / "engines")
    assert message in exc.value.message and "safe_serialization=True" in exc.value.fix
    assert not marker.exists()


def test_pickles_beside_safetensors_weights_are_ignored_and_reported(tmp_path, caplog):
    marker = tmp_path / "unpickled"
    cfg = _local_model(tmp_path, "model.safetensors", pickle_marker=marker)
    with caplog.at_level("WARNING"):
        result = quantize(cfg, engines_dir=tmp_path / "engines")
    assert not result.cache_hit and not marker.exists()
    assert any("ignoring pickled files" in r.message and "pytorch_model.bin" in r.message for r in caplog.records)
    assert "pytorch_model.bin" not in result.manifest["inputs"]["model"]["files"]


def test_temporaries_of_killed_runs_go_on_the_next_run_cache_hit_or_not(quantized, engines_dir):
    root = quantized("tiny-qwen2-fp8-tp1").checkpoint_dir.parent
    dead = root / ".checkpoint.tmp-999999999-1"  # its process is gone
    reused = root / f".checkpoint.tmp-{os.getpid()}-2"  # its PID now belongs to a process started after it
    ours = root / f".checkpoint.tmp-{os.getpid()}-3"  # a live run's, written now: kept
    partial_eval = root / "eval" / ".mmlu.json.tmp-999999999"
    for path in (dead, reused, ours):
        path.mkdir()
    partial_eval.parent.mkdir(exist_ok=True)
    partial_eval.write_text("{")
    os.utime(reused, (1_000_000, 1_000_000))
    try:
        assert quantize(load("tiny-qwen2-fp8-tp1"), engines_dir=engines_dir).cache_hit
        assert not dead.exists() and not reused.exists() and not partial_eval.exists()
        assert ours.exists()
    finally:
        ours.rmdir()


def test_a_missing_local_calibration_file_is_not_tried_on_the_hub(tmp_path):
    data = yaml.safe_load((CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text())
    data["quantization"]["calibration"]["dataset"] = "./no/such/calibration.jsonl"
    with pytest.raises(InputError, match="does not exist .a local path, so it is not looked up on the hub"):
        quantize(config_from_dict(data, name="t"), engines_dir=tmp_path)
