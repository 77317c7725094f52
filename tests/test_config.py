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


# --------------------------------------------------------------------------- hostile but fair inputs


def _load_text(tmp_path, text: str | bytes) -> ConfigError:
    path = tmp_path / "probe.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    return exc.value


BASE_YAML = (CONFIGS / "tiny-qwen2-fp8-tp1.yaml").read_text()


def test_a_duplicate_key_is_an_error_not_a_silent_override(tmp_path):
    err = _load_text(tmp_path, BASE_YAML.replace("  tp: 1\n", "  tp: 1\n  tp: 4\n"))
    assert "duplicate key 'tp'" in err.message and "line" in err.message


@pytest.mark.parametrize("data, where", [
    ("model: {source: café}\n".encode("latin-1"), "not UTF-8 text (byte 19, line 1"),
    (b"\x00\x01\x02\xff\xfe binary", "not UTF-8 text"),
    (b"\x00\x00\x00model: x", "not valid YAML"),
], ids=["latin-1", "binary", "nul-bytes"])
def test_non_utf8_and_binary_files_are_named_config_errors(tmp_path, data, where):
    assert where in _load_text(tmp_path, data).message


def test_an_anchor_bomb_is_refused_with_a_short_message(tmp_path):
    bomb = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    bomb += [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
             f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]" for i in range(8)]
    text = "\n".join(bomb) + "\nmodel: {source: builtin:tiny-qwen2}\nbuild: {extra_args: *i}\n"
    assert len(text) < 1000
    err = _load_text(tmp_path, text)
    assert "expands to more than" in err.message and len(str(err)) < 500


def test_error_messages_stay_short_whatever_the_value(tmp_path):
    err = _load_text(tmp_path, BASE_YAML + "bogus: " + "x" * 100_000 + "\n")
    assert len(str(err)) < 2000


@pytest.mark.parametrize("section, key, value, message", [
    ("build", "max_batch_size", 10**12, "less than or equal to 4096"),
    ("build", "max_seq_len", 10**9, "less than or equal to"),
    ("serving", "startup_timeout_s", float("inf"), "finite number"),
    ("serving", "startup_timeout_s", float("nan"), "finite number"),
    ("evaluation", "seed", 10**30, "less than or equal to 4294967295"),
    ("evaluation", "seed", -1, "greater than or equal to 0"),
    ("runtime", "kv_cache_free_gpu_mem_fraction", float("nan"), "finite number"),
])
def test_numbers_are_bounded_to_what_can_run(section, key, value, message):
    data = _base()
    data.setdefault(section, {})[key] = value
    assert message in _error(data)


@pytest.mark.parametrize("key, value", [("seed", 10**30), ("max_seq_len", 10**9), ("num_samples", 10**9)])
def test_calibration_numbers_are_bounded(key, value):
    data = _base()
    data["quantization"]["calibration"][key] = value
    assert f"quantization.calibration.{key}" in _error(data)


@pytest.mark.parametrize("source", ["foo/bar;touch /tmp/x", "a b", "$(id)", "org/name/extra"])
def test_a_model_source_must_be_a_hub_id_a_directory_or_builtin(source):
    data = _base()
    data["model"]["source"] = source
    assert "is not a hub id" in _error(data)


def test_a_calibration_dataset_must_be_a_hub_id_or_a_path():
    data = _base()
    data["quantization"]["calibration"]["dataset"] = "x; rm -rf ~"
    assert "is not a hub dataset id" in _error(data)


@pytest.mark.parametrize("section, key, value, words", [
    ("runtime", "kernel_cache_dir", "/tmp/a\0b", "NUL"),
    ("runtime", "kernel_cache_dir", "", "not empty"),
    ("serving", "host", "", "not an IP address or a host name"),
    ("serving", "host", "evil host", "not an IP address or a host name"),
    ("serving", "allowed_hosts", ["ok.example", "bad host"], "not an IP address or a host name"),
    ("runtime", "graph_batch_sizes", [1, 2, 64], "exceed build.max_batch_size"),
])
def test_hostile_values_are_config_errors_naming_the_key(section, key, value, words):
    data = _base()
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError, match=words) as exc:
        config_from_dict(data, name="hostile")
    assert f"{section}.{key}" in str(exc.value) or key in str(exc.value)


def test_valid_hosts_pass():
    for host in ("127.0.0.1", "::1", "0.0.0.0", "localhost", "gpu-node-3.example.org"):
        data = _base()
        data["serving"] = {"host": host, "allowed_hosts": ["my-box"]}
        assert config_from_dict(data, name="ok").serving.host == host


def test_deeply_nested_yaml_is_a_config_error_not_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    proc = run_cli("build", "-c", str(deep), "--dry-run")
    assert proc.returncode == 2 and "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr


def test_a_model_check_fails_the_same_in_build_and_serve_dry_runs(tmp_path):
    cfg = tmp_path / "awq.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"source": "builtin:tiny-qwen2"},
                                   "quantization": {"format": "int4_awq", "awq_block_size": 1024}}))
    for command in ("build", "serve"):
        proc = run_cli(command, "-c", str(cfg), "--dry-run", "--engines-dir", str(tmp_path / "engines"))
        assert proc.returncode == 2 and "awq_block_size" in proc.stderr, (command, proc.stderr)


def test_calibration_dtype_is_the_machines_unless_set_and_a_bad_one_is_named():
    from trtllm_pipeline.quantize import calibration_dtype

    cfg = load("tiny-qwen2-fp8-tp1")
    assert cfg.quantization.calibration.dtype == "auto" and calibration_dtype(cfg) == "float32"  # (a CPU here)
    pinned = cfg.with_section("quantization.calibration", dtype="bfloat16")
    assert calibration_dtype(pinned) == "bfloat16" and pinned.quantization.calibration.num_samples == \
        cfg.quantization.calibration.num_samples
    assert cfg.with_section("quantization.calibration", dtype=None) is cfg
    data = _base()
    data["quantization"]["calibration"]["dtype"] = "float8"
    assert "quantization.calibration.dtype" in _error(data)
