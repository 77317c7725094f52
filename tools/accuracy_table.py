"""``make accuracy-table``: every weight format of one model built, evaluated and gated here, as one table.

For ``build_configs/<model>-<format>-tp1.yaml`` of each format: build (torch runtime, cached),
MMLU 5-shot on a fixed stratified subset, GSM8K (lm-eval mode) on a fixed subset, fidelity against
the BF16 build (KL divergence over 4 chunks of 255 tokens), and the gate's verdict on each task against BF16
(the thresholds of ``eval/gates.yaml``). Writes the table, the settings and the wall time to
``reports/accuracy.md`` and into README.md between its ``accuracy-table`` markers; then
``trtllm-pipeline report`` over the same builds gives each its full section.

    python tools/accuracy_table.py --model smollm2-135m-instruct --data-dir DIR [--mmlu 20 --gsm8k 4 --fidelity 4]
        [--formats "bf16 fp8 ..."]

On a GPU machine (``benchmarks/h200_run.sh accuracy``) the same command evaluates on CUDA with the fast path, from
the subset ``tools/accuracy_subset.py`` writes (the same items), and ``benchmarks/accuracy_compare.py`` compares
the two runs item by item.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import time
from pathlib import Path

from trtllm_pipeline import artifacts, gating
from trtllm_pipeline.build import build
from trtllm_pipeline.config import load_config
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.report import FORMAT_LABELS, bytes_cell, weight_bytes
from trtllm_pipeline.results import load_eval
from trtllm_pipeline.tasks import fidelity

REPO = Path(__file__).resolve().parents[1]
# (fp8-fp8kv: FP8 weights and an FP8 KV cache, what trtllm-bench runs for an FP8 model)
FORMATS = ("bf16", "fp8", "fp8-fp8kv", "int4-awq", "w4a8-awq", "int8-sq", "int8-wo", "nvfp4")
START, END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"
# The subsets: what fits 8 formats in 30 minutes on 2 shared CPU cores. The torch runtime prefills ~150-300 tokens/s
# there; a 5-shot MMLU question is ~630 tokens, each subject its own few-shot prefix (so 57 questions cost about what
# 114 do), a GSM8K problem ~256 decode steps after the shared prefix, a fidelity chunk 511 tokens.
# (tools/accuracy_subset.py writes these items for the GPU run: one place for both)
DEFAULT_LIMITS = {"mmlu": 20, "gsm8k": 4, "fidelity": 4}


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: the work, whatever else shares the cores."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def produce(cfg, baseline, engines_dir: Path, data_dir: Path, limits: dict[str, int]) -> None:
    """Build (quantize first) and evaluate one format; fidelity against the baseline (the baseline: itself)."""
    build(cfg, engines_dir=engines_dir, runtime="torch")
    for task, limit in limits.items():
        evaluate(cfg, engines_dir=engines_dir, tasks=[task], limit=limit, data_dir=data_dir,
                 reference=None if task != "fidelity" or cfg is baseline else baseline.path)
        release_device_memory()


def release_device_memory() -> None:
    """On a GPU the next runtime sizes its KV pool from the memory free then (a fraction of it): the runtimes
    ``evaluate`` closed must be gone, cycles and all, or each format's pool would be a fraction of the last one's."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row(cfg, baseline, engines_dir: Path, limits: dict[str, int], gates, seconds: float, failure: str | None):
    q = cfg.quantization
    label = "BF16" if q.format == "none" else FORMAT_LABELS.get(q.format, q.format)
    label += " + FP8 KV" if q.kv_cache == "fp8" else ""
    scored = [t for t in limits if t != "fidelity"]
    if failure is not None:  # the row stays, with what stopped it
        return [label, bytes_cell(weight_bytes(cfg)), *("—" for _ in scored), "—", "—", "—", "—", "—",
                f"not produced on this machine: {failure}", f"{seconds:.0f}"]
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    results = {task: load_eval(paths.eval_results(task)) for task in limits}
    verdicts = [] if cfg is baseline else [
        gating.gate_pair(artifacts.artifact_paths(engines_dir, baseline.name).eval_results(task),
                         paths.eval_results(task), gates=gates) for task in limits]
    s = fidelity.summarize(results["fidelity"]["items"])
    return [
        label, bytes_cell(weight_bytes(cfg)), *(f"{100 * results[t]['score']:.1f}" for t in scored),
        f"{s['kld_mean']:.4f} ± {s['kld_mean_error']:.4f}", f"{s['kld_p99']:.3f}", f"{100 * s['top1']:.1f}",
        f"{s['ppl']:.2f}", f"{s['ppl_ratio']:.3f}",
        "baseline" if cfg is baseline else ", ".join(f"{v.task} {v.status.upper()}" for v in verdicts),
        f"{seconds:.0f}",
    ]


def run(model: str, data_dir: Path, engines_dir: Path, limits: dict[str, int], gates_path: Path,
        formats: tuple[str, ...] = FORMATS, calibration_dtype: str | None = None) -> tuple[str, float]:
    """(markdown, wall seconds) of the whole table, every stage included (a cached stage costs nothing).

    ``limits``: items per task (MMLU questions, GSM8K problems, fidelity chunks of 255 scored tokens). A format this
    machine cannot produce keeps its row, with the error that stopped it. ``formats``: the rows; BF16, the baseline
    every other is measured against, always comes first. ``calibration_dtype``: ``quantization.calibration.dtype``
    for every format (None: each config's; float32 on a GPU writes the CPU's checkpoints within rounding)."""
    start, cpu_start = time.perf_counter(), cpu_seconds()
    formats = ("bf16", *(f for f in formats if f != "bf16"))
    configs = [load_config(REPO / "build_configs" / f"{model}-{f}-tp1.yaml").with_section(
        "quantization.calibration", dtype=calibration_dtype) for f in formats]
    baseline = configs[0]
    gates = gating.load_gates(gates_path)
    rows = []
    for cfg in configs:
        began, failure = time.perf_counter(), None
        try:
            produce(cfg, baseline, engines_dir, data_dir, limits)
        except PipelineError as exc:
            if cfg is baseline:
                raise
            failure = " ".join(str(exc).split()).replace("|", "/")
            print(f"{cfg.name}: not produced: {failure}", flush=True)
        seconds = time.perf_counter() - began
        print(f"{cfg.name}: {seconds:.0f} s", flush=True)
        rows.append(row(cfg, baseline, engines_dir, limits, gates, seconds, failure))
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    scored = [t for t in limits if t != "fidelity"]
    header = ["format", "weights", *(f"{t.upper()} %" for t in scored), "mean KLD", "KLD p99", "top-1 %",
              "PPL", "PPL ratio", "gate vs BF16", "s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    paths = artifacts.artifact_paths(engines_dir, baseline.name)
    n = {t: load_eval(paths.eval_results(t))["n"] for t in limits}
    note = (f"`{baseline.model.source}`, every format built here with the torch runtime ({where(paths)}); "
            f"MMLU 5-shot on {n['mmlu']} questions and GSM8K (lm-eval, strict-match) on {n['gsm8k']} "
            f"problems, stratified subsets (`--limit`, seed {baseline.evaluation.seed}); fidelity against BF16 on "
            f"{n['fidelity']} tokens ({limits['fidelity']} chunks; KLD in nats; `PPL` is each build's perplexity of "
            f"that text). Gate: `eval/gates.yaml`. Whole table (`make accuracy-table`, {artifacts.now_iso()}): "
            f"{wall / 60:.1f} min wall, {cpu / 60:.1f} min of CPU time (the cores were shared with other work; the "
            "`s` column is wall time per format, quantize and build included).")
    return "\n".join([note, "", *lines]), wall


def where(paths) -> str:
    """The machine the baseline was evaluated on, as its results say: the CPU and its cores, or the GPU."""
    info = load_eval(paths.eval_results("mmlu")).get("runtime_info") or {}
    device = str(info.get("device") or "cpu")
    if device.startswith("cuda"):
        return f"{device}, {info.get('dtype', 'bfloat16')} compute, fast decode path"
    return f"CPU, float32 compute; {platform.machine()}, {len(os.sched_getaffinity(0))} cores, shared"


def write_readme(readme: Path, table: str) -> None:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    with artifacts.atomic_file(readme) as tmp:
        tmp.write_text(f"{head}{START}\n{table}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    parser.add_argument("--mmlu", type=int, default=DEFAULT_LIMITS["mmlu"],
                        help="MMLU questions (stratified over the subjects)")
    parser.add_argument("--gsm8k", type=int, default=DEFAULT_LIMITS["gsm8k"], help="GSM8K problems")
    parser.add_argument("--fidelity", type=int, default=DEFAULT_LIMITS["fidelity"],
                        help="fidelity chunks of 255 scored tokens (of 16)")
    parser.add_argument("--formats", default=" ".join(FORMATS),
                        help=f"the rows, space-separated (default all: {' '.join(FORMATS)}; bf16 always)")
    parser.add_argument("--gates", type=Path, default=REPO / "eval" / "gates.yaml")
    parser.add_argument("--out", type=Path, default=Path("reports") / "accuracy.md")
    parser.add_argument("--readme", type=Path, default=None, help="write the table into this README's markers")
    parser.add_argument("--calibration-dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="calibrate every format in this dtype (default: each config's; float32 on a GPU gives "
                        "the CPU's checkpoints within rounding, for comparing the two machines)")
    args = parser.parse_args()
    formats = tuple(args.formats.split())
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"--formats: {', '.join(unknown)} unknown; the formats are {' '.join(FORMATS)}")
    table, wall = run(args.model, args.data_dir, args.engines_dir, {"mmlu": args.mmlu, "gsm8k": args.gsm8k, "fidelity": args.fidelity},
                      args.gates, formats, args.calibration_dtype)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with artifacts.atomic_file(args.out) as tmp:
        tmp.write_text(f"# Accuracy and fidelity of {args.model}, every format\n\n{table}\n", encoding="utf-8")
    if args.readme:
        write_readme(args.readme, table)
    print(table)
    print(f"\n{args.out} written in {wall / 60:.1f} min")


if __name__ == "__main__":
    main()
