"""``trtllm-pipeline``: the command line, argument parsing over the stage functions.

Each subcommand parses options, loads the build config, calls its stage and prints what the
stage says; errors the user can act on (``errors.PipelineError``) print as one paragraph and exit
with their code, never as a traceback (``-v`` shows tracebacks of unexpected failures;
``console.exit_status`` is that one mapping).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Iterable

import click

from trtllm_pipeline import __version__
from trtllm_pipeline import bench as bench_stage
from trtllm_pipeline import build as build_stage
from trtllm_pipeline import deploy as deploy_stage
from trtllm_pipeline import doctor as doctor_stage
from trtllm_pipeline import eval as eval_stage
from trtllm_pipeline import gate as gate_stage
from trtllm_pipeline import generate as generate_stage
from trtllm_pipeline import quantize as quantize_stage
from trtllm_pipeline import report as report_stage
from trtllm_pipeline import serve as serve_stage
from trtllm_pipeline.bench import inprocess
from trtllm_pipeline.bench import throughput as throughput_bench
from trtllm_pipeline.bench import speculative as speculative_bench
from trtllm_pipeline.bench.settings import DATASETS
from trtllm_pipeline.config import BACKEND_NAMES, TP_MODES, load_config
from trtllm_pipeline.console import exit_status, setup_logging
from trtllm_pipeline.cost import DEFAULT_GPU_HOUR_USD, REFERENCE_REQUEST_TOKENS
from trtllm_pipeline.model.source import ALLOW_DOWNLOAD_ENV, ASK_ABOVE_BYTES
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.tasks.registry import TASKS

STAGES_HELP = """\
Take a Hugging Face LLM checkpoint to an FP8 TensorRT-LLM service.

\b
Stages (each reads one build config, build_configs/*.yaml):
  quantize  FP8 post-training quantization with ModelOpt; TensorRT-LLM checkpoint for TP 1/2/4
  build     TensorRT-LLM engines (trtllm-build), or the torch runtime where TensorRT-LLM is missing
  generate  run the built engine in-process, or a deployed model (--url), streaming text
  eval      MMLU and GSM8K accuracy of a build; fidelity (KL divergence) against a reference build
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
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            ctx.exit(exit_status(exc))


class FiniteFloat(click.FloatRange):
    """A float range that also refuses nan and inf (``FloatRange`` lets nan through: it compares false)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number is not None and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


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
        "--runtime", type=click.Choice(["auto", *BACKEND_NAMES]), default=None,
        help="Runtime to use; default: the config's runtime.backend (auto: TensorRT-LLM where it can run).",
    )(f)


def tp_mode_option(f):
    return click.option(
        "--tp-mode", type=click.Choice(TP_MODES), default=None,
        help="torch runtime, tp>1 checkpoint: one process per rank, each loading its own shard (distributed), or "
             "the shards merged in this process (merged); default: the config's runtime.tp_mode (auto: distributed "
             "where every rank has a device: CPU always, CUDA with tp GPUs).",
    )(f)


def echo_lines(lines: Iterable[str], err: bool = False) -> None:
    for line in lines:
        click.echo(line, err=err)


def echo_stream(generation: generate_stage.Generation) -> None:
    """Notes and statistics on stderr, so that stdout holds only the text, flushed as it streams."""
    echo_lines(generation.notes, err=True)
    for piece in generation.pieces:
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    click.echo(generation.summary(), err=True)


@click.group(cls=_Group, help=STAGES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v: debug and tracebacks, -vv: third parties too).")
@click.option("--allow-download", is_flag=True,
              help=f"Download a model of more than {ASK_ABOVE_BYTES // 10**9} GB from the hub without asking (the "
                   f"same as {ALLOW_DOWNLOAD_ENV}=1); otherwise a stage asks on a terminal and refuses elsewhere.")
@click.version_option(__version__, prog_name="trtllm-pipeline")
def main(verbose: int, allow_download: bool) -> None:
    setup_logging(verbose)
    if allow_download:  # the environment, so that every stage and the processes it starts see it
        os.environ[ALLOW_DOWNLOAD_ENV] = "1"


# --------------------------------------------------------------------------- doctor


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@click.option("--configs", "configs_dir", type=click.Path(path_type=Path), default=Path("build_configs"),
              show_default=True, help="Which shipped configs to check for this machine.")
def doctor(as_json: bool, configs_dir: Path) -> None:
    """What this machine can do: GPUs, ModelOpt, TensorRT-LLM, Triton, and which configs can run."""
    echo_lines(doctor_stage.format_facts(doctor_stage.facts(configs_dir), as_json=as_json))


# --------------------------------------------------------------------------- quantize


@main.command()
@config_option
@engines_dir_option
@click.option("--force", is_flag=True, help="Re-quantize even when the cached checkpoint matches the inputs.")
@click.option("--dry-run", is_flag=True, help="Print what would be done; download, load and write nothing.")
def quantize(config: Path, engines_dir: Path, force: bool, dry_run: bool) -> None:
    """Post-training quantization with ModelOpt (quantization.format: fp8, int4_awq, w4a8_awq, int8_sq,
    int8_wo, nvfp4; none exports the unquantized baseline), exported as a TensorRT-LLM checkpoint.

    Writes <engines-dir>/<config>/checkpoint/ (config.json, rank{i}.safetensors sharded for the
    config's TP, tokenizer/, manifest.json) and, for a quantized format, the unified HF checkpoint in
    hf_checkpoint/. Unchanged inputs are a cache hit.
    """
    cfg = load_config(config)
    if dry_run:
        echo_lines(quantize_stage.plan(cfg, engines_dir=engines_dir))
        return
    click.echo(quantize_stage.quantize(cfg, engines_dir=engines_dir, force=force).summary())


# --------------------------------------------------------------------------- build


@main.command()
@config_option
@engines_dir_option
@runtime_option
@click.option("--force", is_flag=True, help="Rebuild even when the cached engine matches the inputs.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan (quantize, build, launch lines); run nothing.")
def build(config: Path, engines_dir: Path, runtime: str | None, force: bool, dry_run: bool) -> None:
    """Build the engine: trtllm-build (tensorrt_llm, TensorRT-LLM 1.x below 1.3), the unified HF checkpoint
    validated for TensorRT-LLM's PyTorch backend (tensorrt_llm_pytorch), or the torch runtime.

    Quantizes first when the checkpoint is missing or stale. --runtime auto takes the first of these
    that can run here (TensorRT-LLM installed, a suitable GPU), else torch, and says why. The result is
    <engines-dir>/<config>/engine/ with a manifest naming the runtime.
    """
    cfg = load_config(config)
    if dry_run:
        echo_lines(build_stage.plan(cfg, engines_dir=engines_dir, runtime=runtime))
        return
    click.echo(build_stage.build(cfg, engines_dir=engines_dir, runtime=runtime, force=force).summary())


# --------------------------------------------------------------------------- generate


@main.command()
@click.argument("prompt")
@click.option("-c", "--config", "config", type=click.Path(path_type=Path), help="Build config of the engine to run in-process.")
@engines_dir_option
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--temperature", type=FiniteFloat(min=0.0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0: no top-k filter.")
@click.option("--top-p", type=FiniteFloat(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Sampling seed (reproducible sampled output).")
@click.option("--stop", "stop_words", multiple=True, help="Stop string (repeatable).")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the model's chat template.")
@click.option("--system", default=None, help="System prompt (chat template only).")
@click.option("--device", default=None, help="torch runtime device (cpu, cuda, cuda:1); default: the config's.")
@click.option("--url", default=None, help="HOST:PORT of a served model (Triton: tensorrt_llm_bls), or an OpenAI base URL "
              "(http://HOST:PORT/v1), instead of running in-process; `default` with -c: where `serve` runs that config.")
@click.option("--protocol", type=click.Choice(["grpc", "http", "openai"]), default="grpc", show_default=True,
              help="With --url: gRPC streaming, HTTP generate_stream (SSE) or the OpenAI front (/v1/completions); "
              "an OpenAI base URL implies openai.")
@click.option("--runtime", type=click.Choice(["auto", *BACKEND_NAMES]), default=None,
              help="The runtime the engine must have been built for (refused, with the build command, if it is "
                   "another); default: whichever the build used.")
@tp_mode_option
def generate(prompt: str, config: Path | None, engines_dir: Path, max_tokens: int, temperature: float, top_k: int,
             top_p: float, seed: int | None, stop_words: tuple[str, ...], raw: bool, system: str | None,
             device: str | None, url: str | None, protocol: str, runtime: str | None, tp_mode: str | None) -> None:
    """Generate from PROMPT with the built engine of -c CONFIG, streaming text to stdout.

    With --url, from a deployed model instead (the chat template is applied here, with -c's
    tokenizer, unless --raw). Statistics go to stderr, so stdout holds only the text.
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                            stop_words=stop_words).check()
    if url is not None:
        cfg = load_config(config) if config else None
        echo_stream(generate_stage.served(prompt, params, url=url, protocol=protocol, cfg=cfg, engines_dir=engines_dir,
                                          raw=raw, system=system))
        return
    if config is None:
        raise click.UsageError("give -c CONFIG (the engine to run in-process)")
    echo_stream(generate_stage.in_process(load_config(config).with_runtime(tp_mode=tp_mode), prompt, params,
                                          engines_dir=engines_dir, raw=raw, system=system, device=device,
                                          runtime=runtime))


# --------------------------------------------------------------------------- eval


@main.command("eval")
@config_option
@engines_dir_option
@click.option("--tasks", default=None,
              help=f"Comma-separated tasks: {','.join(TASKS)} (default: the config's evaluation.tasks).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Items per task: a reproducible stratified subset (default: evaluation.limit, else all).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar="TRTLLM_PIPELINE_DATA_DIR",
              help="Local data: mmlu/{dev,test}/*.csv (the MMLU release) or parquet/jsonl, gsm8k/{train,test}.jsonl. "
                   "Default: the Hugging Face hub (cais/mmlu, openai/gsm8k).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Results file (one task) or directory (DIR/<task>.json); default <engines-dir>/<config>/eval/.")
@click.option("--force", is_flag=True, help="Evaluate even when the cached results match the inputs.")
@click.option("--url", default=None, help="HOST:PORT of the served model (Triton: tensorrt_llm_bls), or an OpenAI base "
              "URL (http://HOST:PORT/v1; GSM8K only: it returns no logits), to evaluate instead of running "
              "in-process; `default`: where `serve` runs this config. Results: <config>/eval/served/.")
@click.option("--protocol", type=click.Choice(["grpc", "http", "openai"]), default="grpc", show_default=True,
              help="With --url: Triton gRPC or HTTP, or the OpenAI front.")
@click.option("--reference", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Config of the build the fidelity task compares with (default: evaluation.fidelity_reference; "
                   "none: the build is its own reference and fidelity gives its perplexity).")
@tp_mode_option
def eval_command(config: Path, engines_dir: Path, tasks: str | None, limit: int | None, data_dir: Path | None,
                 output: Path | None, force: bool, url: str | None, protocol: str, reference: Path | None,
                 tp_mode: str | None) -> None:
    """Accuracy of the built engine of -c CONFIG on MMLU (5-shot) and GSM8K, with its runtime; and
    fidelity: KL divergence, top-1 agreement and perplexity ratio against a reference build.

    Writes one JSON results file per task: score, 95% interval, sub-scores and every item, for
    `trtllm-pipeline gate`. Unchanged engine, data and settings are a cache hit.
    """
    for result in eval_stage.evaluate(load_config(config).with_runtime(tp_mode=tp_mode), engines_dir=engines_dir,
                                      tasks=tasks.split(",") if tasks else None, limit=limit, data_dir=data_dir,
                                      output=output, force=force, url=url, protocol=protocol,
                                      reference=reference):
        click.echo(result.summary())


# --------------------------------------------------------------------------- gate


@main.command()
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results file of the reference build (engines/<config>/eval/<task>.json).")
@click.option("--candidate", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results file of the build under test, same task and settings.")
@click.option("--max-drop", type=FiniteFloat(min=0, max=100), default=None,
              help="Largest allowed accuracy drop, in points (default: from the gates file).")
@click.option("--min-score", type=FiniteFloat(0, 1), default=None, help="Absolute floor for the candidate, 0..1.")
@click.option("--alpha", type=FiniteFloat(0, 1, min_open=True, max_open=True), default=None,
              help="Significance level of the McNemar test (default: the gates file's, else 0.05).")
@click.option("--gates", "gates_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("eval/gates.yaml"), show_default=True, help="Gate definitions and default thresholds.")
@engines_dir_option
@click.option("--only", default=None,
              help="Without --baseline/--candidate: only gates whose baseline config starts so.")
def gate(baseline: Path | None, candidate: Path | None, max_drop: float | None, min_score: float | None,
         alpha: float | None, gates_path: Path, engines_dir: Path, only: str | None) -> None:
    """Fail CI when a candidate build loses accuracy against a baseline (paired, item by item).

    With --baseline and --candidate: judge that pair. Without them: every gate in the gates file,
    on the results under --engines-dir. Exit 0 pass, 1 accuracy gate failed, 2 cannot judge
    (different tasks, settings or items; incomplete or corrupt results).
    """
    if (baseline is None) != (candidate is None):
        raise click.UsageError("give both --baseline and --candidate, or neither (to run the gates file)")
    verdicts = gate_stage.run(baseline=baseline, candidate=candidate, gates_path=gates_path, engines_dir=engines_dir,
                              only=only, max_drop=max_drop, min_score=min_score, alpha=alpha)
    click.echo(gate_stage.format_table(verdicts))
    click.echo(gate_stage.check(verdicts))


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
    result = deploy_stage.deploy(load_config(config), engines_dir=engines_dir, runtime=runtime, force=force)
    click.echo(result.summary())
    if note := result.note():
        click.echo(note, err=True)


# --------------------------------------------------------------------------- serve


@main.command()
@config_option
@engines_dir_option
@click.option("--host", default=None, help="Address the endpoints bind (default: serving.host, 127.0.0.1).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=None, help="Default: serving.http_port.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=None, help="Default: serving.grpc_port.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Prometheus metrics; default: serving.metrics_port.")
@click.option("--openai-port", type=click.IntRange(1, 65535), default=None,
              help="The OpenAI API (/v1); default: serving.openai_port (serving.openai_front: false turns it off).")
@click.option("--detach", is_flag=True, help="Return once the server is ready and leave it running.")
@click.option("--stop", "stop_server", is_flag=True, help="Stop this config's server; returns once it has exited.")
@click.option("--dry-run", is_flag=True, help="Print the launch command and endpoints; start nothing.")
@click.option("--stub-wheels", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              envvar="TRTLLM_PIPELINE_STUB_WHEELS", show_envvar=True,
              help="torch runtime, where this Python has numpy 2: a folder with a numpy<2 wheel for the environment "
              "serve prepares for Triton's Python stub (offline machines); default: pip's index.")
@tp_mode_option
def serve(config: Path, engines_dir: Path, host: str | None, http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, openai_port: int | None, detach: bool, stop_server: bool, dry_run: bool,
          stub_wheels: Path | None, tp_mode: str | None) -> None:
    """Run tritonserver on the build's model repository (deployed first if needed).

    TensorRT-LLM: the tritonserver on PATH under mpirun, one server per rank. torch runtime: the
    tritonserver bundled with nvidia-pytriton. Beside it, an OpenAI-compatible front (/v1 on
    --openai-port). Waits until ready, prints the endpoints and runs until Ctrl-C, or with --detach
    leaves it running for `serve --stop`.
    """
    cfg = load_config(config).with_runtime(tp_mode=tp_mode)  # the repository's copy of the config carries it
    ports = dict(host=host, http=http_port, grpc=grpc_port, metrics=metrics_port, openai=openai_port)
    if stop_server:
        click.echo(serve_stage.stopped_line(cfg, serve_stage.stop(cfg, engines_dir=engines_dir)))
        return
    if dry_run:
        echo_lines(serve_stage.plan(cfg, engines_dir=engines_dir, **ports))
        return
    with serve_stage.interrupts() as interrupted:  # before the start: no Ctrl-C may leave the server running
        server = serve_stage.start(cfg, engines_dir=engines_dir, interrupted=interrupted, stub_wheels=stub_wheels,
                                   **ports)
        echo_lines(serve_stage.started_lines(cfg, server, detach=detach))
        if detach:
            return
        serve_stage.run_until_interrupted(server, engines_dir=engines_dir, cfg=cfg, interrupted=interrupted)
    click.echo("stopped")


# --------------------------------------------------------------------------- bench


def _number_list(kind: type):
    def parse(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            return [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind.__name__}s such as 1,4,8, got {value!r}")
    return parse


def _length_pairs(ctx, param, value):
    """``128/2048,2048/128`` -> ((128, 2048), (2048, 128))."""
    if value is None:
        return None
    try:
        pairs = [tuple(int(x) for x in pair.split("/", 1)) for pair in value.split(",") if pair.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(value)
        return pairs
    except ValueError:
        raise click.BadParameter(f"expected INPUT/OUTPUT token pairs such as 128/2048,2048/128, got {value!r}")


@main.command()
@click.option("--in-process", "in_process", is_flag=True,
              help="No server: load the build's runtime in this process and time its decode steps by batch and "
              "context (--batch, --context, --output-tokens; needs -c).")
@click.option("--batch", "batches", callback=_number_list(int), default=None,
              help="--in-process: batch sizes, comma separated [default: 1,8,32,64].")
@click.option("--context", "contexts", callback=_number_list(int), default=None,
              help="--in-process: prompt lengths in tokens, comma separated [default: 128,2048,8192].")
@click.option("--throughput", is_flag=True,
              help="--in-process: submit --requests requests at once per --lengths pair through the runtime's "
              "scheduler; output tokens/s, requests/s, TTFT / ITL percentiles, KV use, preemptions, peak memory.")
@click.option("--lengths", callback=_length_pairs, default=None,
              help="--throughput: input/output token pairs, comma separated [default: --input-tokens/--output-tokens].")
@click.option("--shared-prefix", type=click.IntRange(min=0), default=0, show_default=True,
              help="--throughput: a common system prompt of this many tokens before every prompt, run without and "
              "with the prefix cache.")
@click.option("--long-prompt", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="--throughput: instead of the throughput runs, --requests requests of the one --lengths pair (at "
              "most the engine's batch less one) decode; at steady state one prompt of TOKENS random tokens is "
              "submitted. Reported: the running requests' steady ITL p50, their worst and p99 inter-token gap while "
              "it is prefilled, the steps and chunks its prefill took, the time of a chunk step, and whether the "
              "worst gap stayed within one chunk step + the steady ITL (issue 31).")
@click.option("--prefill-chunk-tokens", type=click.IntRange(min=16), default=None, metavar="TOKENS",
              help="--in-process: prompt tokens the torch runtime prefills per step, in place of the config's "
              "runtime.prefill_chunk_tokens (2048 by default: a short stall for running decodes; up to "
              "build.max_num_tokens for throughput: several prompts a step, their launches shared).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=None, metavar="ROWS",
              help="--in-process, torch runtime: requests decoding together, in place of the config's "
              "build.max_batch_size (the torch runtime reads it at load; a TensorRT-LLM engine's is built in).")
@click.option("--batch-invariant", is_flag=True,
              help="--in-process, torch runtime: runtime.batch_invariant on (every token computed by the same "
              "kernels whatever its batch, chunk or cached prefix; slower), e.g. with --shared-prefix: greedy outputs "
              "with the prefix cache against those without.")
@click.option("--speculative", type=click.Choice(["ngram", "draft", "self", "eagle3"]), default=None,
              help="--in-process: plain decoding against speculative decoding (this proposer) on the same runtime and "
              "prompts, per --workload and --batch (default 1; batch 1: --prompts prompts one after another, their "
              "totals): tokens/s, speedup, acceptance length, drafted and "
              "accepted tokens, outputs compared.")
@click.option("--num-draft-tokens", type=click.IntRange(1, 8), default=None,
              help="--speculative: k, tokens drafted per request per step (default: the method's, ngram 8, others 4).")
@click.option("--tree-nodes", type=click.IntRange(1, 64), default=None,
              help="--speculative ngram: draft token trees of up to N nodes (several continuations of the matched "
              "suffix, verified in one row: runtime.speculative.tree.max_nodes) instead of one continuation.")
@click.option("--prompts", "spec_prompts", type=click.IntRange(min=1), default=None,
              help="--speculative at batch 1 (default 18): prompts of each workload generated one after another, "
              "each alone, the figures their totals (grounded: the first N task x passage pairs, rewrites first; "
              "18 = all), so that "
              "one prompt's luck does not decide them; batch B > 1 runs B prompts together.")
@click.option("--ignore-eos", is_flag=True,
              help="--speculative: every request --output-tokens long, past the model's end id (default: each ends "
              "there, as a served request does; what a model writes past its reply's end is not its answer).")
@click.option("--draft-checkpoint", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="--speculative draft: the draft model's checkpoint directory (same tokenizer as the target); "
              "eagle3: the EAGLE-3 head's directory.")
@click.option("--workload", "workloads", default="grounded,random,open", show_default=True,
              help="--speculative: grounded (rewrite / summarise / answer from a shipped passage), random (random "
              "token prompts) and/or open (open-ended requests, nothing to copy: lookups rarely hit), comma "
              "separated.")
@click.option("--url", default=None, help="HOST:PORT of the server; default with -c: where `serve` runs that config.")
@click.option("--protocol", type=click.Choice(["triton-grpc", "triton-http", "openai"]), default="triton-grpc",
              show_default=True, help="Triton (tensorrt_llm_bls, or --model ensemble) over gRPC or HTTP (SSE), or an OpenAI-compatible server "
              "(vLLM, trtllm-serve) on /v1/completions.")
@click.option("--model", default=None, help="Served model; default: tensorrt_llm_bls (Triton), the only one served (OpenAI).")
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
@click.option("--dataset", type=click.Choice(DATASETS), default="synthetic", show_default=True,
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
@click.option("--gpu-hour-usd", type=FiniteFloat(min=0, min_open=True), default=DEFAULT_GPU_HOUR_USD,
              show_default=True, help="Price of one GPU-hour in USD for the cost estimate; the default is an "
              "assumption (hyperscaler on-demand H200 list price), not a measurement.")
@click.option("--seed", type=int, default=1234, show_default=True, help="Prompts and open-loop arrivals.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=1), default=600, show_default=True,
              help="Seconds to wait for any one response.")
@click.option("--client-processes", type=click.IntRange(min=1), default=None,
              help="Client processes sending a level's requests (each times its own streams; one process's streams "
              "share a GIL). Default: one per 16 streams, at most a quarter of this machine's cores.")
@engines_dir_option
@tp_mode_option
def bench(in_process, batches, contexts, throughput, lengths, shared_prefix, long_prompt, prefill_chunk_tokens,
          max_batch_size, batch_invariant, speculative, num_draft_tokens, spec_prompts, tree_nodes, ignore_eos,
          draft_checkpoint, workloads, url, protocol, model, concurrency, request_rate, input_tokens,
          output_tokens, num_requests, warmup, dataset, data_dir, config, tokenizer, output, gpus, gpu_hour_usd, seed,
          timeout_s, client_processes, engines_dir, tp_mode) -> None:
    """Measure TTFT, inter-token latency, throughput and cost of a served model.

    Closed loop (--concurrency) and/or open loop (--request-rate); every response is streamed
    and timed, every output length checked. Metric names and definitions follow AIPerf.

    With --in-process, no server: the build's runtime runs in this process and each decode step is
    timed (median ms/step, tokens/s, achieved GB/s and the fraction of the bandwidth floor, prefill
    ms, peak GPU memory) for every --batch x --context.
    """
    if long_prompt and not (in_process and throughput):
        raise click.UsageError("--long-prompt goes with --in-process --throughput: add both, e.g. bench --in-process "
                               "--throughput -c CFG --lengths 128/512 --long-prompt 8192")
    if (throughput or lengths or shared_prefix) and not (in_process and throughput):
        raise click.UsageError("--lengths and --shared-prefix go with --throughput, and --throughput with --in-process")
    if (speculative or draft_checkpoint or prefill_chunk_tokens or max_batch_size or batch_invariant) \
            and not in_process:
        raise click.UsageError("--speculative, --draft-checkpoint, --prefill-chunk-tokens, --max-batch-size and "
                               "--batch-invariant go with --in-process")
    if speculative and throughput:
        raise click.UsageError("--speculative and --throughput are separate runs: give one")
    if ignore_eos and not speculative:
        raise click.UsageError("--ignore-eos goes with --speculative (the served bench forces --output-tokens)")
    if spec_prompts and not speculative:
        raise click.UsageError("--prompts goes with --speculative")
    if tree_nodes and speculative != "ngram":
        raise click.UsageError("--tree-nodes goes with --speculative ngram (prompt lookup drafts the trees)")
    if client_processes and in_process:
        raise click.UsageError("--client-processes goes with a served bench (--concurrency / --request-rate)")
    if draft_checkpoint and speculative not in ("draft", "eagle3"):
        raise click.UsageError("--draft-checkpoint goes with --speculative draft or eagle3")
    if in_process:
        if config is None:
            raise click.UsageError("--in-process needs -c CONFIG: it loads that build's engine")
        cfg = load_config(config).with_runtime(tp_mode=tp_mode, prefill_chunk_tokens=prefill_chunk_tokens,
                                               batch_invariant=batch_invariant or None)
        cfg = inprocess.with_batch(cfg, engines_dir, max_batch_size)
        if speculative:
            spec_settings = speculative_bench.SpeculativeSettings(
                method=speculative, num_draft_tokens=num_draft_tokens,
                draft_checkpoint=str(draft_checkpoint) if draft_checkpoint else None,
                batches=tuple(batches or (1,)), workloads=tuple(w.strip() for w in workloads.split(",") if w.strip()),
                output_tokens=output_tokens, seed=seed,
                prompts=spec_prompts or speculative_bench.SpeculativeSettings.prompts, tree_nodes=tree_nodes,
                ignore_eos=ignore_eos)
            result = speculative_bench.run_speculative(cfg, engines_dir=engines_dir, settings=spec_settings,
                                                       output=output, progress=click.echo)
            echo_lines(result.table())
            click.echo(f"results: {result.path}")
            return
        if throughput:
            tp_settings = throughput_bench.ThroughputSettings(
                lengths=tuple(lengths or ((input_tokens, output_tokens),)), requests=num_requests,
                shared_prefix=shared_prefix, long_prompt=long_prompt or 0, seed=seed)
            result = throughput_bench.run_throughput(cfg, engines_dir=engines_dir, settings=tp_settings,
                                                     output=output, progress=click.echo)
            echo_lines(result.table())
            click.echo(f"results: {result.path}")
            return
        settings = inprocess.InProcessSettings(batches=tuple(batches or (1, 8, 32, 64)),
                                               contexts=tuple(contexts or (128, 2048, 8192)),
                                               output_tokens=output_tokens, seed=seed)
        result = inprocess.run_inprocess(cfg, engines_dir=engines_dir, settings=settings, output=output,
                                         progress=click.echo)
        echo_lines(result.table())
        click.echo(f"results: {result.path}")
        return
    if batches or contexts:
        raise click.UsageError("--batch and --context go with --in-process; a served bench takes --concurrency")
    if tp_mode:
        raise click.UsageError("--tp-mode goes with --in-process; a served model runs as `serve --tp-mode` started it")
    cfg = load_config(config) if config else None
    if cfg is None and tokenizer is None:
        raise click.UsageError("give -c CONFIG or --tokenizer: prompts are built to exact lengths with the model's tokenizer")
    if cfg is None and output is None:
        raise click.UsageError("give -o FILE for the results (or -c CONFIG to use its bench/ directory)")
    if url is None and cfg is None:
        raise click.UsageError("give --url HOST:PORT (or -c CONFIG to use its serving address)")
    result = bench_stage.run(
        cfg=cfg, url=url, protocol=protocol, concurrency=concurrency, request_rate=request_rate, tokenizer=tokenizer,
        output=output, gpus=gpus, engines_dir=engines_dir, progress=click.echo, model=model, input_tokens=input_tokens,
        output_tokens=output_tokens, requests=num_requests, warmup=warmup, dataset=dataset, data_dir=data_dir,
        seed=seed, timeout_s=timeout_s, gpu_hour_usd=gpu_hour_usd, client_processes=client_processes)
    echo_lines(result.cost_lines())
    if warning := result.warning():
        click.echo(warning, err=True)
    click.echo(f"results: {result.path}")


# --------------------------------------------------------------------------- report


@main.command()
@click.argument("configs", nargs=-1, type=click.Path(path_type=Path))
@engines_dir_option
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True, help="Directory for report.md and its PNG plots.")
@click.option("--gpu-hour-usd", type=FiniteFloat(min=0, min_open=True), default=DEFAULT_GPU_HOUR_USD,
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
    paths = list(configs) or sorted(Path("build_configs").glob("*.yaml"))
    if not paths:
        raise click.UsageError("no build configs given and none in build_configs/")
    result = report_stage.report([load_config(p) for p in paths], engines_dir=engines_dir, out_dir=out_dir,
                                 gates_file=gates_file if gates_file.is_file() else None, gpu_hour_usd=gpu_hour_usd,
                                 request_tokens=request_tokens or REFERENCE_REQUEST_TOKENS)
    click.echo(result.summary())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
