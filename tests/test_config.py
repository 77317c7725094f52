"""Build configs: every shipped file validates; bad ones fail with file, field and fix (exit 2)."""

from __future__ import annotations

import pytest
import yaml

from conftest import CONFIGS, load, run_cli
from trtllm_pipeline.config import check_against_model, config_from_dict, load_config
from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.model.catalog import KNOWN_MODELS

SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
R1_7B = KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]


def test_ships_the_required_configs():
    for name in ["r1-distill-qwen-7b-bf16-tp1", "r1-distill-qwen-7b-fp8-tp1", "r1-distill-qwen-7b-fp8-tp2",
                 "r1-distill-qwen-7b-fp8-tp4", "r1-distill-qwen-1.5b-fp8-tp1", "tiny-qwen2-bf16-tp1",
                 "tiny-qwen2-fp8-tp1", "tiny-qwen2-fp8-tp2", "tiny-qwen2-fp8-tp4"]:
        assert name in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_validates(name):
    cfg = load(name)
    assert cfg.name == name
    assert cfg.build.max_seq_len < 131072, "never the model's 131072-position default"


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_7b_fp8_configs_carry_the_reference_recipe(tp):
    cfg = load(f"r1-distill-qwen-7b-fp8-tp{tp}")
    check_against_model(cfg, R1_7B)
    assert cfg.quantization.format == "fp8" and cfg.quantization.kv_cache == "none"
    assert cfg.build.plugins.low_latency_gemm_plugin == "fp8"
    assert cfg.build.kv_cache_type == "paged"
    assert cfg.parallelism.tp == tp
    # ~1,700-token reasoning outputs on top of the prompt must fit; 131072 would waste KV memory.
    assert cfg.build.max_input_len + 1700 <= cfg.build.max_seq_len <= 16384
    cal = cfg.quantization.calibration
    assert (cal.dataset, cal.resolved_subset, cal.num_samples, cal.max_seq_len) == ("abisee/cnn_dailymail", "3.0.0", 512, 512)


def _base() -> dict:
    return yaml.safe_load((CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text())


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data, name="t", path=CONFIGS / "t.yaml")
    return str(exc.value)


def test_unknown_key_names_file_field_and_suggestion():
    data = _base()
    data["build"]["max_batch_sise"] = 4
    msg = _error(data)
    assert "t.yaml" in msg and "build.max_batch_sise" in msg and "did you mean 'max_batch_size'" in msg


def test_wrong_type_is_not_coerced():
    data = _base()
    data["build"]["max_batch_size"] = "8"
    msg = _error(data)
    assert "build.max_batch_size" in msg and "'8'" in msg


def test_unknown_quantization_format():
    data = _base()
    data["quantization"]["format"] = "fp9"
    assert "not a ModelOpt quantization format" in _error(data)


def test_awq_block_size_only_with_awq():
    data = _base()  # fp8: no INT4 blocks (every format and its checks: test_formats.py)
    data["quantization"]["awq_block_size"] = 64
    assert "awq_block_size applies to int4_awq and w4a8_awq only" in _error(data)


def test_low_latency_gemm_without_fp8():
    data = _base()
    data["quantization"]["format"] = "none"
    data["build"]["plugins"]["low_latency_gemm_plugin"] = "fp8"
    msg = _error(data)
    assert "low_latency_gemm_plugin" in msg and "quantization.format: fp8" in msg


def test_tp_must_divide_attention_heads():
    cfg = config_from_dict(_base() | {"parallelism": {"tp": 8}}, name="t")
    with pytest.raises(ConfigError, match=r"does not divide the model's 28 attention heads.*tp in \[1, 2, 4, 28\]"):
        check_against_model(cfg, R1_7B)


def test_kv_heads_must_spread_over_tp():
    cfg = config_from_dict(_base() | {"parallelism": {"tp": 7}}, name="t")
    with pytest.raises(ConfigError, match="4 KV heads cannot be spread over 7 ranks"):
        check_against_model(cfg, R1_7B)


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  source: builtin:tiny-qwen2\n build: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML \(line \d+"):
        load_config(bad)


def test_cli_config_error_exits_2_without_traceback_or_output(tmp_path):
    bad = tmp_path / "broken.yaml"
    data = _base()
    data["quantization"]["calibration"]["num_sampels"] = 3
    bad.write_text(yaml.safe_dump(data))
    engines = tmp_path / "engines"
    proc = run_cli("quantize", "-c", str(bad), "--engines-dir", str(engines))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "quantization.calibration.num_sampels" in proc.stderr and "num_samples" in proc.stderr
    assert not engines.exists()


def test_cli_missing_config_suggests_nearby(tmp_path):
    proc = run_cli("quantize", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp3.yaml"))
    assert proc.returncode == 2 and "did you mean" in proc.stderr and "Traceback" not in proc.stderr
