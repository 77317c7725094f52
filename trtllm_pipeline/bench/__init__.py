"""Stage ``bench``: a load generator over streamed requests, and the latency/throughput it measured.

Per load level (closed loop: ``concurrency`` requests always in flight; open loop: Poisson
arrivals at ``request_rate`` per second, whatever the server's speed) it sends ``requests``
requests after ``warmup`` unrecorded ones, times every streamed response (``protocols``)
and summarises them (``metrics``: TTFT, ITL, TPOT, end-to-end latency, throughput, errors). The
load generator is ``load``, the prompts ``prompts``, the settings ``settings``.

Honest numbers need equal work per request: synthetic prompts are exactly ``input_tokens`` long
under the model's tokenizer (as the server counts them, special tokens included), the output is
forced to ``output_tokens`` (min = max tokens) and checked against what came back; a request that
returns another length is an error, counted, not averaged in. Results are never cached: every
run measures again.

Results file (JSON, ``schema`` 1): ``settings``; ``summary``, one entry per load level with
``concurrency`` or ``request_rate``, ``requests``, ``errors``, ``output_tokens_mean``,
``ttft_ms``/``itl_ms``/``tpot_ms``/``e2e_ms`` (each ``mean``, ``p50``, ``p90``, ``p99``),
``output_tokens_per_s``, ``requests_per_s`` and ``cost`` (null for a server on a CPU), and ``note`` where the
level's requests queue (concurrency above the server's batch); added since (schema still 1): ``server``, the torch
runtime's own counters over the level (``server_steps``; null for another server), and ``client``, the client's
CPU over the load (``processes`` sending it, their ``cpu_s``, and ``cpu_share``, the busiest one's share of the wall
time: near 1, that process's one GIL may have set the pace);
``requests``, one record per request.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from trtllm_pipeline import artifacts, cost
from trtllm_pipeline.bench.client_processes import auto_processes
from trtllm_pipeline.bench.load import Job, run_level
from trtllm_pipeline.bench.metrics import summarize_level
from trtllm_pipeline.bench.prompts import dataset_prompts, prompts, synthetic_prompts
from trtllm_pipeline.bench.protocols import TRITON_PROTOCOLS, connect
from trtllm_pipeline.bench.server_steps import between, metrics_url, read_counters
from trtllm_pipeline.bench.settings import BenchSettings, LoadLevel, load_levels
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.console import quiet
from trtllm_pipeline.endpoints import read_state, resolve_url
from trtllm_pipeline.errors import InputError, StageFailed
from trtllm_pipeline.machine import gpus as gpus_here
from trtllm_pipeline.model.source import resolve_model
from trtllm_pipeline.results import BENCH_SCHEMA, level_label

__all__ = ["BenchResult", "BenchSettings", "LoadLevel", "bench", "config_tokenizer_dir", "dataset_prompts",
           "default_output", "describe_level", "load_tokenizer", "queue_note", "run", "served_device",
           "synthetic_prompts"]

log = logging.getLogger(__name__)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")  # a server there runs on this machine


@dataclasses.dataclass
class BenchResult:
    path: Path
    data: dict[str, Any]

    def cost_lines(self) -> list[str]:
        """The cost at each measured load level; none for a server computing on a CPU (a GPU price does not
        describe it: the report says n/a (CPU) too)."""
        if self.data["settings"].get("device") == "cpu":
            return ["cost: n/a (CPU): the server computes on this machine's CPU, which a GPU-hour price does not "
                    "describe"]
        lines = []
        for entry in self.data["summary"]:
            if entry["cost"]:
                c = entry["cost"]
                lines.append(f"cost at {level_label(entry)}: ${c['usd_per_1m_output_tokens']:.2f} per 1M output "
                             f"tokens, ${c['usd_per_request']:.4f} per {c['request_output_tokens']}-token request, "
                             f"{c['requests_per_day']:,} requests/day on {c['gpus']} GPU(s) at "
                             f"${c['gpu_hour_usd']}/GPU-hour")
        return lines

    def warning(self) -> str | None:
        errors = sum(entry["errors"] for entry in self.data["summary"])
        return f"warning: {errors} request(s) failed; see `error` in the results file" if errors else None


def run(*, cfg: BuildConfig | None, url: str | None, protocol: str, concurrency: list[int] | None,
        request_rate: list[float] | None, tokenizer: str | None, output: Path | None, gpus: int | None,
        engines_dir: Path, progress: Callable[[str], None] = log.info, **options: Any) -> BenchResult:
    """``bench`` as the command line gives it: the config (if any) supplies the server's address, the
    tokenizer, the GPU count and where the results go, unless given. ``options`` are BenchSettings fields
    (input_tokens, output_tokens, requests, ...), plus gpu_hour_usd."""
    gpu_hour_usd = options.pop("gpu_hour_usd", cost.DEFAULT_GPU_HOUR_USD)
    local = url is None or urlsplit(url if "//" in url else f"//{url}").hostname in LOOPBACK_HOSTS
    if url is None:
        url = resolve_url("default", TRITON_PROTOCOLS.get(protocol, "openai"), cfg, engines_dir)
    settings = BenchSettings(protocol=protocol, url=url, levels=load_levels(concurrency, request_rate), **options)
    source = tokenizer or config_tokenizer_dir(cfg, engines_dir)
    running = read_state(cfg, engines_dir) if cfg is not None and local else None
    return bench(settings, tokenizer=load_tokenizer(source), tokenizer_source=str(source),
                 server_metrics=metrics_url(running.host, running.metrics_port) if running else None,
                 output=output or default_output(engines_dir, cfg.name, settings),
                 config_name=cfg.name if cfg else None, engines_dir=engines_dir,
                 gpus=gpus or (cfg.parallelism.world_size if cfg else 1), gpu_hour_usd=gpu_hour_usd, progress=progress,
                 device=served_device(cfg, engines_dir) if cfg and local else None,
                 server_max_batch=cfg.build.max_batch_size if cfg else None)


def served_device(cfg: BuildConfig, engines_dir: Path) -> str | None:
    """Where a server on this machine computes the build: ``cpu`` or ``cuda`` (None: not built). TensorRT-LLM
    runs on GPUs only; the torch runtime on its ``runtime.device``, ``auto`` meaning a GPU where there is one."""
    runtime = (artifacts.read_manifest(artifacts.artifact_paths(engines_dir, cfg.name).engine) or {}).get("runtime")
    if runtime is None:
        return None
    if runtime != "torch":
        return "cuda"
    device = cfg.runtime.device
    return device.split(":")[0] if device != "auto" else ("cuda" if gpus_here() else "cpu")


def queue_note(level: LoadLevel, server_max_batch: int | None) -> str | None:
    """Why TTFT jumps at a closed-loop level beyond the server's batch: the requests above it wait in its queue."""
    if server_max_batch is None or level.concurrency is None or level.concurrency <= server_max_batch:
        return None
    return (f"requests queue: concurrency {level.concurrency} > the server's max batch size {server_max_batch} "
            f"(build.max_batch_size), so up to {level.concurrency - server_max_batch} wait for a slot and TTFT "
            "includes that wait")


def bench(settings: BenchSettings, *, tokenizer, tokenizer_source: str, output: Path,
          config_name: str | None = None, engines_dir: Path | None = None, gpus: int = 1,
          gpu_hour_usd: float = cost.DEFAULT_GPU_HOUR_USD, progress: Callable[[str], None] = log.info,
          device: str | None = None, server_max_batch: int | None = None,
          server_metrics: str | None = None) -> BenchResult:
    """Run every load level against the server and write the results file to ``output``.

    ``device`` (where the server computes, when known): on ``cpu`` no level has a cost. ``server_max_batch``
    (when known): a closed-loop level above it carries a ``note`` that its requests queue. ``server_metrics``
    (the server's metrics URL, when it runs here): each level also gets the server's own ms per step
    (``server_steps``).

    When ``output`` is in the config's ``bench/`` artifact directory, that directory's manifest is
    rewritten to name it as the latest results (the report reads it from there).
    """
    settings.check()
    cost.estimate(1.0, gpus=gpus, gpu_hour_usd=gpu_hour_usd)  # reject a bad price before measuring anything
    endpoint = connect(settings.protocol, settings.url, settings.model, settings.timeout_s)
    texts, data_source = prompts(settings, tokenizer)
    jobs = [Job(i, p, len(tokenizer(p)["input_ids"])) for i, p in enumerate(texts)]
    warmup, measured = jobs[: settings.warmup], jobs[settings.warmup:]
    started = artifacts.now_iso()
    summary, records = [], []
    for level in settings.levels:
        progress(f"bench: {level}, {settings.warmup} warmup + {settings.requests} requests of "
                 f"{settings.input_tokens if settings.dataset == 'synthetic' else settings.dataset} -> "
                 f"{settings.output_tokens} tokens ({endpoint.protocol} {endpoint.url}, model {endpoint.model})")
        run_level(endpoint, warmup, level, settings.output_tokens, tokenizer, seed=settings.seed)
        before, started_level = read_counters(server_metrics), time.perf_counter()
        client: dict = {}
        results = run_level(endpoint, measured, level, settings.output_tokens, tokenizer, seed=settings.seed,
                            client_cpu=client,
                            processes=settings.client_processes or auto_processes(level, len(measured)))
        seconds = time.perf_counter() - started_level
        entry = summarize_level(level.key, results)
        entry["server"] = between(before, read_counters(server_metrics), seconds)
        entry["client"] = client
        entry["input_tokens_mean"] = round(sum(j.input_tokens for j in measured) / len(measured), 3)
        estimate = cost.estimate(entry["output_tokens_per_s"], gpus=gpus, gpu_hour_usd=gpu_hour_usd)
        entry["cost"] = estimate.to_dict() if estimate and device != "cpu" else None
        if note := queue_note(level, server_max_batch):
            entry["note"] = note
        summary.append(entry)
        records += [r.to_record() for r in results]
        progress("bench: " + describe_level(entry) + (f"\n  note: {note}" if note else ""))
        for error in sorted({r.error for r in results if r.error})[:3]:
            log.warning("bench: %s: %s", level, error)
    data = {
        "schema": BENCH_SCHEMA,
        "settings": {
            "protocol": endpoint.protocol, "url": endpoint.url, "model": endpoint.model, "config": config_name,
            "concurrency": [lv.concurrency for lv in settings.levels if lv.concurrency is not None],
            "request_rate": [lv.request_rate for lv in settings.levels if lv.request_rate is not None],
            "input_tokens": settings.input_tokens if settings.dataset == "synthetic" else None,
            "output_tokens": settings.output_tokens, "requests": settings.requests, "warmup": settings.warmup,
            "dataset": settings.dataset, "data_source": data_source, "tokenizer": tokenizer_source,
            "seed": settings.seed, "gpus": gpus, "gpu_hour_usd": gpu_hour_usd, "device": device,
            "server_max_batch_size": server_max_batch,
            "started_at": started, "finished_at": artifacts.now_iso(),
            "versions": artifacts.package_versions("tritonclient"),
        },
        "summary": summary,
        "requests": records,
    }
    artifacts.write_json_atomic(output, data)
    if config_name and engines_dir is not None:
        bench_dir = artifacts.artifact_paths(engines_dir, config_name).bench
        if output.parent.resolve() == bench_dir.resolve():
            artifacts.write_manifest(bench_dir, {"stage": "bench", "config": {"name": config_name},
                                                 "latest": output.name, "settings": data["settings"]})
    if all(entry["requests"] == 0 for entry in summary):
        first = next((r["error"] for r in records if r["error"]), "no detail")
        raise StageFailed(f"bench: every request failed (first error: {first}); results in {output}.",
                          fix="check the server's log; `trtllm-pipeline generate --url ...` shows one request")
    return BenchResult(output, data)


def describe_level(entry: dict[str, Any]) -> str:
    """One line per load level for the terminal."""
    def fmt(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:.1f}{unit}"

    return (f"{level_label(entry)}: {entry['requests']} ok, {entry['errors']} errors; "
            f"TTFT p50 {fmt(entry['ttft_ms']['p50'], ' ms')}, ITL p50 {fmt(entry['itl_ms']['p50'], ' ms')}, "
            f"e2e p50 {fmt(entry['e2e_ms']['p50'], ' ms')}; "
            f"{fmt(entry['output_tokens_per_s'])} tokens/s, {fmt(entry['requests_per_s'])} requests/s"
            + (f"; server {entry['server']['ms_per_step']:.2f} ms/step, {entry['server']['tokens_per_step']:.1f} "
               "tokens/step" if entry.get("server") else "") + _engine_steps(entry.get("server") or {})
            + _client_cpu(entry.get("client") or {}))


def _client_cpu(client: dict[str, Any]) -> str:
    if client.get("cpu_share") is None:
        return ""
    processes = client.get("processes", 1)
    return (f"; client CPU {client['cpu_share']:.2f} of its wall time" if processes == 1 else
            f"; {processes} client processes, the busiest's CPU {client['cpu_share']:.2f} of the wall time")


def _engine_steps(server: dict[str, Any]) -> str:
    """The torch runtime's step totals over the level, where its server exports them: chained steps, and the
    eager forwards' tokens and share of the wall time."""
    if "chained_steps" not in server:
        return ""
    return (f" ({server['chained_steps'] / server['steps']:.0%} chained, {server.get('eager_tokens', 0):.0f} "
            f"tokens eager in {server.get('eager_share', 0):.0%} of the time"
            + (f"; engine TTFT mean {server['engine_ttft_ms_mean']:.1f} ms" if "engine_ttft_ms_mean" in server else "")
            + _front(server) + ")")


def _front(server: dict[str, Any]) -> str:
    """Where a request waited in front of the engine (means; ``server_steps._front``), where the server says."""
    parts = [f"{label} {server[key]:.1f}" for key, label in (("triton_queue_ms_mean", "Triton queue"),
                                                              ("bls_submit_ms_mean", "BLS to socket"),
                                                              ("engine_socket_ms_mean", "socket to engine"))
             if key in server]
    return f"; in front, ms: {', '.join(parts)}" if parts else ""


def default_output(engines_dir: Path, config_name: str, settings: BenchSettings) -> Path:
    """``engines/<config>/bench/<protocol>-<input>-out<output>.json``."""
    source = f"in{settings.input_tokens}" if settings.dataset == "synthetic" else settings.dataset
    name = f"{settings.protocol}-{source}-out{settings.output_tokens}.json"
    return artifacts.artifact_paths(engines_dir, config_name).bench / name


def load_tokenizer(source: str | Path):
    """A transformers tokenizer from a directory or hub id; a failure is the user's to fix."""
    from transformers import AutoTokenizer

    try:
        with quiet():
            return AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
        raise InputError(f"cannot load a tokenizer from {source} ({type(exc).__name__}: {str(exc).splitlines()[0]}).",
                         fix="pass -c CONFIG of a quantized build, or --tokenizer with an HF model directory") from None


def config_tokenizer_dir(cfg: BuildConfig, engines_dir: Path) -> Path:
    """The tokenizer the build was exported with (checkpoint/tokenizer), else the model's own."""
    exported = artifacts.artifact_paths(engines_dir, cfg.name).tokenizer
    if (exported / "tokenizer_config.json").is_file():
        return exported
    return resolve_model(cfg.model).model_dir
