"""Contract tests of the TensorRT-LLM 1.2.x engine path against what TensorRT-LLM's sources define.

TensorRT-LLM cannot run on this machine, so the commands, checkpoints and launch lines the project
produces are checked against argument definitions and config fields transcribed from TensorRT-LLM's
own sources (tests/fixtures/trtllm_1_2_*.json, with file, commit and version). Where TensorRT-LLM
is installed, the emitted flags are checked against the real ``trtllm-build --help`` as well.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import CONFIGS, load, run_cli
from trtllm_pipeline import machine
from trtllm_pipeline.config import config_from_dict
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.model.catalog import KNOWN_MODELS
from trtllm_pipeline.runtimes.trtllm import backend as trtllm_backend, build as trtllm_build, runtime as trtllm_runtime
from trtllm_pipeline.runtimes.trtllm import commands as trt
from trtllm_pipeline.runtimes.trtllm.preflight import estimate_memory, preflight

FIXTURES = Path(__file__).parent / "fixtures"
BUILD_ARGS = json.loads((FIXTURES / "trtllm_1_2_build_args.json").read_text())
QWEN_CKPT = json.loads((FIXTURES / "trtllm_1_2_qwen_checkpoint.json").read_text())
R1_7B = KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]
TRTLLM_MISSING = machine.trtllm_status()[1] is not None
SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def _flag_defs() -> dict[str, dict]:
    defs = {}
    for flag in BUILD_ARGS["flags"]:
        for name in [flag["name"], *flag.get("aliases", [])]:
            defs[name] = flag
    return defs


FLAGS = _flag_defs()


def parse_command(cmd: list[str]) -> dict[str, str | bool]:
    """{flag: value} of a trtllm-build command, validated against the 1.2.x definitions."""
    assert cmd[0] == "trtllm-build"
    out: dict[str, str | bool] = {}
    tokens = iter(cmd[1:])
    for token in tokens:
        assert token in FLAGS, f"{token} is not a trtllm-build 1.2.x flag"
        spec = FLAGS[token]
        assert token not in out, f"{token} given twice"
        if spec.get("action") == "store_true":
            out[token] = True
            continue
        value = next(tokens)
        if spec["type"] == "int":
            int(value)
        if spec["choices"] is not None:
            assert value in spec["choices"], f"{token} {value}: not in {spec['choices']}"
        out[token] = value
    return out


def with_changes(name: str, **sections) -> object:
    """A shipped config with some sections changed (validated like a file)."""
    import yaml

    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data, name=name)


def gpu(sm: int, free_gib: float = 139.0, index: int = 0) -> machine.Gpu:
    return machine.Gpu(index, f"SM{sm} test GPU", sm, free_gib, free_gib)


# --------------------------------------------------------------------------- the fixture itself


def test_fixture_pins_sources_at_commits():
    prov = BUILD_ARGS["provenance"]
    for source in prov["sources"].values():
        assert source["repo"] == "NVIDIA/TensorRT-LLM" and len(source["commit"]) == 40
    assert prov["version_anchor"]["says"].startswith("1.2.")
    assert all(f["source"] in prov["sources"] for f in BUILD_ARGS["flags"])
    # The flags this project depends on are all there, with the types 1.2.x gives them.
    for name in ("--low_latency_gemm_plugin", "--gemm_plugin", "--use_fp8_context_fmha", "--multiple_profiles",
                 "--workers", "--kv_cache_type", "--gather_generation_logits", "--max_seq_len"):
        assert name in FLAGS
    assert FLAGS["--low_latency_gemm_plugin"]["choices"] == ["fp8", "disable"]
    assert FLAGS["--gather_generation_logits"]["action"] == "store_true"


# --------------------------------------------------------------------------- trtllm-build command


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_emits_only_1_2_flags(name):
    cfg = load(name)
    flags = parse_command(trt.trtllm_build_command(cfg, "ckpt", "out", gpu_count=cfg.parallelism.world_size))
    b = cfg.build
    assert flags["--checkpoint_dir"] == "ckpt" and flags["--output_dir"] == "out"
    assert flags["--max_batch_size"] == str(b.max_batch_size)
    assert flags["--max_input_len"] == str(b.max_input_len)
    assert flags["--max_seq_len"] == str(b.max_seq_len)
    assert flags["--max_num_tokens"] == str(b.max_num_tokens)
    assert flags["--kv_cache_type"] == "paged"


def test_7b_fp8_tp4_command_matches_the_recipe():
    cfg = load("r1-distill-qwen-7b-fp8-tp4")
    cmd = trt.trtllm_build_command(cfg, "ckpt", "out", gpu_count=4)
    flags = parse_command(cmd)
    assert flags["--low_latency_gemm_plugin"] == "fp8"
    assert flags["--gemm_plugin"] == "disable"  # the perf guide: no FP8 gemm plugin next to the low-latency one
    assert flags["--gpt_attention_plugin"] == "auto"
    assert flags["--max_seq_len"] == "8192" and flags["--max_input_len"] == "2048"
    assert flags["--max_batch_size"] == "8" and flags["--max_num_tokens"] == "8192"
    assert flags["--workers"] == "4"
    # BF16 KV cache: FP8 context FMHA stays off (TensorRT-LLM would switch it off with paged context FMHA).
    assert flags["--use_fp8_context_fmha"] == "disable"
    assert flags["--use_paged_context_fmha"] == "enable"
    assert flags["--use_fused_mlp"] == "enable" and flags["--multiple_profiles"] == "enable"
    assert "--gather_generation_logits" not in flags


def test_workers_follow_the_visible_gpus():
    cfg = load("r1-distill-qwen-7b-fp8-tp4")
    assert parse_command(trt.trtllm_build_command(cfg, "c", "o", gpu_count=2))["--workers"] == "2"
    # No GPU here: the plan describes the engine's own machine, one worker per rank.
    assert parse_command(trt.trtllm_build_command(cfg, "c", "o", gpu_count=0))["--workers"] == "4"
    pinned = with_changes("r1-distill-qwen-7b-fp8-tp4", build={"workers": 1})
    assert parse_command(trt.trtllm_build_command(pinned, "c", "o", gpu_count=4))["--workers"] == "1"


@pytest.mark.parametrize("name", ["r1-distill-qwen-7b-bf16-tp1", "tiny-qwen2-bf16-tp1"])
def test_bf16_config_emits_no_fp8_flags(name):
    cmd = trt.trtllm_build_command(load(name), "ckpt", "out", gpu_count=1)
    assert not [t for t in cmd if "fp8" in t.lower()], cmd
    assert parse_command(cmd)["--gemm_plugin"] == "auto"


def test_fp8_kv_cache_turns_fp8_context_fmha_on_unless_told_otherwise():
    fp8_kv = with_changes("r1-distill-qwen-7b-fp8-tp1", quantization={"kv_cache": "fp8"})
    assert parse_command(trt.trtllm_build_command(fp8_kv, "c", "o", gpu_count=1))["--use_fp8_context_fmha"] == "enable"
    off = with_changes("r1-distill-qwen-7b-fp8-tp1", quantization={"kv_cache": "fp8"},
                       build={"use_fp8_context_fmha": False})
    assert parse_command(trt.trtllm_build_command(off, "c", "o", gpu_count=1))["--use_fp8_context_fmha"] == "disable"


def test_gather_generation_logits_and_extra_args_are_passed():
    cfg = with_changes("r1-distill-qwen-7b-fp8-tp1",
                       build={"gather_generation_logits": True, "extra_args": ["--log_level", "verbose"]})
    cmd = trt.trtllm_build_command(cfg, "c", "o", gpu_count=1)
    assert parse_command(cmd)["--gather_generation_logits"] is True
    assert cmd[-2:] == ["--log_level", "verbose"]  # verbatim, last


def test_default_gather_generation_logits_is_off():
    assert load("r1-distill-qwen-7b-fp8-tp4").build.gather_generation_logits is False


@pytest.mark.skipif(shutil.which("trtllm-build") is None, reason="trtllm-build (TensorRT-LLM) is not installed here")
def test_flags_exist_in_the_installed_trtllm_build():
    help_text = subprocess.run(["trtllm-build", "--help"], capture_output=True, text=True, timeout=300).stdout
    for name in SHIPPED:
        for token in trt.trtllm_build_command(load(name), "c", "o", gpu_count=4):
            if token.startswith("--"):
                assert token in help_text, token


# --------------------------------------------------------------------------- pre-flight


@pytest.mark.skipif(not TRTLLM_MISSING, reason="TensorRT-LLM is installed here")
def test_preflight_here_says_tensorrt_llm_is_missing():
    problems = [str(p) for p in preflight(load("r1-distill-qwen-7b-fp8-tp4"))]
    assert any("TensorRT-LLM is not installed" in p and "pip install" in p for p in problems)
    if not machine.gpus():
        assert any("needs 4 CUDA GPU(s), 0 visible" in p for p in problems)
    assert all("\n" not in p for p in problems)


def _gpu_problems(cfg, gpus):
    return [str(p) for p in preflight(cfg, gpus=gpus) if "TensorRT-LLM" not in p.problem]


def test_preflight_gpu_checks():
    tp4 = load("r1-distill-qwen-7b-fp8-tp4")
    assert _gpu_problems(tp4, [gpu(90, index=i) for i in range(4)]) == []
    too_few = _gpu_problems(tp4, [gpu(90, index=i) for i in range(2)])
    assert len(too_few) == 1 and "needs 4 CUDA GPU(s), 2 visible" in too_few[0]
    ada = _gpu_problems(tp4, [gpu(89, index=i) for i in range(4)])  # FP8 yes, low-latency GEMM no
    assert len(ada) == 1 and "low_latency_gemm_plugin" in ada[0] and "SM90" in ada[0]
    ampere = _gpu_problems(tp4, [gpu(80, index=i) for i in range(4)])
    assert any("FP8 needs SM89+" in p for p in ampere)
    # BF16 on Ampere is fine; no Hopper-only plugin either.
    assert _gpu_problems(load("r1-distill-qwen-7b-bf16-tp1"), [gpu(80)]) == []


def test_preflight_memory_check():
    bf16 = load("r1-distill-qwen-7b-bf16-tp1")  # ~22 GB per GPU with the KV cache for 8 x 8192 tokens
    small = _gpu_problems(bf16, [gpu(90, free_gib=16.0)])
    assert len(small) == 1 and "GB free" in small[0] and "Fix:" in small[0]
    assert _gpu_problems(bf16, [gpu(90, free_gib=40.0)]) == []


# --------------------------------------------------------------------------- memory estimate


def test_memory_7b_bf16_tp1():
    est = estimate_memory(load("r1-distill-qwen-7b-bf16-tp1"), R1_7B)
    # Every parameter in BF16 on one GPU: 7.62e9 parameters x 2 bytes (the published 15.2 GB).
    assert est["weights_bytes"] == R1_7B.num_params * 2
    assert 15.0e9 < est["weights_bytes"] < 15.5e9
    # KV cache: 8 sequences x 8192 tokens x 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 bytes.
    assert est["kv_cache_bytes"] == 8 * 8192 * 2 * 28 * 4 * 128 * 2
    assert est["total_bytes"] > est["weights_bytes"] + est["kv_cache_bytes"]


def test_memory_7b_fp8():
    tp1 = estimate_memory(load("r1-distill-qwen-7b-fp8-tp1"), R1_7B)
    parts = tp1["weights_breakdown"]
    # Linears in FP8 (1 byte): 28 layers x 233M parameters = 6.5 GB ...
    assert 6.4e9 < parts["linear"] < 6.6e9
    # ... embedding and lm_head stay BF16 (ModelOpt excludes lm_head): 2 x 152064 x 3584 x 2 bytes = 2.2 GB.
    assert parts["embedding"] + parts["lm_head"] == 2 * 152064 * 3584 * 2
    assert 7.5e9 < tp1["weights_bytes"] < 9.5e9  # "about 8 GB"
    tp4 = estimate_memory(load("r1-distill-qwen-7b-fp8-tp4"), R1_7B)
    assert math.isclose(tp4["weights_bytes"], tp1["weights_bytes"] / 4, rel_tol=0.01)
    assert tp4["kv_cache_bytes"] == tp1["kv_cache_bytes"] // 4  # 4 KV heads, one per rank


def test_memory_fp8_kv_cache_halves_the_cache_and_kv_heads_are_replicated():
    bf16_kv = estimate_memory(load("r1-distill-qwen-7b-fp8-tp1"), R1_7B)
    fp8_kv = estimate_memory(with_changes("r1-distill-qwen-7b-fp8-tp1", quantization={"kv_cache": "fp8"}), R1_7B)
    assert fp8_kv["kv_cache_bytes"] * 2 == bf16_kv["kv_cache_bytes"]
    # 1.5B: 2 KV heads at tp=4 are replicated, so each rank still holds one KV head.
    shape = KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    tp4 = with_changes("r1-distill-qwen-1.5b-fp8-tp1", parallelism={"tp": 4})
    b = tp4.build
    assert estimate_memory(tp4, shape)["kv_cache_bytes"] == b.max_batch_size * b.max_seq_len * 2 * 28 * 1 * 128 * 2


# --------------------------------------------------------------------------- launch lines


def _segments(cmd: list[str]) -> list[list[str]]:
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    out, current = [], []
    for token in cmd[2:]:
        if token == ":":
            out.append(current)
            current = []
        else:
            current.append(token)
    return out + [current]


def test_tp4_launch_has_one_segment_per_rank():
    cfg = load("r1-distill-qwen-7b-fp8-tp4")
    cmd = trt.server_launch_command(cfg, "/repo", "/opt/tritonserver/bin/tritonserver", 8000, 8001, 8002, "127.0.0.1")
    segments = _segments(cmd)
    assert len(segments) == 4
    for rank, seg in enumerate(segments):
        assert seg[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert "--model-repository=/repo" in seg and "--disable-auto-complete-config" in seg
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in seg
        assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"} <= set(seg)
        assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"} <= set(seg)
        explicit = {"--model-control-mode=explicit", "--load-model=tensorrt_llm"} <= set(seg)
        assert explicit == (rank > 0)
    # Triton's admin APIs (shared memory, model loading, trace, logging) closed on every rank, with one key.
    restricted = {tuple(t for t in seg if "restricted" in t) for seg in segments}
    assert len(restricted) == 1 and len(next(iter(restricted))) == 2
    assert all(t.split("=", 1)[1].startswith("shared-memory,model-repository,trace,logging:trtllm-pipeline-admin=")
               for t in next(iter(restricted)))


def test_tp1_launch_needs_no_mpirun():
    cfg = load("r1-distill-qwen-7b-fp8-tp1")
    cmd = trt.server_launch_command(cfg, "/repo", "tritonserver", 9000, 9001, 9002, "0.0.0.0")
    assert cmd[0] == "tritonserver" and "mpirun" not in cmd and ":" not in cmd
    assert "--http-address=0.0.0.0" in cmd and "--http-port=9000" in cmd
    assert not any(t.startswith("--model-control-mode") for t in cmd)


def test_engine_run_command(tmp_path):
    argv = ["trtllm-pipeline", "generate", "-c", "x.yaml", "hi"]
    tp4 = load("r1-distill-qwen-7b-fp8-tp4")
    assert trt.engine_run_command(tp4, tmp_path, argv) == ["mpirun", "-n", "4", "--allow-run-as-root", *argv]
    assert trt.engine_run_command(load("r1-distill-qwen-7b-fp8-tp1"), tmp_path, argv) == argv
    # A built engine's own world size wins over the config's.
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": 2}}}))
    assert trt.engine_run_command(tp4, tmp_path, argv)[:3] == ["mpirun", "-n", "2"]


def test_plan_lists_preflight_command_launch_and_memory():
    cfg = load("r1-distill-qwen-7b-fp8-tp4")
    text = "\n".join(trtllm_backend.plan(cfg, Path("e/ckpt"), Path("e/engine")))
    assert "trtllm-build --checkpoint_dir e/ckpt --output_dir e/engine" in text
    assert "--low_latency_gemm_plugin fp8" in text
    assert "mpirun -n 4 --allow-run-as-root trtllm-pipeline generate" in text
    assert text.count("--load-model=tensorrt_llm") == 3
    assert "rank3.engine" in text and "memory per GPU (estimate, tp=4): weights 2.18 GB" in text


# --------------------------------------------------------------------------- build and runtime here


def test_engine_layout_check(tmp_path):
    assert trtllm_build.engine_layout_problems(tmp_path, 2)[0].startswith(f"{tmp_path}/config.json is missing")
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_config": {}}))
    (tmp_path / "rank0.engine").write_bytes(b"x")
    assert trtllm_build.engine_layout_problems(tmp_path, 2) == ["config.json lacks `build_config`",
                                                               "rank1.engine is missing"]


def test_failed_trtllm_build_names_its_exit_code_and_log_tail(tmp_path):
    import sys

    from trtllm_pipeline.errors import StageFailed

    script = "import sys\nfor i in range(40): print('line', i)\nsys.exit(3)"
    with pytest.raises(StageFailed) as err:
        trtllm_build._run_streaming([sys.executable, "-c", script], tmp_path / "build.log", tmp_path / "failed.log")
    assert "exited with code 3" in err.value.message and "line 39" in err.value.message
    assert "line 9\n" not in err.value.message  # only the tail
    assert (tmp_path / "failed.log").read_text().count("line") == 40
    ok = trtllm_build._run_streaming([sys.executable, "-c", "print('built')"], tmp_path / "ok.log", tmp_path / "no.log")
    assert ok == "built" and not (tmp_path / "no.log").exists()


@pytest.mark.skipif(not TRTLLM_MISSING, reason="TensorRT-LLM is installed here")
def test_build_engine_here_is_unavailable(tmp_path):
    cfg = load("tiny-qwen2-fp8-tp2")
    with pytest.raises(UnavailableError) as err:
        trtllm_build.build_engine(cfg, tmp_path / "ckpt", tmp_path / "engine")
    assert err.value.exit_code == 3 and "TensorRT-LLM is not installed" in err.value.message
    assert not (tmp_path / "engine").exists()


@pytest.mark.skipif(not TRTLLM_MISSING, reason="TensorRT-LLM is installed here")
def test_runtime_here_is_unavailable(tmp_path):
    with pytest.raises(UnavailableError):
        trtllm_runtime.TrtllmRuntime.from_engine(tmp_path, load("tiny-qwen2-fp8-tp1"), {})


@pytest.mark.skipif(not TRTLLM_MISSING, reason="TensorRT-LLM is installed here")
def test_cli_build_with_tensorrt_llm_exits_3(tmp_path):
    done = run_cli("build", "-c", str(CONFIGS / "tiny-qwen2-fp8-tp1.yaml"), "--runtime", "tensorrt_llm",
                   "--engines-dir", str(tmp_path))
    assert done.returncode == 3, done.stderr
    assert "TensorRT-LLM is not installed" in done.stderr and "Traceback" not in done.stderr


def test_cli_dry_run_prints_the_engine_plan(tmp_path):
    done = run_cli("build", "-c", str(CONFIGS / "r1-distill-qwen-7b-fp8-tp4.yaml"), "--runtime", "tensorrt_llm",
                   "--dry-run", "--engines-dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert "--low_latency_gemm_plugin fp8" in done.stdout and "--workers 4" in done.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


# --------------------------------------------------------------------------- checkpoint contract


def test_quantized_checkpoint_satisfies_trtllm_qwen_config(quantized):
    from trtllm_pipeline.model.source import resolve_model

    result = quantized("tiny-qwen2-fp8-tp2")
    cfg = load("tiny-qwen2-fp8-tp2")
    config = json.loads((result.checkpoint_dir / "config.json").read_text())
    hf = json.loads((resolve_model(cfg.model).model_dir / "config.json").read_text())

    assert config["architecture"] in QWEN_CKPT["architecture_in_model_map"]
    for key in QWEN_CKPT["required_keys"]["keys"] + list(QWEN_CKPT["must_be_explicit"]["keys"]):
        assert key in config, f"config.json lacks {key}: TensorRT-LLM would use a default wrong for Qwen2"
    expect = {"qwen_type": "qwen2", "hidden_act": "silu", "position_embedding_type": "rope_gpt_neox",
              "vocab_size": hf["vocab_size"], "norm_epsilon": hf["rms_norm_eps"],
              "num_key_value_heads": hf["num_key_value_heads"], "intermediate_size": hf["intermediate_size"],
              "max_position_embeddings": hf["max_position_embeddings"], "hidden_size": hf["hidden_size"],
              "num_hidden_layers": hf["num_hidden_layers"], "num_attention_heads": hf["num_attention_heads"],
              "rotary_base": float(hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]),
              "dtype": cfg.dtype}
    assert {k: config[k] for k in expect} == expect
    for key, value in QWEN_CKPT["defaults_correct_for_qwen2"]["keys"].items():
        assert config.get(key, value) == value, key
    for key, allowed in QWEN_CKPT["enum_values"].items():
        target = config["quantization"] if "quant_algo" in key else config
        assert target[key] in allowed, key
    assert set(config["quantization"]) <= set(QWEN_CKPT["quantization_allowed_keys"]["keys"])
    assert config["quantization"]["quant_algo"] == "FP8"
    assert set(config["mapping"]) <= set(QWEN_CKPT["mapping_keys"])
    assert config["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}


def test_quantized_tensors_match_trtllm_qwen_names_and_shapes(quantized):
    from safetensors import safe_open

    result = quantized("tiny-qwen2-fp8-tp2")
    config = json.loads((result.checkpoint_dir / "config.json").read_text())
    tensors = QWEN_CKPT["tensors"]
    layers, tp = config["num_hidden_layers"], config["mapping"]["tp_size"]
    expected = set(tensors["global"])
    for i in range(layers):
        expected |= {t.format(i=i) for t in tensors["per_layer"]}
        expected |= {f"transformer.layers.{i}.{m}.{s}"
                     for m in tensors["fp8_linears"] for s in tensors["fp8_per_linear"]}
    h, heads, kv, inter = (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
                           config["intermediate_size"])
    hd = config["head_size"]
    shapes = {"attention.qkv.weight": ((heads // tp + 2 * max(1, kv // tp)) * hd, h),
              "attention.dense.weight": (h, heads * hd // tp), "mlp.fc.weight": (inter // tp, h),
              "mlp.gate.weight": (inter // tp, h), "mlp.proj.weight": (h, inter // tp)}
    for rank in range(tp):
        with safe_open(result.checkpoint_dir / f"rank{rank}.safetensors", "pt") as f:
            names = set(f.keys())
            assert names == expected, (sorted(names - expected), sorted(expected - names))
            for suffix, shape in shapes.items():
                assert tuple(f.get_slice(f"transformer.layers.0.{suffix}").get_shape()) == shape, suffix
            lm_head = tuple(f.get_slice("lm_head.weight").get_shape())
            assert lm_head == (math.ceil(config["vocab_size"] / tp), h)


# --------------------------------------------------------------------------- runtime logic over the bindings' shape


class _Bindings:
    """Stand-in for ``tensorrt_llm.bindings.executor`` (not installable here) with its call shapes.

    Its "model" puts logit 5.0 on (last token + 1) % vocab and 0 elsewhere, and pads the logits
    to a multiple of tp with zero columns, as a TP engine's padded lm_head does.
    """

    VOCAB, PADDED = 10, 12

    class ModelType:
        DECODER_ONLY = "decoder"

    @staticmethod
    def SamplingConfig(**kw):
        return kw

    @staticmethod
    def OutputConfig(**kw):
        return kw

    @staticmethod
    def Request(**kw):
        return kw

    class Executor:
        def __init__(self):
            self.queue, self.next_id, self.cancelled = [], 0, []

        def enqueue_request(self, request):
            self.next_id += 1
            self.queue.append((self.next_id, request, []))
            return self.next_id

        def cancel_request(self, rid):
            self.cancelled.append(rid)
            self.queue = [q for q in self.queue if q[0] != rid]

        def await_responses(self, timeout):
            import torch
            from types import SimpleNamespace as NS

            out, still = [], []
            for rid, req, produced in self.queue:
                tokens = req["input_token_ids"] + produced
                step_logits = _Bindings.logits(tokens)
                new = int(step_logits.argmax())
                produced.append(new)
                final = len(produced) >= req["max_tokens"] or new == req["end_id"]
                reason = "END_ID" if new == req["end_id"] else "LENGTH"
                result = NS(output_token_ids=[[new]], is_final=final, finish_reasons=[NS(name=reason)],
                            context_logits=torch.stack([_Bindings.logits(tokens[: i + 1]) for i in range(len(tokens))])
                            if req["output_config"]["return_context_logits"] else None,
                            generation_logits=step_logits.reshape(1, 1, -1)
                            if req["output_config"]["return_generation_logits"] else None)
                out.append(NS(request_id=rid, has_error=lambda: False, result=result))
                if not final:
                    still.append((rid, req, produced))
            self.queue = still
            return out

    @staticmethod
    def logits(tokens):
        import torch

        row = torch.zeros(_Bindings.PADDED)
        row[(tokens[-1] + 1) % _Bindings.VOCAB] = 5.0
        return row


def _runtime(gather: str):
    from types import SimpleNamespace as NS

    engine_config = {"pretrained_config": {"vocab_size": _Bindings.VOCAB, "mapping": {"world_size": 1}},
                     "build_config": {"max_batch_size": 8, "max_seq_len": 64, f"gather_{gather}_logits": True}}
    return trtllm_runtime.TrtllmRuntime(_Bindings.Executor(), _Bindings, NS(eos_token_id=9, pad_token_id=None),
                             Path("engine"), engine_config)


def test_runtime_is_a_complete_runtime():
    from trtllm_pipeline.runtimes.registry import backend

    runtime = trtllm_runtime.TrtllmRuntime
    assert backend("tensorrt_llm").runtime_class() is runtime and not runtime.__abstractmethods__


def test_runtime_scores_with_either_kind_of_logits():
    import torch

    contexts, continuations = [[1, 2], [4]], [[3, 4], [7]]
    # By hand: a "right" token has log-probability 5 - log(e^5 + 9) over the 10 real tokens
    # (the padded columns must not count), any other token 0 - log(e^5 + 9).
    hit, miss = 5 - math.log(math.exp(5) + 9), -math.log(math.exp(5) + 9)
    expected = [(2 * hit, True), (miss, False)]
    for gather in ("context", "generation"):
        got = _runtime(gather).score(contexts, continuations)
        assert [g for _, g in got] == [True, False]
        assert torch.allclose(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]))


def test_runtime_without_logits_cannot_score():
    from trtllm_pipeline.errors import InputError

    with pytest.raises(InputError, match="gather_generation_logits"):
        _runtime("none").score([[1]], [[2]])


def test_runtime_streams_tokens_and_maps_finish_reasons():
    from trtllm_pipeline.runtimes.base import SamplingParams

    rt = _runtime("context")
    rt.submit("a", [5], SamplingParams(max_tokens=10))  # 6, 7, 8, then 9 = eos
    rt.submit("b", [1], SamplingParams(max_tokens=2))
    events = []
    while rt.has_work():
        events += rt.step()
    a = [e for e in events if e.request_id == "a"]
    assert [t for e in a for t in e.token_ids] == [6, 7, 8, 9] and a[-1].finish_reason == "end_id"
    b = [e for e in events if e.request_id == "b"]
    assert [t for e in b for t in e.token_ids] == [2, 3] and b[-1].finish_reason == "length"
    rt.submit("c", [1], SamplingParams(max_tokens=50))
    rt.cancel("c")
    assert not rt.has_work() and rt._executor.cancelled == [3]


# --------------------------------------------------------------------------- weight formats beyond FP8

QUANT = json.loads((FIXTURES / "trtllm_1_2_quant_formats.json").read_text())
FORMAT_CONFIGS = ["r1-distill-qwen-7b-int4-awq-tp1", "r1-distill-qwen-7b-w4a8-awq-tp1", "r1-distill-qwen-7b-int8-sq-tp1",
                  "tiny-qwen2-int4-awq-tp1", "tiny-qwen2-w4a8-awq-tp1", "tiny-qwen2-int8-sq-tp1",
                  "tiny-qwen2-int8-wo-tp1", "tiny-qwen2-nvfp4-tp1"]


def test_quant_fixture_pins_its_sources():
    for source in QUANT["provenance"].values():
        if "repo" in source and source["repo"] == "NVIDIA/TensorRT-LLM" and source.get("commit"):
            assert len(source["commit"].split()[0]) in (8, 40)
    assert QUANT["provenance"]["plugin"]["commit"] == BUILD_ARGS["provenance"]["sources"]["plugin"]["commit"]
    assert QUANT["provenance"]["build"]["commit"] == BUILD_ARGS["provenance"]["sources"]["build"]["commit"]


@pytest.mark.parametrize("name", FORMAT_CONFIGS)
def test_format_configs_emit_what_trtllm_build_does_for_them(name):
    from trtllm_pipeline.config import MODELOPT_CONFIGS

    cfg = load(name)
    q = cfg.quantization
    facts = QUANT["quant_algo"]["formats"][q.format]
    assert q.quant_algo == facts["quant_algo"] and q.quant_algo in QUANT["quant_algo"]["quant_algo_list"]
    if q.format != "int8_wo":  # TensorRT-LLM's quantize.py leaves int8_wo to trtllm-build; ModelOpt's own config here
        assert MODELOPT_CONFIGS[q.format] == facts["modelopt_config"]
    flags = parse_command(trt.trtllm_build_command(cfg, "ckpt", "out", gpu_count=1))
    build = QUANT["build"]
    # use_fused_mlp: trtllm-build turns it off for anything but FP8; the command says what will happen
    assert flags["--use_fused_mlp"] == ("enable" if q.quant_algo in build["use_fused_mlp"]["forced_off_unless"]
                                        else "disable")
    # FP8 context FMHA: named only for the formats the builder keeps it for
    assert ("--use_fp8_context_fmha" in flags) == (q.quant_algo in build["fp8_context_fmha_kept_for"])
    # NVFP4 GEMMs: the plugin, never an explicit disable (which would override the builder's NVFP4 default)
    if q.format == "nvfp4":
        assert flags["--gemm_plugin"] == "nvfp4"
    else:
        assert flags["--gemm_plugin"] != "nvfp4"
    # no FP8-only plugin for non-FP8 weights; weight-only plugins are the builder's own (no CLI flag exists)
    assert not any(f in flags for f in trt.FP8_PLUGINS)
    assert not any("weight_only" in f for f in flags)
    notes = "\n".join(trt.build_notes(cfg))
    if q.format in ("int4_awq", "w4a8_awq"):
        assert "weight_only_groupwise_quant_matmul_plugin" in notes and "modeling_utils.py@01ea6d79" in notes
    if q.format == "int8_wo":
        assert "weight_only_quantize_dict" in notes


def test_7b_int4_awq_dry_run_traces_its_flags(tmp_path):
    done = run_cli("build", "-c", str(CONFIGS / "r1-distill-qwen-7b-int4-awq-tp1.yaml"), "--runtime", "tensorrt_llm",
                   "--dry-run", "--engines-dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ModelOpt INT4_AWQ_CFG" in out and "block size 128" in out and "quant_algo W4A16_AWQ" in out
    assert "--gemm_plugin auto" in out and "--use_fused_mlp disable" in out and "--use_fp8_context_fmha" not in out.split("\n  int4_awq")[0]
    assert "builder.py build()" in out and "commands/build.py@65f1d153" in out and "plugin/plugin.py@c20322ff" in out
    assert "weights 5.55 GB (int4_awq linears" in out
    assert not any(tmp_path.iterdir())


def test_memory_per_format():
    bf16 = estimate_memory(load("r1-distill-qwen-7b-bf16-tp1"), R1_7B)["weights_breakdown"]
    int4 = estimate_memory(load("r1-distill-qwen-7b-int4-awq-tp1"), R1_7B)["weights_breakdown"]
    int8 = estimate_memory(load("r1-distill-qwen-7b-int8-sq-tp1"), R1_7B)["weights_breakdown"]
    assert int4["linear"] * 4 == bf16["linear"] and int8["linear"] * 2 == bf16["linear"]
    # INT4 groups of 128 carry one 16-bit scale each: 2/128 bytes per weight
    assert int4["scales"] == pytest.approx(bf16["linear"] / 128)


def test_trtllm_takes_only_its_kernels_group_sizes():
    from trtllm_pipeline.runtimes.trtllm.preflight import GROUP_SIZES

    kernels = QUANT["groupwise_kernels"]
    assert list(GROUP_SIZES["int4_awq"]) == kernels["group_sizes"]
    assert list(GROUP_SIZES["w4a8_awq"]) == kernels["w4a8_group_sizes"]
    tiny = [str(p) for p in preflight(load("tiny-qwen2-int4-awq-tp1"), gpus=[gpu(90)])]
    assert any("awq_block_size 8" in p and "64 or 128" in p and "--runtime torch" in p for p in tiny)
    assert not any("awq_block_size" in str(p) for p in preflight(load("r1-distill-qwen-7b-w4a8-awq-tp1"), gpus=[gpu(90)]))
