"""``make accuracy-table``: every weight format of one model built, evaluated and gated here, as one table.

For ``build_configs/<model>-<format>-tp1.yaml`` of each format: build (torch runtime, cached),
MMLU 5-shot on a fixed stratified subset, GSM8K (lm-eval mode) on a fixed subset, fidelity against
the BF16 build (KL divergence over 4,080 tokens), and the gate's verdict on each task against BF16
(the thresholds of ``eval/gates.yaml``). Writes the table, the settings and the wall time to
``reports/accuracy.md`` and into README.md between its ``accuracy-table`` markers; then
``trtllm-pipeline report`` over the same builds gives each its full section.

    python tools/accuracy_table.py --model smollm2-135m-instruct --data-dir DIR [--mmlu 114 --gsm8k 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from pathlib import Path

from trtllm_pipeline import artifacts, gating
from trtllm_pipeline.build import build
from trtllm_pipeline.config import load_config
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.report import FORMAT_LABELS, bytes_cell, weight_bytes
from trtllm_pipeline.results import load_eval
from trtllm_pipeline.tasks import fidelity

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("bf16", "fp8", "int4-awq", "w4a8-awq", "int8-sq", "int8-wo", "nvfp4")
START, END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: the work, whatever else shares the cores."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def run(model: str, data_dir: Path, engines_dir: Path, limits: dict[str, int], gates_path: Path) -> tuple[str, float]:
    """(markdown, wall seconds) of the whole table, every stage included (a cached stage costs nothing)."""
    start, cpu_start = time.perf_counter(), cpu_seconds()
    configs = [load_config(REPO / "build_configs" / f"{model}-{f}-tp1.yaml") for f in FORMATS]
    baseline = configs[0]
    seconds = {}
    for cfg in configs:
        began = time.perf_counter()
        build(cfg, engines_dir=engines_dir, runtime="torch")
        for task, limit in limits.items():
            evaluate(cfg, engines_dir=engines_dir, tasks=[task], limit=limit, data_dir=data_dir)
        evaluate(cfg, engines_dir=engines_dir, tasks=["fidelity"], data_dir=data_dir,
                 reference=None if cfg is baseline else baseline.path)
        seconds[cfg.name] = time.perf_counter() - began
        print(f"{cfg.name}: {seconds[cfg.name]:.0f} s", flush=True)
    gates = gating.load_gates(gates_path)
    rows = []
    for cfg in configs:
        paths = artifacts.artifact_paths(engines_dir, cfg.name)
        results = {task: load_eval(paths.eval_results(task)) for task in (*limits, "fidelity")}
        verdicts = [] if cfg is baseline else [
            gating.gate_pair(artifacts.artifact_paths(engines_dir, baseline.name).eval_results(task),
                             paths.eval_results(task), gates=gates) for task in (*limits, "fidelity")]
        s = fidelity.summarize(results["fidelity"]["items"])
        q = cfg.quantization
        rows.append([
            "BF16" if q.format == "none" else FORMAT_LABELS.get(q.format, q.format), bytes_cell(weight_bytes(cfg)),
            *(f"{100 * results[t]['score']:.1f}" for t in limits),
            f"{s['kld_mean']:.4f} ± {s['kld_mean_error']:.4f}", f"{s['kld_p99']:.3f}", f"{100 * s['top1']:.1f}",
            f"{s['ppl']:.2f}", f"{s['ppl_ratio']:.3f}",
            "baseline" if cfg is baseline else ", ".join(f"{v.task} {v.status.upper()}" for v in verdicts),
            f"{seconds[cfg.name]:.0f}",
        ])
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    header = ["format", "weights", *(f"{t.upper()} %" for t in limits), "mean KLD", "KLD p99", "top-1 %",
              "PPL", "PPL ratio", "gate vs BF16", "s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    n = {t: results[t]["n"] for t in limits}
    note = (f"`{baseline.model.source}`, every format built here with the torch runtime (CPU, float32 compute; "
            f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, shared); "
            f"MMLU 5-shot on {n.get('mmlu')} questions and GSM8K (lm-eval, strict-match) on {n.get('gsm8k')} "
            f"problems, stratified subsets (`--limit`, seed {baseline.evaluation.seed}); fidelity against BF16 on "
            f"{s['tokens']} tokens (KLD in nats; `PPL` is each build's perplexity of that text). Gate: "
            f"`eval/gates.yaml`. Whole table (`make accuracy-table`, {artifacts.now_iso()}): {wall / 60:.1f} min "
            f"wall, {cpu / 60:.1f} min of CPU time (the cores were shared with other work; the `s` column is wall "
            "time per format, build included).")
    return "\n".join([note, "", *lines]), wall


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
    parser.add_argument("--mmlu", type=int, default=114, help="MMLU questions (2 a subject)")
    parser.add_argument("--gsm8k", type=int, default=20, help="GSM8K problems")
    parser.add_argument("--gates", type=Path, default=REPO / "eval" / "gates.yaml")
    parser.add_argument("--out", type=Path, default=Path("reports") / "accuracy.md")
    parser.add_argument("--readme", type=Path, default=None, help="write the table into this README's markers")
    args = parser.parse_args()
    table, wall = run(args.model, args.data_dir, args.engines_dir, {"mmlu": args.mmlu, "gsm8k": args.gsm8k},
                      args.gates)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with artifacts.atomic_file(args.out) as tmp:
        tmp.write_text(f"# Accuracy and fidelity of {args.model}, every format\n\n{table}\n", encoding="utf-8")
    if args.readme:
        write_readme(args.readme, table)
    print(table)
    print(f"\n{args.out} written in {wall / 60:.1f} min")


if __name__ == "__main__":
    main()
