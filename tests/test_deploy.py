"""deploy: the Triton model repository, parsed as Triton parses it, for both runtimes."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, load, run_cli
from google.protobuf import json_format
from transformers import AutoTokenizer

from trtllm_pipeline import deploy as stage
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.triton import contract, model_config, repository, torch_repo

SEVEN_B_TP4 = "r1-distill-qwen-7b-fp8-tp4"


def parsed(repo) -> dict[str, dict]:
    """Every model's config.pbtxt through protobuf's text_format into Triton's ModelConfig."""
    out = {}
    for name in repository.MODELS:
        path = repo / name / model_config.CONFIG_FILE
        assert "${" not in path.read_text(), f"{path} has an unfilled template placeholder"
        config = model_config.read(path)
        assert config.name == name
        out[name] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return out


def params(config: dict) -> dict[str, str]:
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def check_wiring(configs: dict[str, dict]) -> None:
    """Every ensemble tensor is fed before it is read, and names exist in the models it maps to."""
    ensemble = configs["ensemble"]
    available = {i["name"] for i in ensemble["input"]}
    for step in ensemble["ensemble_scheduling"]["step"]:
        model = configs[step["model_name"]]
        inputs = {i["name"] for i in model["input"]}
        outputs = {o["name"] for o in model["output"]}
        assert set(step["input_map"]) <= inputs, (step["model_name"], set(step["input_map"]) - inputs)
        assert set(step["input_map"].values()) <= available, (step["model_name"], step["input_map"])
        required = {i["name"] for i in model["input"] if not i.get("optional")}
        assert required <= set(step["input_map"]), (step["model_name"], required - set(step["input_map"]))
        assert set(step["output_map"]) <= outputs, (step["model_name"], set(step["output_map"]) - outputs)
        available |= set(step["output_map"].values())
    assert {o["name"] for o in ensemble["output"]} <= available


@pytest.fixture(scope="module")
def trtllm_repo(tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    result = stage.deploy(load(SEVEN_B_TP4), engines_dir=engines, runtime="tensorrt_llm")
    return engines, result


def test_tensorrt_llm_repository_for_7b_tp4_without_an_engine(trtllm_repo):
    engines, result = trtllm_repo
    assert result.runtime == "tensorrt_llm" and not result.engine_ready and not result.cache_hit
    configs = parsed(result.repo_dir)
    check_wiring(configs)
    engine = configs["tensorrt_llm"]
    assert engine["backend"] == "tensorrtllm"
    assert engine["model_transaction_policy"]["decoupled"] is True
    assert engine["max_batch_size"] == 8
    assert engine["dynamic_batching"]["max_queue_delay_microseconds"] == "1000"
    p = params(engine)
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["gpt_model_path"] == str(engines / SEVEN_B_TP4 / "engine")
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert p["exclude_input_in_output"] == "true" and p["enable_kv_cache_reuse"] == "false"
    assert p["max_beam_width"] == "1"
    types = {i["name"]: i["data_type"] for i in engine["input"]}
    assert types["encoder_input_features"] == "TYPE_BF16" and types["prompt_embedding_table"] == "TYPE_BF16"
    assert {o["name"]: o["data_type"] for o in engine["output"]}["generation_logits"] == "TYPE_FP32"
    assert (types["min_tokens"], types["seed"], types["streaming"]) == ("TYPE_INT32", "TYPE_UINT64", "TYPE_BOOL")
    pre = params(configs["preprocessing"])
    assert (pre["end_id"], pre["pad_id"]) == ("151643", "151643")  # R1-distill's EOS, padding as TensorRT-LLM does
    assert pre["tokenizer_dir"] == str(engines / SEVEN_B_TP4 / "checkpoint" / "tokenizer")
    assert (pre["max_input_len"], pre["max_seq_len"]) == ("2048", "8192")
    assert configs["tensorrt_llm_bls"]["model_transaction_policy"]["decoupled"] is True
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert (result.repo_dir / name / "1" / "model.py").is_file()
    assert (result.repo_dir / "tensorrt_llm" / "1").is_dir()  # the C++ backend needs the version directory only
    assert result.manifest["end_id"] == 151643 and result.manifest["runtime"] == "tensorrt_llm"


def test_client_contract_is_the_issue_contract(trtllm_repo):
    configs = parsed(trtllm_repo[1].repo_dir)
    for name in ("ensemble", "tensorrt_llm_bls"):
        inputs = {i["name"]: (i["data_type"], i.get("optional", False)) for i in configs[name]["input"]}
        assert inputs["text_input"] == ("TYPE_STRING", False) and inputs["max_tokens"] == ("TYPE_INT32", False)
        for optional in ("stream", "temperature", "top_k", "top_p", "random_seed", "end_id", "pad_id", "stop_words",
                         "bad_words", "exclude_input_in_output", "min_tokens"):
            assert inputs[optional][1] is True, optional
        assert {o["name"] for o in configs[name]["output"]} >= {"text_output"}


def test_second_deploy_is_a_cache_hit_and_cli_says_the_engine_is_missing(trtllm_repo):
    engines, _ = trtllm_repo
    again = stage.deploy(load(SEVEN_B_TP4), engines_dir=engines, runtime="tensorrt_llm")
    assert again.cache_hit
    cli = run_cli("deploy", "-c", f"build_configs/{SEVEN_B_TP4}.yaml", "--engines-dir", str(engines),
                  "--runtime", "tensorrt_llm")
    assert cli.returncode == 0, cli.stderr
    assert "cache hit" in cli.stdout and "end id 151643" in cli.stdout
    assert "engine directory" in cli.stderr and "still empty" in cli.stderr


def test_serve_refuses_until_the_engine_exists_and_dry_run_prints_the_4_rank_launch(trtllm_repo):
    engines, result = trtllm_repo
    refused = run_cli("serve", "-c", f"build_configs/{SEVEN_B_TP4}.yaml", "--engines-dir", str(engines))
    assert refused.returncode == 2
    assert "still empty" in refused.stderr and "Traceback" not in refused.stderr
    dry = run_cli("serve", "-c", f"build_configs/{SEVEN_B_TP4}.yaml", "--engines-dir", str(engines), "--dry-run",
                  "--http-port", "9100", "--grpc-port", "9101", "--metrics-port", "9102")
    assert dry.returncode == 0, dry.stderr
    line = next(line for line in dry.stdout.splitlines() if "mpirun" in line).split()
    front, launch = line[:line.index("--")], line[line.index("--") + 1:]  # the HTTP front runs the server
    assert "trtllm_pipeline.triton.http_front" in front and "--listen=127.0.0.1:9100" in front
    assert launch[:2] == ["mpirun", "--allow-run-as-root"]
    assert launch.count("-n") == 4 and launch.count(":") == 3
    assert launch.count(f"--model-repository={result.repo_dir}") == 4
    assert launch.count("--load-model=tensorrt_llm") == 3  # ranks > 0 load the engine only
    assert launch.count("--http-address=127.0.0.1") == 4 and "--grpc-port=9101" in launch
    assert "runtime: tensorrt_llm" in dry.stdout


def test_torch_repository_honours_the_engine_contract(built, engines_dir):
    cfg = load("tiny-qwen2-fp8-tp1")
    built(cfg.name)
    result = stage.deploy(cfg, engines_dir=engines_dir)
    assert result.runtime == "torch" and result.engine_ready
    configs = parsed(result.repo_dir)
    check_wiring(configs)
    engine = configs["tensorrt_llm"]
    assert engine["backend"] == "python" and engine["model_transaction_policy"]["decoupled"] is True
    reference = {name: (kind, dims) for name, kind, dims, _ in contract.TRTLLM_INPUTS}
    for tensor in engine["input"]:
        assert (tensor["data_type"], [int(d) for d in tensor["dims"]]) == reference[tensor["name"]], tensor["name"]
    assert {t["name"] for t in engine["input"]} == set(torch_repo.HONOURED_INPUTS)
    assert "output_text" in {o["name"] for o in engine["output"]}
    step = configs["ensemble"]["ensemble_scheduling"]["step"][2]
    assert step["input_map"]["TEXT"] == "_TEXT"  # postprocessing passes the runtime's exact text on
    # The client contract is the same as for TensorRT-LLM.
    other = repository.ensemble_config(cfg, text_from_model=False)
    assert configs["ensemble"]["input"] == json_format.MessageToDict(
        model_config.build(other), preserving_proto_field_name=True)["input"]
    assert torch_repo.read_build_config(result.repo_dir / "tensorrt_llm").to_dict() == cfg.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(engines_dir / cfg.name / "checkpoint" / "tokenizer")
    assert int(params(configs["preprocessing"])["end_id"]) == tokenizer.eos_token_id
    manifest = json.loads((result.repo_dir / "manifest.json").read_text())
    assert manifest["inputs"]["engine"] == result.manifest["inputs"]["engine"] is not None


def test_a_repository_must_match_the_built_engine(built, engines_dir):
    cfg = load("tiny-qwen2-fp8-tp1")
    built(cfg.name)
    with pytest.raises(InputError, match="built for the torch runtime"):
        stage.deploy(cfg, engines_dir=engines_dir, runtime="tensorrt_llm")


def test_deploy_runs_the_model_checks_quantize_runs(tmp_path):
    config = tmp_path / "tiny-qwen2-fp8-tp3.yaml"
    config.write_text((REPO / "build_configs" / "tiny-qwen2-fp8-tp1.yaml").read_text().replace("tp: 1", "tp: 3"))
    out = run_cli("deploy", "-c", str(config), "--engines-dir", str(tmp_path / "engines"), "--runtime", "torch")
    assert out.returncode == 2 and "parallelism.tp: 3 does not divide" in out.stderr, out.stderr
    assert not (tmp_path / "engines" / "tiny-qwen2-fp8-tp3" / "triton_model_repo").exists()


def test_binding_every_interface_is_warned_about(tmp_path):
    out = run_cli("serve", "-c", str(REPO / "build_configs" / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir",
                  str(tmp_path), "--dry-run", "--host", "0.0.0.0")
    assert out.returncode == 0, out.stderr
    assert "warning: serving on every network interface" in out.stdout
    loopback = run_cli("serve", "-c", str(REPO / "build_configs" / "tiny-qwen2-fp8-tp1.yaml"), "--engines-dir",
                       str(tmp_path), "--dry-run")
    assert "warning" not in loopback.stdout


def test_printed_commands_quote_what_they_name(tmp_path):
    odd = tmp_path / "my configs; rm -rf ~" / "tiny.yaml"
    odd.parent.mkdir()
    odd.write_text((REPO / "build_configs" / "tiny-qwen2-fp8-tp1.yaml").read_text())
    out = run_cli("eval", "-c", str(odd), "--engines-dir", str(tmp_path / "engines"))
    assert out.returncode == 2
    assert f"-c '{odd}'" in out.stderr, out.stderr  # safe to paste


def test_the_bls_runs_as_many_instances_as_serving_says(tmp_path):
    """``serving.bls_instance_count``: tensorrt_llm_bls's instance group (each a stub process of its own; 1 by
    default), and a changed count is a new repository, not a cache hit."""
    cfg = load(SEVEN_B_TP4)
    first = stage.deploy(cfg, engines_dir=tmp_path, runtime="tensorrt_llm")
    assert [g["count"] for g in parsed(first.repo_dir)["tensorrt_llm_bls"]["instance_group"]] == [1]
    again = stage.deploy(cfg.with_section("serving", bls_instance_count=4), engines_dir=tmp_path,
                         runtime="tensorrt_llm")
    assert not again.cache_hit
    assert [g["count"] for g in parsed(again.repo_dir)["tensorrt_llm_bls"]["instance_group"]] == [4]
