"""Built-in models: the random-weight 7B/1.5B are written like the tiny one, and configs that name
them validate without generating 15 GB."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from conftest import CONFIGS, run_cli
from trtllm_pipeline.model import builtin
from trtllm_pipeline.model.catalog import KNOWN_MODELS, ModelShape


def test_random_models_are_drawn_and_written_like_the_tiny_model(tmp_path, monkeypatch):
    tiny = builtin.builtin_model_dir(builtin.TINY_QWEN2)
    monkeypatch.setattr(builtin, "SHARD_BYTES", 1 << 20)  # several shards from a small model
    builtin.write_random_qwen2(tmp_path, ModelShape.from_model_dir(tiny), builtin.TINY_QWEN2_SEED)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all(f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    written = {}
    for f in files:
        written.update(load_file(str(tmp_path / f)))
    reference = load_file(str(tiny / "model.safetensors"))  # drawn by HF's model class, same rule
    assert sorted(written) == sorted(reference) == sorted(index["weight_map"])
    assert all(torch.equal(written[k], reference[k]) for k in reference)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in written.values())
    assert ModelShape.from_model_dir(tmp_path) == ModelShape.from_model_dir(tiny)


def test_random_7b_config_validates_and_plans_without_generating_weights(tmp_path):
    proc = run_cli("build", "-c", str(CONFIGS / "r1-distill-qwen-7b-random-fp8-tp1.yaml"), "--dry-run",
                   "--engines-dir", str(tmp_path / "engines"), env={"TRTLLM_PIPELINE_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "cache" / "models").exists()  # the plan read the catalog's shape, drew nothing
    shape = builtin.builtin_shape("random-r1-distill-qwen-7b")
    assert shape == KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]
    assert builtin.qwen2_tensor_shapes(shape)["model.layers.27.self_attn.k_proj.weight"] == (512, 3584)
    assert sum(torch.Size(s).numel() for s in builtin.qwen2_tensor_shapes(shape).values()) == shape.num_params
