"""``trtllm-pipeline``: the command line, a thin layer over the stage functions.

Each subcommand parses options, loads the build config and calls one stage function; errors
the user can act on (``errors.PipelineError``) print as one paragraph and exit with their code,
never as a traceback (``-v`` shows tracebacks of unexpected failures).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from trtllm_pipeline import __version__
from trtllm_pipeline.config import BuildConfig, load_config
from trtllm_pipeline.console import setup_logging
from trtllm_pipeline.cost import DEFAULT_GPU_HOUR_USD
from trtllm_pipeline.errors import EXIT_FAILED, PipelineError

log = logging.getLogger("trtllm_pipeline")

STAGES_HELP = """\
Take a Hugging Face LLM checkpoint to an FP8 TensorRT-LLM service.

\b
Stages (each reads one build config, build_configs/*.yaml):
  quantize  FP8 post-training quantization with ModelOpt; TensorRT-LLM checkpoint for TP 1/2/4
  build     TensorRT-LLM engines (trtllm-build), or the torch runtime where TensorRT-LLM is missing
  generate  run the built engine in-process, or a deployed model (--url), streaming text
  eval      MMLU and GSM8K accuracy of a build
  gate      fail CI when a candidate build loses accuracy against a baseline
  deploy    write the Triton model repository
  serve     run tritonserver on that repository
  bench     TTFT, inter-token latency, throughput and cost against a served model
  report    tables and plots over builds
  doctor    what this machine can run

Artifacts go to engines/<config-name>/ (see --engines-dir); every stage is cached on its inputs.
"""


class _Group(click.Group):
    """Turns PipelineError into a message and an exit code instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:  # a bug: say so plainly, traceback only with -v
            if log.isEnabledFor(logging.DEBUG):
                raise
            click.echo(f"internal error: {type(exc).__name__}: {exc}\n(re-run with -v for the traceback)", err=True)
            ctx.exit(EXIT_FAILED)


def config_option(f):
    return click.option(
        "-c", "--config", "config", required=True, type=click.Path(path_type=Path),
        help="Build config (build_configs/*.yaml).",
    )(f)


def engines_dir_option(f):
    return click.option(
        "--engines-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("engines"),
        envvar="TRTLLM_PIPELINE_ENGINES_DIR", show_default=True,
        help="Root of the artifact tree: <engines-dir>/<config-name>/{checkpoint,engine,eval,...}.",
    )(f)


def runtime_option(f):
    return click.option(
        "--runtime", type=click.Choice(["auto", "tensorrt_llm", "torch"]), default=None,
        help="Runtime to use; default: the config's runtime.backend (auto: TensorRT-LLM where it can run).",
    )(f)


def _load(config: Path) -> BuildConfig:
    return load_config(config)


@click.group(cls=_Group, help=STAGES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v: debug and tracebacks, -vv: third parties too).")
@click.version_option(__version__, prog_name="trtllm-pipeline")
def main(verbose: int) -> None:
    setup_logging(verbose)


# --------------------------------------------------------------------------- doctor


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@click.option("--configs", "configs_dir", type=click.Path(path_type=Path), default=Path("build_configs"),
              show_default=True, help="Which shipped configs to check for this machine.")
def doctor(as_json: bool, configs_dir: Path) -> None:
    """What this machine can do: GPUs, ModelOpt, TensorRT-LLM, Triton, and which configs can run."""
    from trtllm_pipeline import doctor as doctor_mod

    facts = doctor_mod.report()
    verdicts = {}
    for path in sorted(configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []:
        try:
            verdicts[path.stem] = doctor_mod.config_verdict(load_config(path))
        except PipelineError as exc:
            verdicts[path.stem] = f"invalid: {exc.message}"
    facts["configs"] = verdicts
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    gpus = facts["gpus"]
    rows = [
        ("python", facts["python"]),
        ("platform", facts["platform"]),
        ("torch", facts["torch"]),
        ("GPUs", "; ".join(f"{g['index']}: {g['name']} SM{g['sm']} {g['total_gib']:.0f} GiB ({g['free_gib']:.0f} free)"
                           for g in gpus) or "none"),
        ("nvidia-modelopt", facts["nvidia-modelopt"] or "not installed"),
        ("transformers", facts["transformers"] or "not installed"),
        ("datasets", facts["datasets"] or "not installed"),
        ("TensorRT-LLM", facts["tensorrt_llm"] or "not installed"),
        ("tritonserver (PATH)", facts["tritonserver"]["path"] or "not found"),
        ("tritonserver (PyTriton)", facts["tritonserver"]["pytriton"] or "not found"),
        ("mpirun", facts["mpirun"] or "not found"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    runtimes = ["torch (CPU" + (", CUDA)" if gpus else ")")]
    runtimes.append("tensorrt_llm" if not facts["tensorrt_llm_problem"] else
                    f"tensorrt_llm unavailable: {facts['tensorrt_llm_problem']}")
    click.echo(f"{'runtimes':<{width}}  " + "; ".join(runtimes))
    if verdicts:
        click.echo("\nconfigs (the runtime each gets on this machine):")
        for name, verdict in verdicts.items():
            click.echo(f"  {name:<34} {verdict}")


# --------------------------------------------------------------------------- quantize


@main.command()
@config_option
@engines_dir_option
@click.option("--force", is_flag=True, help="Re-quantize even when the cached checkpoint matches the inputs.")
@click.option("--dry-run", is_flag=True, help="Print what would be done; download, load and write nothing.")
def quantize(config: Path, engines_dir: Path, force: bool, dry_run: bool) -> None:
    """FP8 post-training quantization with ModelOpt, exported as a TensorRT-LLM checkpoint.

    Writes <engines-dir>/<config>/checkpoint/ (config.json, rank{i}.safetensors sharded for the
    config's TP, tokenizer/, manifest.json) and, for FP8, the unified HF checkpoint in
    hf_checkpoint/. quantization.format: none exports the unquantized baseline. Unchanged inputs
    are a cache hit.
    """
    from trtllm_pipeline import quantize as stage

    cfg = _load(config)
    if dry_run:
        for line in stage.plan(cfg, engines_dir=engines_dir):
            click.echo(line)
        return
    result = stage.quantize(cfg, engines_dir=engines_dir, force=force)
    status = "cache hit" if result.cache_hit else "quantized"
    click.echo(f"{status}: {result.checkpoint_dir}" + (f" (+ {result.hf_checkpoint_dir})" if result.hf_checkpoint_dir else ""))


# --------------------------------------------------------------------------- build


@main.command()
@config_option
@engines_dir_option
@runtime_option
@click.option("--force", is_flag=True, help="Rebuild even when the cached engine matches the inputs.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan (quantize, build, launch lines); run nothing.")
def build(config: Path, engines_dir: Path, runtime: str | None, force: bool, dry_run: bool) -> None:
    """Build the engine: trtllm-build (TensorRT-LLM 1.2.x) or the torch runtime.

    Quantizes first when the checkpoint is missing or stale. --runtime auto picks tensorrt_llm
    when it is installed and a suitable GPU is present, else torch, and says why. The result is
    <engines-dir>/<config>/engine/ with a manifest naming the runtime.
    """
    from trtllm_pipeline import build as stage

    cfg = _load(config)
    if dry_run:
        for line in stage.plan(cfg, engines_dir=engines_dir, runtime=runtime):
            click.echo(line)
        return
    result = stage.build(cfg, engines_dir=engines_dir, runtime=runtime, force=force)
    status = "cache hit" if result.cache_hit else "built"
    click.echo(f"{status}: {result.engine_dir} ({result.runtime} runtime: {result.reason})")


# --------------------------------------------------------------------------- generate


@main.command()
@click.argument("prompt")
@click.option("-c", "--config", "config", type=click.Path(path_type=Path), help="Build config of the engine to run in-process.")
@engines_dir_option
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0: no top-k filter.")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0), default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Sampling seed (reproducible sampled output).")
@click.option("--stop", "stop_words", multiple=True, help="Stop string (repeatable).")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the model's chat template.")
@click.option("--system", default=None, help="System prompt (chat template only).")
@click.option("--device", default=None, help="torch runtime device (cpu, cuda, cuda:1); default: the config's.")
@click.option("--url", default=None, help="HOST:PORT of a served model (Triton ensemble) instead of running "
              "in-process; `default` with -c: where `serve` runs that config.")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True,
              help="With --url: gRPC streaming or HTTP generate_stream (SSE).")
def generate(prompt: str, config: Path | None, engines_dir: Path, max_tokens: int, temperature: float, top_k: int,
             top_p: float, seed: int | None, stop_words: tuple[str, ...], raw: bool, system: str | None,
             device: str | None, url: str | None, protocol: str) -> None:
    """Generate from PROMPT with the built engine of -c CONFIG, streaming text to stdout.

    With --url, from a deployed model instead (the chat template is applied here, with -c's
    tokenizer, unless --raw). Statistics go to stderr, so stdout holds only the text.
    """
    from trtllm_pipeline import generate as stage
    from trtllm_pipeline.runtimes import SamplingParams

    if url is not None:
        from trtllm_pipeline import client

        cfg = _load(config) if config else None
        target = client.resolve_url(url, protocol, cfg, engines_dir)
        if cfg is None and not raw:
            click.echo("note: without -c there is no tokenizer here for the chat template; the prompt is sent as is",
                       err=True)
        start, responses = time.perf_counter(), 0
        for piece in client.stream_served(prompt, url=target, protocol=protocol, cfg=cfg, engines_dir=engines_dir,
                                          raw=raw, system=system, max_tokens=max_tokens,
                                          stop_words=list(stop_words) or None,
                                          **client.sampling_inputs(temperature, top_k, top_p, seed)):
            click.echo(piece, nl=False)
            sys.stdout.flush()
            responses += 1
        click.echo()
        click.echo(f"[served by {target} ({protocol}); {responses} streamed responses in "
                   f"{time.perf_counter() - start:.2f} s]", err=True)
        return
    if config is None:
        raise click.UsageError("give -c CONFIG (the engine to run in-process)")
    cfg = _load(config)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                            stop_words=stop_words)
    runtime = stage.open_runtime(cfg, engines_dir, device)
    stats: list = []
    for piece in stage.stream_text(runtime, prompt, params, raw=raw, system=system, stats=stats):
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    s = stats[0]
    where = s.runtime.get("device", "")
    rate = s.output_tokens / s.seconds if s.seconds > 0 else float("nan")
    click.echo(f"[{s.runtime['runtime']} runtime, {where}; {s.prompt_tokens} prompt tokens, {s.output_tokens} "
               f"generated in {s.seconds:.2f} s ({rate:.1f} tokens/s)]", err=True)

# --------------------------------------------------------------------------- eval


@main.command("eval")
@config_option
@engines_dir_option
@click.option("--tasks", default=None, help="Comma-separated tasks: mmlu,gsm8k (default: the config's evaluation.tasks).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Items per task: a reproducible stratified subset (default: evaluation.limit, else all).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar="TRTLLM_PIPELINE_DATA_DIR",
              help="Local data: mmlu/{dev,test}/*.csv (the MMLU release) or parquet/jsonl, gsm8k/{train,test}.jsonl. "
                   "Default: the Hugging Face hub (cais/mmlu, openai/gsm8k).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Results file (one task) or directory (DIR/<task>.json); default <engines-dir>/<config>/eval/.")
@click.option("--force", is_flag=True, help="Evaluate even when the cached results match the inputs.")
@click.option("--url", default=None, help="HOST:PORT of the served model (Triton ensemble) to evaluate instead of "
              "running in-process; `default`: where `serve` runs this config. Results: <config>/eval/served/.")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True,
              help="With --url: Triton gRPC or HTTP.")
def eval_command(config: Path, engines_dir: Path, tasks: str | None, limit: int | None, data_dir: Path | None,
                 output: Path | None, force: bool, url: str | None, protocol: str) -> None:
    """Accuracy of the built engine of -c CONFIG on MMLU (5-shot) and GSM8K, with its runtime.

    Writes one JSON results file per task: score, 95% interval, sub-scores and every item, for
    `trtllm-pipeline gate`. Unchanged engine, data and settings are a cache hit.
    """
    from trtllm_pipeline import eval as stage

    cfg = _load(config)
    names = tasks.split(",") if tasks else None
    for r in stage.evaluate(cfg, engines_dir=engines_dir, tasks=names, limit=limit, data_dir=data_dir,
                            output=output, force=force, url=url, protocol=protocol):
        res = r.results
        lo, hi = res["ci95"]
        state = "cache hit" if r.cache_hit else f"{res['timings']['items_per_s']:.2f} items/s"
        complete = "" if res["complete"] else f", INCOMPLETE ({res['n']} of {res['n_selected']} scored)"
        click.echo(f"{r.task}: {100 * res['score']:.2f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}) on {res['n']} items, "
                   f"{res['runtime']} runtime{complete} [{state}] -> {r.path}")


# --------------------------------------------------------------------------- gate


@main.command()
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results file of the reference build (engines/<config>/eval/<task>.json).")
@click.option("--candidate", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results file of the build under test, same task and settings.")
@click.option("--max-drop", type=click.FloatRange(min=0), default=None,
              help="Largest allowed accuracy drop, in points (default: from the gates file).")
@click.option("--min-score", type=click.FloatRange(0, 1), default=None, help="Absolute floor for the candidate, 0..1.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Significance level of the McNemar test (default: the gates file's, else 0.05).")
@click.option("--gates", "gates_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("eval/gates.yaml"), show_default=True, help="Gate definitions and default thresholds.")
@engines_dir_option
@click.option("--only", default=None, help="Without --baseline/--candidate: only gates whose baseline config starts so.")
def gate(baseline: Path | None, candidate: Path | None, max_drop: float | None, min_score: float | None,
         alpha: float | None, gates_path: Path, engines_dir: Path, only: str | None) -> None:
    """Fail CI when a candidate build loses accuracy against a baseline (paired, item by item).

    With --baseline and --candidate: judge that pair. Without them: every gate in the gates file,
    on the results under --engines-dir. Exit 0 pass, 1 accuracy gate failed, 2 cannot judge
    (different tasks, settings or items; incomplete or corrupt results).
    """
    from trtllm_pipeline import gate as stage
    from trtllm_pipeline.errors import InputError, StageFailed

    if (baseline is None) != (candidate is None):
        raise click.UsageError("give both --baseline and --candidate, or neither (to run the gates file)")
    limits = {"max_drop": max_drop, "min_score": min_score, "alpha": alpha}
    if baseline is not None:  # with --max-drop, the gates file is optional
        gates = stage.load_gates(gates_path) if gates_path.is_file() or max_drop is None else None
        verdicts = [stage.gate_pair(baseline, candidate, gates=gates, **limits)]
    else:
        verdicts = stage.gate_all(stage.load_gates(gates_path), engines_dir=engines_dir, only=only, **limits)
        if not verdicts:
            raise InputError(f"{gates_path}: no gates" + (f" with a baseline starting {only!r}" if only else "") + ".")
    click.echo(stage.format_table(verdicts))
    failed = [v for v in verdicts if v.status == "fail"]
    unjudged = [v for v in verdicts if v.status == "cannot judge"]
    if failed:
        raise StageFailed("accuracy gate failed: " + "; ".join(f"{v.task} {v.candidate}: {v.reason}" for v in failed))
    if unjudged:
        raise InputError("cannot judge: " + "; ".join(f"{v.task} {v.candidate}: {v.reason}" for v in unjudged))
    click.echo("gate passed")


# --------------------------------------------------------------------------- deploy


@main.command()
@config_option
@engines_dir_option
@runtime_option
@click.option("--force", is_flag=True, help="Rewrite the repository even when its inputs are unchanged.")
def deploy(config: Path, engines_dir: Path, runtime: str | None, force: bool) -> None:
    """Write the Triton model repository: <engines-dir>/<config>/triton_model_repo/.

    TensorRT-LLM's inflight_batcher_llm layout (ensemble, preprocessing, tensorrt_llm,
    postprocessing, tensorrt_llm_bls) for the runtime the engine was built for; with no engine
    yet, for --runtime (auto: what can run here). Every parameter comes from the config, the
    engine and the tokenizer.
    """
    from trtllm_pipeline import deploy as stage

    cfg = _load(config)
    result = stage.deploy(cfg, engines_dir=engines_dir, runtime=runtime, force=force)
    status = "cache hit" if result.cache_hit else "deployed"
    click.echo(f"{status}: {result.repo_dir} ({result.runtime} runtime: {result.reason}; end id "
               f"{result.manifest['end_id']}, pad id {result.manifest['pad_id']})")
    if not result.engine_ready:
        click.echo(f"note: the engine directory {result.engine_dir} is still empty: build it before serving "
                   f"(trtllm-pipeline build -c {config} --runtime {result.runtime}); serve refuses until then", err=True)


# --------------------------------------------------------------------------- serve


@main.command()
@config_option
@engines_dir_option
@click.option("--host", default=None, help="Address the endpoints bind (default: serving.host, 127.0.0.1).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=None, help="Default: serving.http_port.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=None, help="Default: serving.grpc_port.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Prometheus metrics; default: serving.metrics_port.")
@click.option("--detach", is_flag=True, help="Return once the server is ready and leave it running.")
@click.option("--stop", "stop_server", is_flag=True, help="Stop this config's server; returns once it has exited.")
@click.option("--dry-run", is_flag=True, help="Print the launch command and endpoints; start nothing.")
def serve(config: Path, engines_dir: Path, host: str | None, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, detach: bool, stop_server: bool, dry_run: bool) -> None:
    """Run tritonserver on the build's model repository (deployed first if needed).

    TensorRT-LLM: the tritonserver on PATH under mpirun, one server per rank. torch runtime: the
    tritonserver bundled with nvidia-pytriton. Waits until ready, prints the endpoints and runs
    until Ctrl-C, or with --detach leaves it running for `serve --stop`.
    """
    from trtllm_pipeline import serve as stage

    cfg = _load(config)
    ports = dict(host=host, http=http_port, grpc=grpc_port, metrics=metrics_port)
    if stop_server:
        stopped = stage.stop(cfg, engines_dir=engines_dir)
        click.echo(f"stopped the {cfg.name} server (pid {stopped.pid})" if stopped else
                   f"no server is running for {cfg.name}")
        return
    if dry_run:
        for line in stage.plan(cfg, engines_dir=engines_dir, **ports):
            click.echo(line)
        return
    server = stage.start(cfg, engines_dir=engines_dir, **ports)
    click.echo(f"serving {cfg.name} ({server.runtime} runtime, pid {server.pid}, log {server.log}):")
    for line in server.endpoints():
        click.echo(f"  {line}")
    if detach:
        click.echo(f"stop it with: trtllm-pipeline serve -c {config} --stop")
        return
    click.echo("Ctrl-C stops it.")
    stage.run_until_interrupted(server, engines_dir=engines_dir, cfg=cfg)
    click.echo("stopped")


# --------------------------------------------------------------------------- bench


def _number_list(kind: type):
    def parse(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            return [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind.__name__}s such as 1,4,16, got {value!r}")
    return parse


@main.command()
@click.option("--url", default=None, help="HOST:PORT of the server; default with -c: where `serve` runs that config.")
@click.option("--protocol", type=click.Choice(["triton-grpc", "triton-http", "openai"]), default="triton-grpc",
              show_default=True, help="Triton ensemble over gRPC or HTTP (SSE), or an OpenAI-compatible server "
              "(vLLM, trtllm-serve) on /v1/completions.")
@click.option("--model", default=None, help="Served model; default: ensemble (Triton), the only one served (OpenAI).")
@click.option("--concurrency", callback=_number_list(int), default=None,
              help="Closed-loop levels: requests kept in flight, comma separated (default 1 without --request-rate).")
@click.option("--request-rate", callback=_number_list(float), default=None,
              help="Open-loop levels: Poisson arrivals per second, comma separated.")
@click.option("--input-tokens", type=click.IntRange(min=2), default=128, show_default=True,
              help="Synthetic prompt length, exact under the model's tokenizer.")
@click.option("--output-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="Forced output length (min = max tokens), verified on every response.")
@click.option("--requests", "num_requests", type=click.IntRange(min=1), default=32, show_default=True,
              help="Measured requests per load level.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unrecorded requests before each load level.")
@click.option("--dataset", type=click.Choice(["synthetic", "gsm8k"]), default="synthetic", show_default=True,
              help="Prompts: synthetic, or GSM8K test questions (their own lengths).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local dataset files (gsm8k/test.jsonl); default: the hub.")
@click.option("-c", "--config", "config", type=click.Path(path_type=Path), default=None,
              help="Build config: its tokenizer, serving address, GPU count and results directory.")
@click.option("--tokenizer", default=None, help="HF tokenizer directory or hub id (without -c).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results JSON; default with -c: <engines-dir>/<config>/bench/<protocol>-in<N>-out<M>.json.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs of the deployment, for the cost estimate; default: the config's tp*pp, else 1.")
@click.option("--gpu-hour-usd", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_GPU_HOUR_USD,
              show_default=True, help="Price of one GPU-hour in USD for the cost estimate; the default is an "
              "assumption (hyperscaler on-demand H200 list price), not a measurement.")
@click.option("--seed", type=int, default=1234, show_default=True, help="Prompts and open-loop arrivals.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600, show_default=True,
              help="Seconds to wait for any one response.")
@engines_dir_option
def bench(url, protocol, model, concurrency, request_rate, input_tokens, output_tokens, num_requests, warmup,
          dataset, data_dir, config, tokenizer, output, gpus, gpu_hour_usd, seed, timeout_s, engines_dir) -> None:
    """Measure TTFT, inter-token latency, throughput and cost of a served model.

    Closed loop (--concurrency) and/or open loop (--request-rate); every response is streamed
    and timed, every output length checked. Metric names and definitions follow AIPerf.
    """
    from trtllm_pipeline import bench as stage

    cfg = _load(config) if config else None
    if cfg is None and tokenizer is None:
        raise click.UsageError("give -c CONFIG or --tokenizer: prompts are built to exact lengths with the model's tokenizer")
    if cfg is None and output is None:
        raise click.UsageError("give -o FILE for the results (or -c CONFIG to use its bench/ directory)")
    if url is None:
        if cfg is None:
            raise click.UsageError("give --url HOST:PORT (or -c CONFIG to use its serving address)")
        from trtllm_pipeline.client import resolve_url

        url = resolve_url("default", "grpc" if protocol == "triton-grpc" else "http", cfg, engines_dir)
    levels = [stage.LoadLevel(concurrency=c) for c in (concurrency or ([] if request_rate else [1]))]
    levels += [stage.LoadLevel(request_rate=r) for r in request_rate or []]
    settings = stage.BenchSettings(protocol=protocol, url=url, levels=tuple(levels), model=model,
                                   input_tokens=input_tokens, output_tokens=output_tokens, requests=num_requests,
                                   warmup=warmup, dataset=dataset, data_dir=data_dir, seed=seed, timeout_s=timeout_s)
    source = tokenizer or stage.config_tokenizer_dir(cfg, engines_dir)
    result = stage.bench(
        settings, tokenizer=stage.load_tokenizer(source), tokenizer_source=str(source),
        output=output or stage.default_output(engines_dir, cfg.name, settings),
        config_name=cfg.name if cfg else None, engines_dir=engines_dir,
        gpus=gpus or (cfg.parallelism.world_size if cfg else 1),
        gpu_hour_usd=gpu_hour_usd, progress=click.echo,
    )
    for entry in result.data["summary"]:
        if entry["cost"]:
            c = entry["cost"]
            click.echo(f"cost at {stage.level_label(entry)}: ${c['usd_per_1m_output_tokens']:.2f} per "
                       f"1M output tokens, ${c['usd_per_request']:.4f} per {c['request_output_tokens']}-token request, "
                       f"{c['requests_per_day']:,} requests/day on {c['gpus']} GPU(s) at ${c['gpu_hour_usd']}/GPU-hour")
    errors = sum(entry["errors"] for entry in result.data["summary"])
    if errors:
        click.echo(f"warning: {errors} request(s) failed; see `error` in the results file", err=True)
    click.echo(f"results: {result.path}")


# --------------------------------------------------------------------------- report


@main.command()
@click.argument("configs", nargs=-1, type=click.Path(path_type=Path))
@engines_dir_option
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True, help="Directory for report.md and its PNG plots.")
@click.option("--gpu-hour-usd", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_GPU_HOUR_USD,
              show_default=True, help="Price of one GPU-hour in USD (an assumption, not a measurement).")
@click.option("--request-tokens", type=click.IntRange(min=1), default=None,
              help="Output tokens of the request priced in the cost columns (default 1700, the reference "
              "recipe's reasoning request).")
@click.option("--gates", "gates_file", type=click.Path(dir_okay=False, path_type=Path), default=Path("eval/gates.yaml"),
              show_default=True, help="Accuracy gates whose verdicts the report shows (skipped if the file is absent).")
def report(configs: tuple[Path, ...], engines_dir: Path, out_dir: Path, gpu_hour_usd: float,
           request_tokens: int | None, gates_file: Path) -> None:
    """Tables and plots over builds: precision, TP, runtime, accuracy, gate, latency, throughput, cost.

    CONFIGS default to every build_configs/*.yaml. Missing results show as "not measured".
    """
    from trtllm_pipeline import cost
    from trtllm_pipeline import report as stage

    paths = list(configs) or sorted(Path("build_configs").glob("*.yaml"))
    if not paths:
        raise click.UsageError("no build configs given and none in build_configs/")
    result = stage.report([_load(p) for p in paths], engines_dir=engines_dir, out_dir=out_dir,
                          gates_file=gates_file if gates_file.is_file() else None, gpu_hour_usd=gpu_hour_usd,
                          request_tokens=request_tokens or cost.REFERENCE_REQUEST_TOKENS)
    measured = sum(1 for b in result.builds if b.bench or b.evals)
    click.echo(f"report: {result.path} ({len(result.builds)} builds, {measured} with measurements; plots: "
               + ", ".join(p.name for p in result.plots) + ")")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
