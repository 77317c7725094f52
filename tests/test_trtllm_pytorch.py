"""The tensorrt_llm_pytorch backend against TensorRT-LLM's own interface (tests/fixtures/trtllm_pytorch_llmapi.json,
transcribed from its sources with file and commit), key by key; and what build, deploy and serve do with it here,
where TensorRT-LLM is not installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, REPO, free_ports, load, run_cli

from trtllm_pipeline.config import BACKEND_NEEDS, config_from_dict, load_yaml
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.trtllm import pytorch_deploy as tp
from trtllm_pipeline.triton import model_config as mc

FACTS = json.loads((REPO / "tests" / "fixtures" / "trtllm_pytorch_llmapi.json").read_text())
QUANT = json.loads((REPO / "tests" / "fixtures" / "trtllm_1_2_quant_formats.json").read_text())
SEVEN_B = sorted(p.stem for p in CONFIGS.glob("r1-distill-qwen-7b-*.yaml"))
NAME = "tiny-qwen2-fp8-tp1"


def with_backend(name: str, **runtime):
    data = load_yaml(CONFIGS / f"{name}.yaml")
    data["runtime"] = {**(data.get("runtime") or {}), "backend": "tensorrt_llm_pytorch", **runtime}
    return config_from_dict(data, name=name, path=CONFIGS / f"{name}.yaml")


def test_every_fact_has_its_source():
    for source in FACTS["provenance"].values():
        assert source.get("commit") or source.get("version") or source.get("file")
    assert set(tp.QUANT_ALGOS) == set(QUANT["quant_algo"]["quant_algo_list"])


def test_llmapi_config_pbtxt_is_upstreams_key_by_key():
    up = FACTS["config_pbtxt"]
    ours = mc.build(tp.llmapi_config())
    assert ours.name == up["name"] and ours.backend == up["backend"]
    assert [(g.count, mc.model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in ours.instance_group] == \
        [(g["count"], g["kind"]) for g in up["instance_group"]]
    assert [[t.name, mc.model_config_pb2.DataType.Name(t.data_type), list(t.dims), t.optional] for t in ours.input] == \
        up["inputs"]
    assert [[t.name, mc.model_config_pb2.DataType.Name(t.data_type), list(t.dims)] for t in ours.output] == up["outputs"]
    assert ours.max_batch_size == 0 and not ours.HasField("model_transaction_policy")  # model.yaml's, not here


@pytest.mark.parametrize("name", ["r1-distill-qwen-7b-fp8-tp4", "tiny-qwen2-fp8-tp1"])
def test_model_yaml_holds_llm_arguments_and_the_triton_config_model_py_reads(name):
    cfg = with_backend(name)
    doc = tp.model_yaml(cfg, "/models/x")
    up = FACTS["model_yaml"]
    llm_keys = set(FACTS["llm_args"]["keys"]) | set(up["llm_keys_from_upstream"])
    assert set(doc) - {"triton_config"} <= llm_keys
    assert set(up["llm_keys_from_upstream"]) <= set(doc)
    assert set(up["triton_config_required"]) <= set(doc["triton_config"])
    assert set(doc["triton_config"]) <= set(up["triton_config_required"]) | set(up["triton_config_optional"])
    assert doc["backend"] == up["upstream"]["backend"] == "pytorch"
    assert doc["tensor_parallel_size"] == cfg.parallelism.tp and doc["pipeline_parallel_size"] == 1
    assert (doc["max_batch_size"], doc["max_seq_len"], doc["max_num_tokens"]) == \
        (cfg.build.max_batch_size, cfg.build.max_seq_len, cfg.build.max_num_tokens)
    kv, fields = doc["kv_cache_config"], FACTS["kv_cache_config"]["fields"]
    assert set(kv) <= set(fields) and kv["dtype"] == fields["dtype"]
    low, high = FACTS["kv_cache_config"]["free_gpu_memory_fraction_range"]
    assert low <= kv["free_gpu_memory_fraction"] == cfg.runtime.kv_cache_free_gpu_mem_fraction <= high
    assert kv["enable_block_reuse"] is cfg.runtime.enable_kv_cache_reuse


def test_trtllm_serve_argv_uses_only_its_options():
    cfg = with_backend("r1-distill-qwen-7b-fp8-tp2", pytorch_deploy="trtllm_serve")
    argv = tp.trtllm_serve_argv(cfg, "/m", "/t", "/o.yaml", host="127.0.0.1", port=9000)
    assert argv[0] == "trtllm-serve" and argv[1] == "/m"  # MODEL, positional
    flags = [a for a in argv[2:] if a.startswith("--")]
    assert set(flags) <= set(FACTS["trtllm_serve"]["options"])
    values = dict(zip(argv[2::2], argv[3::2]))
    assert values["--tp_size"] == "2" and values["--backend"] == "pytorch" and values["--port"] == "9000"
    assert values["--extra_llm_api_options"] == "/o.yaml"
    assert set(tp.extra_llm_api_options(cfg)) <= set(FACTS["llm_args"]["keys"])


@pytest.mark.parametrize("name", SEVEN_B)
def test_the_7b_configs_validate_for_it_and_plan_without_tensorrt_llm(name, tmp_path):
    from trtllm_pipeline.build import plan

    if not load_yaml(CONFIGS / f"{name}.yaml")["quantization"].get("export_hf_checkpoint", True):
        # a torch-runtime benchmark build that skips the unified HF checkpoint (disk on the H200): refused, saying why
        with pytest.raises(InputError, match="export_hf_checkpoint: false"):
            plan(with_backend(name), engines_dir=tmp_path)
        return
    cfg = with_backend(name)
    assert cfg.runtime.backend == "tensorrt_llm_pytorch"
    lines = "\n".join(plan(cfg, engines_dir=tmp_path))
    assert "no engine is built" in lines and "TensorRT-LLM is not installed" in lines
    assert "--model-repository=" in lines  # the serve command, printed anywhere


def test_an_unknown_backend_is_refused_naming_what_each_needs():
    data = {**load_yaml(CONFIGS / f"{NAME}.yaml"), "runtime": {"backend": "tensorrt-llm"}}
    with pytest.raises(Exception) as refused:
        config_from_dict(data, name=NAME)
    assert all(needs in str(refused.value) for needs in BACKEND_NEEDS.values())


@pytest.fixture(scope="module")
def pytorch_engines(quantized, tmp_path_factory) -> Path:
    """The tiny FP8 checkpoints (TensorRT-LLM's and the unified HF one) in an engines directory of their own."""
    result = quantized(NAME)
    root = tmp_path_factory.mktemp("pytorch-engines")
    for part in ("checkpoint", "hf_checkpoint"):
        shutil.copytree(result.checkpoint_dir.parent / part, root / NAME / part, symlinks=True)
    return root


def test_the_unified_checkpoint_is_checked_as_the_llm_api_reads_it(pytorch_engines, tmp_path):
    cfg = with_backend(NAME)
    source = pytorch_engines / NAME / "hf_checkpoint"
    found = tp.check_hf_checkpoint(cfg, source)
    assert found["quant_algo"] == "FP8" and found["kv_cache_quant_algo"] is None
    reads = FACTS["hf_checkpoint"]
    assert set(reads["required_top_level"]) <= set(json.loads((source / reads["hf_quant_config_file"]).read_text()))
    broken = tmp_path / "hf"
    shutil.copytree(source, broken)
    quant = json.loads((broken / "hf_quant_config.json").read_text())
    quant["quantization"]["quant_algo"] = "W4A16_AWQ"
    (broken / "hf_quant_config.json").write_text(json.dumps(quant))
    with pytest.raises(InputError, match="asks for 'FP8'"):
        tp.check_hf_checkpoint(cfg, broken)
    (broken / "hf_quant_config.json").unlink()
    with pytest.raises(InputError, match="no hf_quant_config.json"):
        tp.check_hf_checkpoint(cfg, broken)


@pytest.mark.parametrize("flavour", ["triton_llmapi", "trtllm_serve"])
def test_build_deploy_and_serve_here(pytorch_engines, flavour, tmp_path):
    engines = tmp_path / "engines"
    shutil.copytree(pytorch_engines, engines, symlinks=True)
    cfg_file = tmp_path / f"{NAME}.yaml"
    data = load_yaml(CONFIGS / f"{NAME}.yaml")
    data["runtime"] = {**(data.get("runtime") or {}), "pytorch_deploy": flavour}
    cfg_file.write_text(yaml.safe_dump(data))
    common = ["-c", str(cfg_file), "--engines-dir", str(engines)]
    built = run_cli("build", *common, "--runtime", "tensorrt_llm_pytorch")
    assert built.returncode == 0, built.stderr
    manifest = json.loads((engines / NAME / "engine" / "manifest.json").read_text())
    assert manifest["runtime"] == "tensorrt_llm_pytorch" and "no trtllm-build" in manifest["engine"]["kind"]
    deployed = run_cli("deploy", *common)
    assert deployed.returncode == 0, deployed.stderr
    repo = engines / NAME / "triton_model_repo"
    if flavour == "triton_llmapi":
        doc = yaml.safe_load((repo / tp.LLMAPI_MODEL / "1" / tp.MODEL_YAML).read_text())
        assert doc["model"] == str(engines / NAME / "hf_checkpoint") and doc["triton_config"]["decoupled"] is True
        assert mc.read(repo / tp.LLMAPI_MODEL / "config.pbtxt").name == "tensorrt_llm"
    else:
        argv = json.loads((repo / tp.LAUNCH).read_text())["argv"]
        assert argv[:2] == ["trtllm-serve", str(engines / NAME / "hf_checkpoint")]
        assert yaml.safe_load((repo / tp.EXTRA_OPTIONS).read_text())["kv_cache_config"]["dtype"] == "auto"
    dry = run_cli("serve", *common, "--dry-run")
    assert dry.returncode == 0 and ("trtllm-serve" if flavour == "trtllm_serve" else "tritonserver") in dry.stdout
    ports = [a for flag, port in zip(("--http-port", "--grpc-port", "--metrics-port", "--openai-port"), free_ports(4))
             for a in (flag, str(port))]
    refused = run_cli("serve", *common, *ports, "--detach")
    assert refused.returncode == 3 and "TensorRT-LLM is not installed" in refused.stderr
    assert "Traceback" not in refused.stderr and "--runtime torch" in refused.stderr
    assert load(NAME).name == NAME
