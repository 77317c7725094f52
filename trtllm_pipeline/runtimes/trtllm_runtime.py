"""The TensorRT-LLM 1.2.x engine path: pre-flight, trtllm-build, MPI launch lines, and the runtime.

Nothing here imports TensorRT-LLM at module level: on a machine without it every function still
answers (pre-flight says what is missing, ``plan`` prints the exact commands), and ``build_engine``
and ``TrtllmRuntime.from_engine`` raise ``UnavailableError`` (exit 3) instead of pretending.

Every flag and API used here was checked against TensorRT-LLM's own sources of the 1.2 line and is
pinned in ``tests/fixtures/trtllm_1_2_build_args.json`` (file, commit, type, choices, default):
``tensorrt_llm/commands/build.py`` (parse_arguments), ``tensorrt_llm/plugin/plugin.py``
(PluginConfig, cli_plugin_args), ``triton_backend/scripts/launch_triton_server.py`` (the mpirun
line) and ``examples/bindings/executor/example_advanced.py`` (the executor bindings).
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import math
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

from trtllm_pipeline import artifacts, doctor
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError
from trtllm_pipeline.model_catalog import ModelShape
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TokenEvent

log = logging.getLogger(__name__)

GB = 10**9
GIB = 2**30
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
# CUDA context, TensorRT and cuBLAS workspaces, NCCL / custom all-reduce buffers: an estimate of
# what a TensorRT-LLM process holds besides weights, KV cache and activations.
RUNTIME_OVERHEAD_BYTES = 2 * GIB
FP8_MIN_SM = 89  # Ada and Hopper have FP8 tensor cores
LOW_LATENCY_SM = 90  # the CUTLASS low-latency FP8 kernels dispatch on Hopper only
# Plugins whose only setting is fp8 (default disable in 1.2); their kernels are Hopper-only.
FP8_PLUGINS = ("low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin", "gemm_swiglu_plugin")
TRITON_MODEL = "tensorrt_llm"  # the Triton model that ranks > 0 load (the engine itself)
ENGINE_CONFIG_KEYS = ("pretrained_config", "build_config")
BUILD_LOG = "trtllm-build.log"
FAILED_BUILD_LOG = "trtllm-build.failed.log"  # beside the engine directory, which a failure leaves untouched
_FINISH = {"END_ID": "end_id", "STOP_WORDS": "stop", "LENGTH": "length", "CANCELLED": "cancelled",
           "TIMED_OUT": "length"}


# --------------------------------------------------------------------------- memory


def estimate_memory(cfg: BuildConfig, shape: ModelShape) -> dict[str, Any]:
    """Bytes per GPU of one rank: weights (by dtype and quant format), KV cache, activations, overhead.

    Weights follow the TensorRT-LLM checkpoint the quantize stage writes: FP8 linears (1 byte)
    with per-tensor scales; embedding and lm_head stay in ``dtype`` (ModelOpt excludes lm_head)
    and are sharded over TP (``use_parallel_embedding``, vocabulary padded to a multiple of TP);
    KV heads are replicated when TP exceeds them. The KV cache is the minimum for
    ``max_batch_size`` sequences of ``max_seq_len`` tokens (the runtime takes more:
    ``kv_cache_free_gpu_mem_fraction`` of what is free after loading).
    """
    tp, pp, b = cfg.parallelism.tp, cfg.parallelism.pp, cfg.build
    act = _DTYPE_BYTES[cfg.dtype]
    fp8 = cfg.quantization.format == "fp8"
    h, hd = shape.hidden_size, shape.head_dim
    layers = math.ceil(shape.num_hidden_layers / pp)
    q_heads, kv_heads = shape.num_attention_heads // tp, max(1, shape.num_key_value_heads // tp)
    inter = shape.intermediate_size // tp
    qkv_rows = (q_heads + 2 * kv_heads) * hd
    linear_params = layers * (qkv_rows * h + h * q_heads * hd + 3 * h * inter)
    linear = linear_params * (1 if fp8 else act)
    scales = layers * 5 * 2 * 4 if fp8 else 0  # weight + activation scale (fp32) per quantized linear
    small = (layers * (qkv_rows + 2 * h) + h) * act  # qkv bias, two norms per layer, final norm
    vocab_rank = math.ceil(shape.vocab_size / tp)
    embedding = vocab_rank * h * act
    lm_head = vocab_rank * h * act
    weights = linear + scales + small + embedding + lm_head
    kv_elem = 1 if cfg.quantization.kv_cache == "fp8" else act
    kv_cache = b.max_batch_size * b.max_beam_width * b.max_seq_len * 2 * layers * kv_heads * hd * kv_elem
    # Largest live activations of one forward over max_num_tokens (qkv output, residual and norm,
    # fused fc+gate output), plus fp32 logits of the whole padded vocabulary per sequence.
    activations = b.max_num_tokens * (qkv_rows + 2 * h + 2 * inter) * act
    logits = b.max_batch_size * b.max_beam_width * vocab_rank * tp * 4
    total = weights + kv_cache + activations + logits + RUNTIME_OVERHEAD_BYTES
    return {
        "per_gpu": True,
        "tp": tp,
        "weight_format": "fp8 linears, " + cfg.dtype + " embedding/lm_head" if fp8 else cfg.dtype,
        "weights_bytes": weights,
        "weights_breakdown": {"linear": linear, "scales": scales, "norms_and_bias": small,
                              "embedding": embedding, "lm_head": lm_head},
        "kv_cache_bytes": kv_cache,
        "kv_cache_dtype": "fp8" if kv_elem == 1 else cfg.dtype,
        "activations_bytes": activations + logits,
        "overhead_bytes": RUNTIME_OVERHEAD_BYTES,
        "total_bytes": total,
    }


def _memory_line(est: dict[str, Any]) -> str:
    return (f"memory per GPU (estimate, tp={est['tp']}): weights {est['weights_bytes'] / GB:.2f} GB "
            f"({est['weight_format']}), KV cache {est['kv_cache_bytes'] / GB:.2f} GB ({est['kv_cache_dtype']}), "
            f"activations {est['activations_bytes'] / GB:.2f} GB, overhead {est['overhead_bytes'] / GB:.2f} GB "
            f"= {est['total_bytes'] / GB:.2f} GB")


# --------------------------------------------------------------------------- pre-flight


def preflight(cfg: BuildConfig, *, gpus: list[doctor.Gpu] | None = None) -> list[str]:
    """Why this machine cannot build and run ``cfg``'s engines: one line per problem, each with its fix.

    ``gpus`` defaults to the GPUs visible here (tests pass made-up ones).
    """
    from trtllm_pipeline.model_source import known_shape

    problems = []
    version, trt_problem = doctor.trtllm_status()
    if trt_problem:
        problems.append(f"{trt_problem}.")  # doctor's wording already says how to install it
    devices = doctor.gpus() if gpus is None else list(gpus)
    world = cfg.parallelism.world_size
    if len(devices) < world:
        problems.append(
            f"tp*pp = {world} needs {world} CUDA GPU(s), {len(devices)} visible. "
            f"Fix: run on a machine with {world} GPUs (CUDA_VISIBLE_DEVICES), or lower parallelism.tp.")
    used = devices[:world]
    if not used:
        return problems
    sm = min(g.sm for g in used)
    fp8 = cfg.quantization.format == "fp8" or cfg.quantization.kv_cache == "fp8"
    if fp8 and sm < FP8_MIN_SM:
        problems.append(f"FP8 needs SM{FP8_MIN_SM}+ (Ada, Hopper); GPU {used[0].name} is SM{sm}. "
                        "Fix: use an Ada/Hopper GPU, or a bf16 config (quantization.format: none).")
    hopper_only = [p for p in FP8_PLUGINS if getattr(cfg.build.plugins, p) == "fp8"]
    if hopper_only and sm != LOW_LATENCY_SM:
        problems.append(f"{', '.join(hopper_only)} fp8 runs on Hopper (SM90) only; GPU {used[0].name} is SM{sm}. "
                        f"Fix: set build.plugins.{hopper_only[0]}: disable, or use an H100/H200.")
    shape = known_shape(cfg.model)
    if shape is not None:
        est = estimate_memory(cfg, shape)
        short = [g for g in used if g.free_gib * GIB < est["total_bytes"]]
        if short:
            g = short[0]
            problems.append(
                f"GPU {g.index} ({g.name}) has {g.free_gib * GIB / GB:.1f} GB free; one rank needs about "
                f"{est['total_bytes'] / GB:.1f} GB ({_memory_line(est)}). Fix: raise parallelism.tp, use FP8, "
                "or lower build.max_batch_size / build.max_seq_len.")
    return problems


# --------------------------------------------------------------------------- commands


def _switch(on: bool) -> str:
    return "enable" if on else "disable"


def use_fp8_context_fmha(cfg: BuildConfig) -> bool:
    """On exactly when the KV cache is FP8, unless the config says otherwise."""
    value = cfg.build.use_fp8_context_fmha
    return cfg.quantization.kv_cache == "fp8" if value is None else value


def build_workers(cfg: BuildConfig, gpu_count: int | None = None) -> int:
    """min(world size, GPUs); trtllm-build itself caps --workers at the visible GPU count."""
    if cfg.build.workers is not None:
        return cfg.build.workers
    world = cfg.parallelism.world_size
    gpus = len(doctor.gpus()) if gpu_count is None else gpu_count
    return min(world, gpus) if gpus else world  # planned elsewhere: assume the engine's own GPUs


def trtllm_build_command(cfg: BuildConfig, checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
                         gpu_count: int | None = None) -> list[str]:
    """The trtllm-build argument list for ``cfg`` (flags and values as TensorRT-LLM 1.2.x defines them)."""
    b, p = cfg.build, cfg.build.plugins
    cmd = ["trtllm-build", "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir),
           "--gpt_attention_plugin", p.gpt_attention_plugin, "--gemm_plugin", p.gemm_plugin]
    # FP8-only plugins default to disable in 1.2: name them only when they are on.
    for name in FP8_PLUGINS:
        if getattr(p, name) == "fp8":
            cmd += [f"--{name}", "fp8"]
    cmd += ["--kv_cache_type", b.kv_cache_type, "--use_paged_context_fmha", _switch(b.use_paged_context_fmha)]
    # For non-FP8 weights the builder forces FP8 context FMHA off itself; the flag is left out.
    if cfg.quantization.format == "fp8":
        cmd += ["--use_fp8_context_fmha", _switch(use_fp8_context_fmha(cfg))]
    cmd += ["--use_fused_mlp", _switch(b.use_fused_mlp), "--multiple_profiles", _switch(b.multiple_profiles),
            "--max_batch_size", str(b.max_batch_size), "--max_input_len", str(b.max_input_len),
            "--max_seq_len", str(b.max_seq_len), "--max_num_tokens", str(b.max_num_tokens),
            "--max_beam_width", str(b.max_beam_width), "--workers", str(build_workers(cfg, gpu_count))]
    if b.gather_generation_logits:
        cmd.append("--gather_generation_logits")
    return cmd + list(b.extra_args)


def engine_world_size(engine_dir: str | os.PathLike, cfg: BuildConfig) -> int:
    """The built engine's world size (its config.json), else the config's tp*pp."""
    try:
        mapping = _read_engine_config(Path(engine_dir))["pretrained_config"]["mapping"]
        return int(mapping.get("world_size", mapping.get("tp_size", 1) * mapping.get("pp_size", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        return cfg.parallelism.world_size


def engine_run_command(cfg: BuildConfig, engine_dir: str | os.PathLike, argv: Sequence[str]) -> list[str]:
    """``argv`` as it must run for this engine: one MPI process per rank when the world size is above 1."""
    world = engine_world_size(engine_dir, cfg)
    return list(argv) if world == 1 else ["mpirun", "-n", str(world), "--allow-run-as-root", *argv]


def server_launch_command(cfg: BuildConfig, repo_dir: str | os.PathLike, tritonserver: str, http_port: int,
                          grpc_port: int, metrics_port: int, host: str = "127.0.0.1") -> list[str]:
    """tritonserver for a TensorRT-LLM model repository, as TensorRT-LLM's launch_triton_server.py starts it.

    World size 1: one plain tritonserver. Above 1: one ``mpirun --allow-run-as-root`` with a
    ``-n 1 tritonserver ...`` segment per rank joined by ``:``; ranks > 0 load only the engine
    model (``tensorrt_llm``), every segment names the same ports, and each rank gets its own
    Python-backend shared-memory prefix, as upstream's launcher writes them. Added here: the
    endpoints bind ``host`` (Triton's default is every interface).
    """
    world = cfg.parallelism.world_size
    segments = []
    for rank in range(world):
        seg = [tritonserver, f"--model-repository={repo_dir}",
               f"--http-address={host}", f"--http-port={http_port}",
               f"--grpc-address={host}", f"--grpc-port={grpc_port}",
               f"--metrics-address={host}", f"--metrics-port={metrics_port}"]
        if rank > 0:
            seg += ["--model-control-mode=explicit", f"--load-model={TRITON_MODEL}"]
        seg += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        segments.append(seg)
    if world == 1:
        return segments[0]
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank, seg in enumerate(segments):
        cmd += ([":"] if rank else []) + ["-n", "1", *seg]
    return cmd


def _generate_argv(cfg: BuildConfig) -> list[str]:
    return ["trtllm-pipeline", "generate", "-c", str(cfg.path or cfg.name), "PROMPT"]


def _quoted(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


def plan(cfg: BuildConfig, checkpoint_dir: str | os.PathLike, engine_dir: str | os.PathLike) -> list[str]:
    """Dry-run lines: pre-flight verdicts, the trtllm-build command, how the engine runs and is served."""
    from trtllm_pipeline.model_source import known_shape

    problems = preflight(cfg)
    lines = ["pre-flight: " + ("ok" if not problems else f"{len(problems)} problem(s) on this machine")]
    lines += [f"  - {p}" for p in problems]
    lines += ["trtllm-build:", "  " + _quoted(trtllm_build_command(cfg, checkpoint_dir, engine_dir))]
    lines.append(f"  expect: {engine_dir}/config.json (pretrained_config, build_config) and "
                 + ", ".join(f"rank{r}.engine" for r in range(cfg.parallelism.world_size)))
    run = engine_run_command(cfg, engine_dir, _generate_argv(cfg))
    lines += ["run in-process (one MPI rank per GPU):", "  " + _quoted(run)]
    repo = Path(engine_dir).parent / "triton_model_repo"
    s = cfg.serving
    serve = server_launch_command(cfg, repo, "/opt/tritonserver/bin/tritonserver", s.http_port, s.grpc_port,
                                  s.metrics_port, s.host)
    lines += ["serve with Triton:", "  " + _quoted(serve)]
    shape = known_shape(cfg.model)
    lines.append(_memory_line(estimate_memory(cfg, shape)) if shape else
                 "memory: model shape unknown here (not downloaded, not in the catalog); no estimate")
    return lines


# --------------------------------------------------------------------------- build


def _read_engine_config(engine_dir: Path) -> dict[str, Any]:
    return json.loads((engine_dir / "config.json").read_text(encoding="utf-8"))


def engine_layout_problems(engine_dir: Path, world: int) -> list[str]:
    """What is missing from a trtllm-build output directory (config.json keys, rank{i}.engine files)."""
    try:
        config = _read_engine_config(engine_dir)
    except (OSError, ValueError) as exc:
        return [f"{engine_dir}/config.json is missing or unreadable ({exc})"]
    problems = [f"config.json lacks `{k}`" for k in ENGINE_CONFIG_KEYS if k not in config]
    problems += [f"rank{r}.engine is missing" for r in range(world)
                 if not (engine_dir / f"rank{r}.engine").is_file()]
    return problems


def build_engine(cfg: BuildConfig, checkpoint_dir: str | os.PathLike, engine_dir: str | os.PathLike) -> dict:
    """Run trtllm-build into ``engine_dir`` (atomically) and return the manifest fields it adds.

    Raises ``UnavailableError`` listing the pre-flight problems, ``StageFailed`` with the log tail
    when trtllm-build fails or leaves an incomplete engine. The caller writes the manifest.
    """
    problems = preflight(cfg)
    exe = shutil.which("trtllm-build")
    if not problems and exe is None:
        problems.append("trtllm-build is not on PATH although tensorrt_llm imports. "
                        "Fix: activate the environment TensorRT-LLM was installed into.")
    if problems:
        raise UnavailableError(
            f"cannot build TensorRT-LLM engines for {cfg.name} here:\n  - " + "\n  - ".join(problems),
            fix=f"run `trtllm-pipeline build -c {cfg.path or cfg.name} --dry-run` to see the plan, "
            "or use the torch runtime (`--runtime torch`)")
    engine_dir = Path(engine_dir)
    world = cfg.parallelism.world_size
    version, _ = doctor.trtllm_status()
    with artifacts.atomic_dir(engine_dir) as tmp:
        cmd = trtllm_build_command(cfg, checkpoint_dir, tmp)
        cmd[0] = exe
        failed_log = engine_dir.parent / FAILED_BUILD_LOG
        tail = _run_streaming(cmd, tmp / BUILD_LOG, failed_log)
        missing = engine_layout_problems(tmp, world)
        if missing:
            shutil.copyfile(tmp / BUILD_LOG, failed_log)
            raise StageFailed(
                f"trtllm-build exited 0 but its output is incomplete: {'; '.join(missing)}. "
                f"Last lines of its log ({failed_log}):\n{tail}",
                fix="re-run with build.extra_args: ['--log_level', 'verbose'] for more detail")
        engine_config = _read_engine_config(tmp)
    published = trtllm_build_command(cfg, checkpoint_dir, engine_dir)
    return {
        "engine": {"kind": "TensorRT-LLM engine (trtllm-build)", "world_size": world,
                   "files": [f"rank{r}.engine" for r in range(world)], "tensorrt_llm": version,
                   "engine_version": engine_config.get("version"),
                   "plugin_config": engine_config["build_config"].get("plugin_config")},
        "trtllm_build": {"command": published, "log": BUILD_LOG},
    }


def _run_streaming(cmd: list[str], log_path: Path, failed_log: Path, tail_lines: int = 30) -> str:
    """Run ``cmd``, copying its output to the logger and ``log_path``; on a non-zero exit keep the log
    as ``failed_log`` and raise StageFailed with its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    with open(log_path, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            tail.append(line.rstrip())
            log.info("trtllm-build: %s", line.rstrip())
        code = proc.wait()
    text = "\n".join(tail)
    if code != 0:
        shutil.copyfile(log_path, failed_log)
        raise StageFailed(f"trtllm-build exited with code {code}. Last lines of its log ({failed_log}):\n{text}",
                          fix="common causes: GPU out of memory (lower build.max_batch_size/max_seq_len, raise "
                          "tp), a checkpoint from another TensorRT-LLM version (re-run quantize --force)")
    return text


# --------------------------------------------------------------------------- runtime


def mpi_world_size() -> int:
    """World size of the MPI job this process belongs to (1 outside mpirun)."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_WORLD_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


class TrtllmRuntime(Runtime):
    """A TensorRT-LLM engine run by the executor bindings (``tensorrt_llm.bindings.executor``).

    The executor's ``enqueue_request``/``await_responses`` is exactly ``submit``/``step``: requests
    are queued, in-flight batched by the engine, and stream their new tokens per iteration.
    """

    name = "tensorrt_llm"

    def __init__(self, executor, bindings, tokenizer, engine_dir: Path, engine_config: dict, poll_ms: int = 50):
        self._executor, self._tllm = executor, bindings
        self.tokenizer = tokenizer
        self.engine_dir = engine_dir
        build = engine_config["build_config"]
        self.max_batch_size = int(build["max_batch_size"])
        self.max_seq_len = int(build["max_seq_len"])
        self._pretrained = engine_config["pretrained_config"]
        self._gather = {"context": bool(build.get("gather_context_logits")),
                        "generation": bool(build.get("gather_generation_logits"))}
        self._poll = datetime.timedelta(milliseconds=poll_ms)
        self._ours: dict[int, Any] = {}  # executor request id -> caller's request id
        self._theirs: dict[Any, int] = {}

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg: BuildConfig, manifest: dict, **opts) -> "TrtllmRuntime":
        version, problem = doctor.trtllm_status()
        if problem:
            raise UnavailableError(f"cannot load the TensorRT-LLM engine in {engine_dir}: {problem}.",
                                   fix="run where tensorrt_llm 1.2.x is installed, or build for the torch runtime")
        engine_dir = Path(engine_dir)
        world = engine_world_size(engine_dir, cfg)
        running = mpi_world_size()
        if running != world:
            argv = _generate_argv(cfg)
            raise InputError(
                f"the engine in {engine_dir} has world size {world} (one process per GPU) but this process "
                f"runs in an MPI world of {running}.",
                fix=f"launch it with one rank per GPU, e.g. `{_quoted(engine_run_command(cfg, engine_dir, argv))}`")
        import tensorrt_llm.bindings.executor as tllm
        from transformers import AutoTokenizer

        exec_cfg = tllm.ExecutorConfig(1)
        exec_cfg.kv_cache_config = tllm.KvCacheConfig(
            free_gpu_memory_fraction=cfg.runtime.kv_cache_free_gpu_mem_fraction,
            enable_block_reuse=cfg.runtime.enable_kv_cache_reuse)
        executor = tllm.Executor(str(engine_dir), tllm.ModelType.DECODER_ONLY, exec_cfg)
        if not executor.can_enqueue_requests():
            # Ranks > 0 of a leader-mode MPI job only execute what rank 0 enqueues; they stay in
            # shutdown() until rank 0 shuts down, then leave.
            executor.shutdown()
            raise SystemExit(0)
        tokenizer = AutoTokenizer.from_pretrained(engine_dir.parent / "checkpoint" / "tokenizer")
        log.info("tensorrt_llm runtime: TensorRT-LLM %s, engine %s, world size %d", version, engine_dir, world)
        return cls(executor, tllm, tokenizer, engine_dir, _read_engine_config(engine_dir), **opts)

    # ---- Runtime interface

    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        request = self._request(list(prompt_ids), params.max_tokens, params, streaming=True)
        engine_id = self._executor.enqueue_request(request)
        self._ours[engine_id], self._theirs[request_id] = request_id, engine_id

    def step(self) -> list[TokenEvent]:
        events = []
        for response in self._executor.await_responses(self._poll):
            ours = self._ours.get(response.request_id)
            if ours is None:
                continue
            if response.has_error():
                self._forget(ours)
                raise StageFailed(f"TensorRT-LLM request {ours!r} failed: {response.error_msg}",
                                  fix="check the prompt length against build.max_input_len and the server log")
            result = response.result
            reason = _finish_reason(result.finish_reasons[0]) if result.is_final else None
            events.append(TokenEvent(ours, list(result.output_token_ids[0]), reason))
            if result.is_final:
                self._forget(ours)
        return events

    def cancel(self, request_id: Any) -> None:
        engine_id = self._theirs.get(request_id)
        if engine_id is not None:
            self._executor.cancel_request(engine_id)
            self._forget(request_id)

    def has_work(self) -> bool:
        return bool(self._ours)

    def score(self, contexts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation from the engine's logits.

        With context logits (``--gather_context_logits``) one request per pair; else with generation
        logits (``build.gather_generation_logits``) one single-token request per continuation token.
        """
        if self._gather["context"]:
            return self._score_with_context_logits(contexts, continuations)
        if self._gather["generation"]:
            return self._score_with_generation_logits(contexts, continuations)
        raise InputError(f"the engine in {self.engine_dir} was built without logits output, so it cannot score "
                         "continuations (MMLU log-likelihood).",
                         fix="set build.gather_generation_logits: true in the config and rebuild")

    def describe(self) -> dict[str, Any]:
        quant = self._pretrained.get("quantization") or {}
        world = self._pretrained.get("mapping", {}).get("world_size", 1)
        devices = doctor.gpus()
        device = f"{devices[0].name} x{world}" if devices else None
        return {"runtime": self.name, "device": device, "engine_dir": str(self.engine_dir),
                "tensorrt_llm": doctor.package_version("tensorrt_llm"),
                "world_size": self._pretrained.get("mapping", {}).get("world_size", 1),
                "dtype": self._pretrained.get("dtype"), "quant_algo": quant.get("quant_algo"),
                "kv_cache_quant_algo": quant.get("kv_cache_quant_algo")}

    def close(self) -> None:
        self._executor.shutdown()

    # ---- internals

    def _request(self, prompt: list[int], max_tokens: int, params: SamplingParams, *, streaming: bool,
                 context_logits: bool = False, generation_logits: bool = False):
        tllm = self._tllm
        sampling = tllm.SamplingConfig(
            beam_width=1, top_k=1 if params.greedy else (params.top_k or None),
            top_p=None if params.greedy else params.top_p,
            temperature=None if params.greedy else params.temperature, seed=params.seed,
            min_tokens=params.min_tokens or None)
        output = tllm.OutputConfig(return_context_logits=context_logits, return_generation_logits=generation_logits,
                                   exclude_input_from_output=True)
        end_id = self.tokenizer.eos_token_id if params.end_id is None else params.end_id
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else end_id
        return tllm.Request(input_token_ids=prompt, max_tokens=max_tokens, streaming=streaming,
                            sampling_config=sampling, output_config=output,
                            end_id=None if end_id == -1 else end_id, pad_id=pad_id)

    def _forget(self, request_id: Any) -> None:
        engine_id = self._theirs.pop(request_id, None)
        self._ours.pop(engine_id, None)

    def _run_to_completion(self, prompts: list[list[int]], **logits) -> list[Any]:
        """Final results of single-token, non-streaming requests, in order."""
        greedy = SamplingParams(max_tokens=1, end_id=-1)
        ids = [self._executor.enqueue_request(self._request(p, 1, greedy, streaming=False, **logits)) for p in prompts]
        results: dict[int, Any] = {}
        while len(results) < len(ids):
            for response in self._executor.await_responses(self._poll):
                if response.has_error():
                    raise StageFailed(f"TensorRT-LLM scoring request failed: {response.error_msg}",
                                      fix="check context lengths against build.max_input_len")
                if response.result.is_final:
                    results[response.request_id] = response.result
        return [results[i] for i in ids]

    def _score_with_context_logits(self, contexts, continuations):
        import torch

        prompts = [list(c) + list(k) for c, k in zip(contexts, continuations)]
        out = []
        for ctx, cont, result in zip(contexts, continuations, self._run_to_completion(prompts, context_logits=True)):
            logits = self._unpadded(torch.as_tensor(result.context_logits))  # [prompt length, vocab]
            rows = logits[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
            out.append(_loglikelihood(rows, list(cont)))
        return out

    def _score_with_generation_logits(self, contexts, continuations):
        import torch

        prompts, owners = [], []
        for n, (ctx, cont) in enumerate(zip(contexts, continuations)):
            for k in range(len(cont)):
                prompts.append(list(ctx) + list(cont[:k]))
                owners.append(n)
        rows: dict[int, list] = collections.defaultdict(list)
        for n, result in zip(owners, self._run_to_completion(prompts, generation_logits=True)):
            rows[n].append(self._unpadded(torch.as_tensor(result.generation_logits))[0])
        return [_loglikelihood(torch.stack(rows[n]), list(cont)) for n, cont in enumerate(continuations)]

    def _unpadded(self, logits):
        """[tokens, vocab] float32 on the CPU, without the columns of the vocabulary padded for TP."""
        logits = logits.float().cpu()
        return logits.reshape(-1, logits.shape[-1])[:, : int(self._pretrained["vocab_size"])]


def _loglikelihood(logits, targets: list[int]) -> tuple[float, bool]:
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    picked = logprobs[torch.arange(len(targets)), torch.tensor(targets)]
    greedy = bool((logprobs.argmax(dim=-1) == torch.tensor(targets)).all())
    return float(picked.sum()), greedy


def _finish_reason(reason) -> str:
    return _FINISH.get(getattr(reason, "name", str(reason)).split(".")[-1], "length")
