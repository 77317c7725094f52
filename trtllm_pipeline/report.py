"""Stage ``report``: one Markdown page and its plots over the builds of several configs.

For each config it reads what the other stages left under ``engines/<config>/``: the build
manifest (runtime), the eval results (MMLU, GSM8K), the gate verdict and the latest bench
results, and the config itself (precision, TP). Whatever is missing is shown as missing ("not
built", "not measured"): a build that could not run here still has its row, never a zero.

Plots (matplotlib, PNG): latency against concurrency per build; inter-token latency by build at
the lowest load, the reference recipe's table; accuracy against inter-token latency; accuracy against
in-process ms/token per weight format.

The formats table is the one users choose a format from: per build its weight format, the bytes of
its weights as the engine holds them (the format's rules over the model's shape), MMLU/GSM8K and the
gate verdict against the BF16 baseline, and the in-process decode speed `bench --in-process` measured
(ms/token at batch 1, tokens/s at batch 32) with the machine it ran on; last, fidelity against the
build's reference (mean KL divergence, top-1 agreement, perplexity ratio; ``eval --tasks fidelity``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

from trtllm_pipeline import artifacts, cost, gating
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import PipelineError
from trtllm_pipeline.model.catalog import REFERENCE_RECIPE_MS_PER_TOKEN
from trtllm_pipeline.results import (INPROCESS_PREFIX, THROUGHPUT_PREFIX, is_bench, is_inprocess, is_throughput,
                                     level_label, number_cell, read_json)
from trtllm_pipeline.tasks.registry import TASKS

log = logging.getLogger(__name__)

NOT_MEASURED = "not measured"
CPU = "none (CPU)"
COST_NOT_APPLICABLE = "n/a (CPU)"
DTYPE_LABELS = {"bfloat16": "BF16", "float16": "FP16"}
MARKERS = ("o", "s", "^", "D", "v")  # one per task in the accuracy plot, in registry order
PLOTS = {
    "latency": "latency_vs_concurrency.png",
    "itl": "itl_by_build.png",
    "accuracy": "accuracy_vs_latency.png",
    "formats": "accuracy_vs_ms_per_token.png",
}
FORMAT_LABELS = {"fp8": "FP8", "int4_awq": "INT4-AWQ", "w4a8_awq": "W4A8-AWQ", "int8_sq": "INT8-SQ",
                 "int8_wo": "INT8-WO", "nvfp4": "NVFP4"}
LATENCY_BATCH, THROUGHPUT_BATCH = 1, 32  # the formats table's in-process columns
# Accuracy columns (overview and formats tables); tasks against a reference build (fidelity) close the formats table.
ACCURACY = [name for name, task in TASKS.items() if not task.reference]
AGAINST_REFERENCE = [name for name, task in TASKS.items() if task.reference]


@dataclasses.dataclass
class BuildData:
    """What is on disk for one config; None where a stage has not run (or left nothing usable)."""

    cfg: BuildConfig
    engine: dict[str, Any] | None
    evals: dict[str, dict[str, Any]]
    gate: list[Any]  # gating.Verdict of this build as a candidate, one per task it has results for
    gate_role: str | None  # "baseline", "candidate", or None when no gate names it
    bench: dict[str, Any] | None
    bench_path: Path | None
    inprocess: dict[str, Any] | None = None  # the latest `bench --in-process` results
    inprocess_path: Path | None = None
    throughput: list[tuple[Path, dict[str, Any]]] = dataclasses.field(default_factory=list)  # bench --throughput files

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def precision(self) -> str:
        q = self.cfg.quantization
        weights = DTYPE_LABELS[self.cfg.dtype] if q.format == "none" else FORMAT_LABELS.get(q.format, q.format.upper())
        if q.group_size and q.format != "nvfp4":
            weights += f" g{q.group_size}"
        return weights + (" + FP8 KV cache" if q.kv_cache == "fp8" else "")

    def inprocess_at(self, batch: int) -> dict[str, Any] | None:
        """The in-process run at ``batch`` and the shortest context measured, or None."""
        runs = [r for r in (self.inprocess or {}).get("runs", []) if r["batch"] == batch]
        return min(runs, key=lambda r: r["context"]) if runs else None

    @property
    def levels(self) -> list[dict[str, Any]]:
        return list(self.bench["summary"]) if self.bench else []

    def lowest_load(self) -> dict[str, Any] | None:
        """The closed-loop level with the fewest requests in flight: the single-user latency."""
        closed = [e for e in self.levels if "concurrency" in e and e["requests"]]
        return min(closed, key=lambda e: e["concurrency"]) if closed else None

    def peak(self) -> dict[str, Any] | None:
        measured = [e for e in self.levels if e.get("output_tokens_per_s")]
        return max(measured, key=lambda e: e["output_tokens_per_s"]) if measured else None

    def inprocess_single(self) -> dict[str, Any] | None:
        """The in-process run at batch 1 and the shortest context: the engine's own ms per token."""
        return self.inprocess_at(1)


@dataclasses.dataclass
class ReportResult:
    path: Path
    plots: list[Path]
    builds: list[BuildData]

    def summary(self) -> str:
        measured = sum(1 for b in self.builds if b.bench or b.evals)
        return (f"report: {self.path} ({len(self.builds)} builds, {measured} with measurements; plots: "
                + ", ".join(p.name for p in self.plots) + ")")


def report(configs: Sequence[BuildConfig], *, engines_dir: str | Path = "engines", out_dir: str | Path = "reports",
           gates_file: Path | None = None, gpu_hour_usd: float = cost.DEFAULT_GPU_HOUR_USD,
           request_tokens: int = cost.REFERENCE_REQUEST_TOKENS) -> ReportResult:
    """Write ``<out_dir>/report.md`` and its plots for ``configs``.

    Gate verdicts are judged afresh from the eval results, with the thresholds of ``gates_file``
    (the gate stage's own logic; nothing is judged when no file is given).
    """
    cost.estimate(1.0, gpus=1, gpu_hour_usd=gpu_hour_usd, request_output_tokens=request_tokens)  # validate early
    out_dir = Path(out_dir)
    gates = gating.load_gates(gates_file) if gates_file else None
    builds = [gather(cfg, engines_dir, gates) for cfg in configs]
    out_dir.mkdir(parents=True, exist_ok=True)  # only once the inputs are known good: a failure leaves nothing
    plots = [plot_latency(builds, out_dir / PLOTS["latency"]), plot_itl(builds, out_dir / PLOTS["itl"]),
             plot_accuracy(builds, out_dir / PLOTS["accuracy"]), plot_formats(builds, out_dir / PLOTS["formats"])]
    text = render_markdown(builds, engines_dir=Path(engines_dir), gpu_hour_usd=gpu_hour_usd,
                           request_tokens=request_tokens)
    path = out_dir / "report.md"
    with artifacts.atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return ReportResult(path, plots, builds)


# --------------------------------------------------------------------------- gathering


def gather(cfg: BuildConfig, engines_dir: str | Path, gates: gating.GatesFile | None = None) -> BuildData:
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    evals = {}
    for task in TASKS:
        results = read_json(paths.eval_results(task))
        if results and results.get("task") == task and results.get("n"):
            evals[task] = results
    bench_path = latest_bench(paths.bench)
    bench = read_json(bench_path) if bench_path else None
    if bench_path and not is_bench(bench):
        log.warning("report: %s is not a bench results file this version reads; shown as not measured", bench_path)
        bench = None
    verdicts, role = gate_verdicts(cfg.name, evals, gates, engines_dir)
    inprocess_path = _newest(paths.bench, f"{INPROCESS_PREFIX}*.json")
    inprocess = read_json(inprocess_path)
    if inprocess_path and not is_inprocess(inprocess):
        log.warning("report: %s is not an in-process results file this version reads; shown as not measured",
                    inprocess_path)
        inprocess = None
    throughput = [(p, d) for p in sorted(paths.bench.glob(f"{THROUGHPUT_PREFIX}*.json")) if paths.bench.is_dir()
                  and is_throughput(d := read_json(p))]
    return BuildData(cfg, artifacts.read_manifest(paths.engine), evals, verdicts, role, bench, bench_path,
                     inprocess, inprocess_path if inprocess else None, throughput)


def weight_bytes(cfg: BuildConfig) -> int | None:
    """Bytes of the model's weights as the engine holds them in the config's format (None: shape unknown)."""
    from trtllm_pipeline.model.source import known_shape
    from trtllm_pipeline.runtimes.trtllm.preflight import estimate_memory

    shape = known_shape(cfg.model)
    if shape is None:
        return None
    single = cfg.model_copy(update={"parallelism": cfg.parallelism.model_copy(update={"tp": 1})})
    return int(estimate_memory(single, shape)["weights_bytes"])


def latest_bench(bench_dir: Path) -> Path | None:
    """The served results the bench manifest names as latest, else the newest served results file there."""
    manifest = artifacts.read_manifest(bench_dir)
    if manifest and (bench_dir / str(manifest.get("latest", ""))).is_file():
        return bench_dir / manifest["latest"]
    return _newest(bench_dir, "*.json", skip=(artifacts.MANIFEST,), skip_prefix=(INPROCESS_PREFIX, THROUGHPUT_PREFIX))


def _newest(directory: Path, pattern: str, skip: Sequence[str] = (), skip_prefix: tuple[str, ...] = ()) -> Path | None:
    files = [p for p in directory.glob(pattern) if p.name not in skip and not (skip_prefix and p.name.startswith(
        skip_prefix))] if directory.is_dir() else []
    return max(files, key=lambda p: p.stat().st_mtime) if files else None


def gate_verdicts(name: str, evals: dict[str, Any], gates: gating.GatesFile | None,
                  engines_dir: str | Path) -> tuple[list[Any], str | None]:
    """This build's verdicts as a gate candidate (tasks it has results for), and its role."""
    if gates is None:
        return [], None
    if any(entry.baseline == name for entry in gates.gates):
        return [], "baseline"
    entries = [entry for entry in gates.gates if name in entry.candidates]
    if not entries:
        return [], None
    verdicts = []
    for entry in entries:
        for task in (t for t in entry.tasks if t in evals):
            paths = [artifacts.artifact_paths(engines_dir, n).eval_results(task) for n in (entry.baseline, name)]
            try:
                verdicts.append(gating.gate_pair(*paths, gates=gates))
            except PipelineError as exc:
                verdicts.append(gating.Verdict(task, entry.baseline, name, None, None, "cannot judge", exc.message))
    return verdicts, "candidate"


# --------------------------------------------------------------------------- cells


def fmt(value: float | None, spec: str = ".1f", missing: str = NOT_MEASURED) -> str:
    return number_cell(value, spec, missing)


def _label(task: str) -> str:
    return TASKS[task].label if task in TASKS else task


def runtime_cell(b: BuildData) -> str:
    return b.engine.get("runtime", "?") if b.engine else "not built"


def device_cell(b: BuildData) -> str:
    """Where the measurements ran: the eval's runtime description, else where bench found the server computing."""
    devices = [(results.get("runtime_info") or {}).get("device") for results in b.evals.values()]
    devices.append(((b.bench or {}).get("settings") or {}).get("device"))
    for device in filter(None, devices):
        return CPU if str(device).startswith("cpu") else str(device)
    return NOT_MEASURED


def accuracy_cell(b: BuildData, task: str, detail: bool = False) -> str:
    """A task's result as the task shows it (fidelity: KLD, top-1, PPL ratio), else the accuracy."""
    results = b.evals.get(task)
    if results is None:
        return NOT_MEASURED
    if TASKS[task].cell is not None:
        return TASKS[task].cell(results, detail)
    text = f"{100 * results['score']:.1f}%"
    if detail:
        low, high = results.get("ci95") or (None, None)
        if low is not None:
            text += f" [{100 * low:.1f}, {100 * high:.1f}]"
        text += f", n={results['n']}"
    return text + ("" if results.get("complete", True) else " (incomplete)")


def gate_cell(b: BuildData, detail: bool = False) -> str:
    if b.gate_role is None:
        return "no gate"
    if b.gate_role == "baseline":
        return "baseline"
    if not b.gate:
        return NOT_MEASURED
    parts = []
    for v in b.gate:
        text = f"{_label(v.task)} {v.status.upper() if v.status == 'fail' else v.status}"
        parts.append(text + (f" ({v.reason})" if detail or v.status == "cannot judge" else ""))
    return ", ".join(parts) + f" vs {b.gate[0].baseline}"


def cost_of(b: BuildData, entry: dict[str, Any] | None, gpu_hour_usd: float, request_tokens: int):
    return cost.estimate(entry["output_tokens_per_s"] if entry else None, gpus=b.cfg.parallelism.world_size,
                         gpu_hour_usd=gpu_hour_usd, request_output_tokens=request_tokens)


def cost_cells(b: BuildData, est, fields: Sequence[tuple[str, str]]) -> list[str]:
    """The cost columns; a measurement made on a CPU has none, since a GPU price does not describe it."""
    if device_cell(b) == CPU:
        return [COST_NOT_APPLICABLE] * len(fields)
    return [fmt(getattr(est, name) if est else None, spec) for name, spec in fields]


# --------------------------------------------------------------------------- markdown


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def render_markdown(builds: Sequence[BuildData], *, engines_dir: Path, gpu_hour_usd: float,
                    request_tokens: int) -> str:
    lines = [
        "# trtllm-pipeline report",
        "",
        f"Builds under `{engines_dir}`, {artifacts.now_iso()}. Latency is the lowest-concurrency bench level "
        "(p50); throughput and cost are at the level with the most output tokens/s. Cost assumes "
        f"${gpu_hour_usd:g} per GPU-hour (an assumed price, `--gpu-hour-usd`), the build's tp*pp GPUs busy "
        f"around the clock, and {request_tokens:,}-token requests; builds measured on a CPU have no GPU "
        f"cost (*{COST_NOT_APPLICABLE}*). Cells read *{NOT_MEASURED}* where no measurement exists.",
        "",
        "## Overview",
        "",
    ]
    rows = []
    for b in builds:
        low, peak = b.lowest_load(), b.peak()
        est = cost_of(b, peak, gpu_hour_usd, request_tokens)
        rows.append([
            b.name, b.precision, b.cfg.parallelism.tp, runtime_cell(b), device_cell(b),
            *(accuracy_cell(b, task) for task in ACCURACY), gate_cell(b),
            fmt(low["ttft_ms"]["p50"] if low else None), fmt(low["itl_ms"]["p50"] if low else None, ".2f"),
            fmt(peak["output_tokens_per_s"] if peak else None),
            *cost_cells(b, est, (("usd_per_1m_output_tokens", ".2f"), ("usd_per_request", ".4f"))),
        ])
    lines += _table(["build", "precision", "TP", "runtime", "GPU", *(TASKS[t].label for t in ACCURACY), "gate",
                     "TTFT ms", "ITL ms", "tokens/s", "$/1M tokens", "$/request"], rows)
    lines += ["", "## Formats", "",
              "Weight formats side by side: bytes of weights as the engine holds them (INT4 and NVFP4 pack two "
              "values a byte, plus their scales; embeddings and lm_head stay in the model dtype), accuracy and "
              "the gate against the BF16 baseline, and the decode speed `trtllm-pipeline bench -c CONFIG "
              f"--in-process` measured in-process (ms/token at batch {LATENCY_BATCH}, tokens/s at batch "
              f"{THROUGHPUT_BATCH}, each at the shortest context measured) on the device named. Emulated formats (the torch runtime on a CPU, NVFP4 "
              "without FP4 tensor cores) run slower than their kernels would: compare them on one machine. The last "
              "column is fidelity against the build's reference (`eval --tasks fidelity --reference`): mean KL "
              "divergence of its next-token distributions from the reference's (nats), top-1 agreement, "
              "PPL(build)/PPL(reference).", ""]
    lines += _table(["build", "format", "TP", "weights", *(TASKS[t].label for t in ACCURACY), "gate",
                     f"ms/token (batch {LATENCY_BATCH})", f"tokens/s (batch {THROUGHPUT_BATCH})", "measured on",
                     *(f"{TASKS[t].label} (vs its reference)" for t in AGAINST_REFERENCE)],
                    [format_row(b) for b in builds])
    lines += ["", "## Plots", ""]
    lines += [f"![latency against concurrency]({PLOTS['latency']})", "",
              f"![inter-token latency by build]({PLOTS['itl']})", "",
              f"![accuracy against inter-token latency]({PLOTS['accuracy']})", "",
              f"![accuracy against in-process ms/token per format]({PLOTS['formats']})", ""]
    for b in builds:
        lines += _build_section(b, gpu_hour_usd, request_tokens)
    return "\n".join(lines) + "\n"


def bytes_cell(n: int | None) -> str:
    if n is None:
        return "unknown shape"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def machine_cell(b: BuildData) -> str:
    """The device the in-process runs ran on, as the runtime named it."""
    device = str(((b.inprocess or {}).get("runtime") or {}).get("device") or "")
    if not device:
        return NOT_MEASURED
    return CPU if device.startswith("cpu") else device


def format_row(b: BuildData) -> list[str]:
    low, high = b.inprocess_at(LATENCY_BATCH), b.inprocess_at(THROUGHPUT_BATCH)
    machine = machine_cell(b)
    return [b.name, b.precision, str(b.cfg.parallelism.tp), bytes_cell(weight_bytes(b.cfg)),
            *(accuracy_cell(b, task) for task in ACCURACY), gate_cell(b),
            fmt(low["decode_ms"] if low else None, ".2f"), fmt(high["tokens_per_s"] if high else None, ".0f"),
            machine, *(accuracy_cell(b, task) for task in AGAINST_REFERENCE)]


def _build_section(b: BuildData, gpu_hour_usd: float, request_tokens: int) -> list[str]:
    cfg = b.cfg
    reason = (b.engine or {}).get("runtime_reason")
    facts = [
        ("model", f"`{cfg.model.source}`" + (f" @ {cfg.model.revision}" if cfg.model.revision else "")),
        ("precision", f"{b.precision}, dtype {cfg.dtype}"),
        ("parallelism", f"TP {cfg.parallelism.tp}, PP {cfg.parallelism.pp} "
                        f"({cfg.parallelism.world_size} GPU{'s' if cfg.parallelism.world_size > 1 else ''})"),
        ("engine limits", f"batch {cfg.build.max_batch_size}, input {cfg.build.max_input_len}, "
                          f"sequence {cfg.build.max_seq_len} tokens"),
        ("runtime", runtime_cell(b) + (f" ({reason})" if reason else "")),
        ("GPU", device_cell(b)),
        *((t.label, accuracy_cell(b, t.name, detail=True)) for t in TASKS.values()),
        ("gate", gate_cell(b, detail=True)),
    ]
    if b.bench:
        s = b.bench["settings"]
        prompts = f"{s['input_tokens']} tokens" if s.get("input_tokens") else s.get("dataset")
        facts.append(("bench", f"`{b.bench_path.name}`: {s['protocol']} {s['url']}, prompts {prompts}, "
                               f"{s['output_tokens']} output tokens, {s['requests']} requests per level"))
    else:
        facts.append(("bench", NOT_MEASURED))
    lines = [f"## {b.name}", ""] + _table(["", ""], facts) + [""] + _inprocess_section(b) + _throughput_section(b)
    if not b.levels:
        return lines + [f"Latency and throughput: {NOT_MEASURED}.", ""]
    rows = []
    for e in b.levels:
        est = cost_of(b, e, gpu_hour_usd, request_tokens)
        rows.append([
            level_label(e), e["requests"], e["errors"], fmt(e["ttft_ms"]["p50"]), fmt(e["ttft_ms"]["p99"]),
            fmt(e["itl_ms"]["p50"], ".2f"), fmt(e["itl_ms"]["p99"], ".2f"), fmt(e["e2e_ms"]["p50"]),
            fmt(e["output_tokens_per_s"]), fmt(e["requests_per_s"], ".2f"),
            *cost_cells(b, est, (("usd_per_1m_output_tokens", ".2f"), ("usd_per_request", ".4f"),
                                 ("requests_per_day", ",.0f"))),
        ])
    return lines + _table(["load", "ok", "errors", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
                           "e2e p50 ms", "tokens/s", "requests/s", "$/1M tokens", "$/request", "requests/day"],
                          rows) + [""]


def _inprocess_section(b: BuildData) -> list[str]:
    """The engine timed in-process (`bench --in-process`), by batch and context."""
    if not b.inprocess:
        return []
    rt = b.inprocess["runtime"]
    lines = [f"In-process decode (`{b.inprocess_path.name}`): {rt.get('runtime')} runtime on {rt.get('device')}, "
             f"decode {rt.get('decode_path', 'n/a')}.", ""]
    floor = [None if r["fraction_of_floor"] is None else 100 * r["fraction_of_floor"] for r in b.inprocess["runs"]]
    rows = [[r["batch"], r["context"], fmt(r["decode_ms"], ".3f"), fmt(r["tokens_per_s"], ".0f"),
             fmt(r["achieved_gbps"], ".0f", "n/a"), fmt(f, ".0f", "n/a"),  # n/a: no copy speed (CPU), no floor
             fmt(r["prefill_ms"]), fmt(r["peak_memory_gib"], ".2f", "n/a")] for r, f in zip(b.inprocess["runs"], floor)]
    return lines + _table(["batch", "context", "ms/token", "tokens/s", "GB/s", "% of floor", "prefill ms",
                           "peak GiB"], rows) + [""]


def _throughput_section(b: BuildData) -> list[str]:
    """Every `bench --in-process --throughput` file of the build, each run beside TensorRT-LLM's published row of
    the same lengths (labelled: another model and engine)."""
    lines: list[str] = []
    for path, data in b.throughput:
        ref = data.get("reference", {})
        published = ref.get("output_tokens_per_s", {})
        rt = data["runtime"]
        lines += [f"In-process throughput (`{path.name}`): {rt.get('runtime')} runtime on {rt.get('device')}; "
                  f"reference: {ref.get('source', 'none')} (another model and engine, for scale).", ""]
        rows = []
        for r in data["runs"]:
            pair = f"{r['input_tokens']}/{r['output_tokens']}"
            prefix = "-" if not r["shared_prefix"] else f"{r['shared_prefix']} ({'reuse' if r['reuse'] else 'no reuse'})"
            rows.append([pair, r["requests"], prefix, fmt(r["output_tokens_per_s"]), fmt(r["requests_per_s"], ".2f"),
                         fmt(r["ttft_ms"]["p50"]), fmt(r["itl_ms"]["p50"], ".2f"), fmt(r["itl_ms"]["p99"], ".2f"),
                         fmt(r["kv_usage_peak"] and 100 * r["kv_usage_peak"], ".0f"), fmt(r["preemptions"], "d"),
                         fmt(r["peak_memory_gib"], ".2f"), fmt(r.get("workspace_gib"), ".2f"),
                         fmt(published.get(pair), ",d")])
        if rows:
            lines += _table(["in/out", "requests", "shared prefix", "output tokens/s", "requests/s", "TTFT p50 ms",
                             "ITL p50 ms", "ITL p99 ms", "KV peak %", "preemptions", "peak GiB",
                             "over weights + KV GiB", "TensorRT-LLM H200 (reference)"], rows) + [""]
        mode = "on" if rt.get("batch_invariant") else "off"
        for r in data["runs"]:
            if r.get("same_output_share") is not None:
                lines += [f"Greedy outputs with the prefix cache identical to those without ({r['input_tokens']}/"
                          f"{r['output_tokens']}, runtime.batch_invariant {mode}): {r['same_output_share']:.1%}.", ""]
        lines += _long_prompt_table(data.get("long_prompt"))
    return lines


def _long_prompt_table(lp: dict[str, Any] | None) -> list[str]:
    """`--long-prompt`: the running requests' gaps while one long prompt was prefilled beside them (issue 31)."""
    if not lp:
        return []
    verdict = "yes" if lp["within_one_chunk"] else "no"
    row = [lp["prompt_tokens"], f"{lp['decoding_requests']} x {lp['input_tokens']}/{lp['output_tokens']}",
           fmt(lp["chunk_budget"], "d"), f"{lp['prefill_steps']} / {fmt(lp['prefill_chunks'], 'd')}",
           fmt(lp["chunk_step_ms"]["p50"]), fmt(lp["steady_itl_ms"]["p50"], ".2f"), fmt(lp["worst_gap_ms"]),
           fmt(lp["p99_gap_ms"]), lp["decode_rows_without_token"], verdict]
    return (["Long prompt beside running decodes: their worst inter-token gap while it was prefilled, against one "
             "chunk step + the steady ITL.", ""]
            + _table(["prompt tokens", "decoding", "chunk budget", "prefill steps / chunks", "chunk step p50 ms",
                      "steady ITL p50 ms", "worst gap ms", "p99 gap ms", "request-steps without a token",
                      "within one chunk"], [row]) + [""])


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    return plt


def _figure(ncols: int = 1, height: float = 4.4, width: float = 6.4):
    plt = _pyplot()
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return plt, fig, list(axes[0])


def _save(plt, fig, path: Path, missing: Sequence[str], layout: bool = True) -> Path:
    """``layout``: False where the caller laid the figure out itself (room for a figure legend)."""
    if missing:
        fig.text(0.01, 0.01, f"{NOT_MEASURED}: " + ", ".join(missing), fontsize=7, color="dimgray", va="bottom")
    if layout:
        fig.tight_layout(rect=(0, 0.04 if missing else 0, 1, 1))
    with artifacts.atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def plot_latency(builds: Sequence[BuildData], path: Path) -> Path:
    plt, fig, (ttft_ax, itl_ax) = _figure(2)
    missing, levels = [], set()
    for b in builds:
        closed = sorted((e for e in b.levels if "concurrency" in e and e["requests"]), key=lambda e: e["concurrency"])
        if not closed:
            missing.append(b.name)
            continue
        x = [e["concurrency"] for e in closed]
        levels.update(x)
        ttft_ax.plot(x, [e["ttft_ms"]["p50"] for e in closed], marker="o", label=b.name)
        itl_ax.plot(x, [e["itl_ms"]["p50"] for e in closed], marker="o", label=b.name)
    for ax, title in ((ttft_ax, "time to first token, p50 (ms)"), (itl_ax, "inter-token latency, p50 (ms)")):
        ax.set_title(title)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(sorted(levels), [str(v) for v in sorted(levels)])
            ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
        ax.grid(alpha=0.3)
        if len(missing) < len(builds):
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, NOT_MEASURED, ha="center", va="center", transform=ax.transAxes, color="dimgray")
    return _save(plt, fig, path, missing)


def device_label(device: str | None) -> str:
    """A panel's name for a device as the runtimes name it (``cpu``, ``cuda:0 (NVIDIA H200)``, ``cuda``)."""
    device = str(device or "")
    if not device:
        return "device not recorded"
    if device.startswith("cpu"):
        return "CPU"
    name = device.split("(", 1)[1].rstrip(")") if "(" in device else ""
    return f"GPU: {name}" if name else "GPU"


def served_device(b: BuildData) -> str | None:
    """Where the served (bench) and eval numbers ran."""
    cell = device_cell(b)
    return None if cell == NOT_MEASURED else ("cpu" if cell == CPU else cell)


def inprocess_device(b: BuildData) -> str | None:
    return ((b.inprocess or {}).get("runtime") or {}).get("device")


def _log_x(ax) -> None:
    """A log x axis labelled in plain numbers (2, 5, 10, 20 ms rather than 2x10^0)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _panels(plt, rows_per_panel: Sequence[int], width: float):
    """Stacked panels, each as tall as its rows, each with an x axis of its own."""
    heights = [max(rows, 1) for rows in rows_per_panel]
    fig, axes = plt.subplots(len(heights), 1, figsize=(width, 1.3 * len(heights) + 0.42 * sum(heights)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    return fig, [row[0] for row in axes]


ITL_STYLES = {"served": ("tab:green", None, "served: p50 ITL at the lowest concurrency"),
              "in-process": ("tab:blue", None, "in-process: decode ms/token at batch 1"),
              "published": ("lightgray", "//", "published by NVIDIA (TensorRT-LLM, H200), not measured here")}


def itl_panels(builds: Sequence[BuildData]) -> tuple[dict[str, list[tuple[str, list[tuple[float, str]]]]], list[str]]:
    """The ITL plot's panels: {device panel: [(row name, [(ms, "served" | "in-process" | "published")])]}, and the
    builds with nothing to show. TensorRT-LLM's published H200 figures join the one GPU panel, else their own."""
    panels: dict[str, list[tuple[str, list[tuple[float, str]]]]] = {}
    missing = []
    for b in builds:
        low, single = b.lowest_load(), b.inprocess_single()
        bars = []
        if low and low["itl_ms"]["p50"] is not None:
            bars.append((device_label(served_device(b)), low["itl_ms"]["p50"], "served"))
        if single:
            bars.append((device_label(inprocess_device(b)), single["decode_ms"], "in-process"))
        if not bars:
            missing.append(b.name)
        for panel in dict.fromkeys(p for p, _, _ in bars):
            panels.setdefault(panel, []).append((b.name, [(v, kind) for p, v, kind in bars if p == panel]))
    gpu_panels = [p for p in panels if p.startswith("GPU")]
    reference_panel = gpu_panels[0] if len(gpu_panels) == 1 else "published reference (TensorRT-LLM, H200)"
    panels.setdefault(reference_panel, [])
    panels[reference_panel] += [(f"reference: TensorRT-LLM {label}", [(value, "published")])
                                for label, value in REFERENCE_RECIPE_MS_PER_TOKEN]
    return panels, missing


def plot_itl(builds: Sequence[BuildData], path: Path) -> Path:
    """Horizontal bars of ms/token per build, one panel per device (a tiny model on a CPU never shares an axis
    with a 7B on a GPU), bars told apart by colour with a legend: served ITL at the lowest load, in-process
    decode at batch 1; TensorRT-LLM's published H200 recipe in the GPU panel (its own panel when no build ran
    on a GPU, or on several). A log axis where a panel's values span more than 10x."""
    from matplotlib.patches import Patch

    plt = _pyplot()
    panels, missing = itl_panels(builds)
    order = sorted(panels, key=lambda p: (not p.startswith("CPU"), p))
    fig, axes = _panels(plt, [len(panels[p]) for p in order], width=9.0)
    for ax, panel in zip(axes, order):
        rows = panels[panel]
        values = [v for _, bars in rows for v, _ in bars]
        for i, (name, bars) in enumerate(rows):
            for j, (value, kind) in enumerate(bars):
                color, hatch, _ = ITL_STYLES[kind]
                y = i + (j - (len(bars) - 1) / 2) * 0.38
                ax.barh(y, value, height=0.36 if len(bars) > 1 else 0.7, color=color, hatch=hatch,
                        edgecolor="gray" if hatch else None)
                ax.text(value, y, f" {value:.2f} ms", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        if max(values) > 10 * min(values):
            _log_x(ax)
            ax.set_xlim(min(values) / 2, max(values) * 4)
        else:
            ax.set_xlim(0, max(values) * 1.35)
        ax.set_title(panel, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms per token (each panel its own axis: devices are not compared)")
    shown = {kind for rows in panels.values() for _, bars in rows for _, kind in bars}
    kinds = [k for k in ITL_STYLES if k in shown]
    handles = [Patch(facecolor=ITL_STYLES[k][0], hatch=ITL_STYLES[k][1],
                                        edgecolor="gray" if ITL_STYLES[k][1] else None) for k in kinds]
    fig.legend(handles, [ITL_STYLES[k][2] for k in kinds], loc="upper right", fontsize=7, frameon=False,
               title="ms per token by build, one panel per device", title_fontsize=8)
    top = (0.2 * len(kinds) + 0.3) / fig.get_figheight()  # room for the legend above the first panel
    fig.tight_layout(rect=(0, 0.04 if missing else 0, 1, 1 - top))
    return _save(plt, fig, path, missing, layout=False)


def plot_accuracy(builds: Sequence[BuildData], path: Path) -> Path:
    def served_itl(b: BuildData) -> tuple[float, str] | None:
        low = b.lowest_load()
        return (low["itl_ms"]["p50"], device_label(served_device(b))) if low else None

    return _accuracy_scatter(builds, path, served_itl, lambda b: b.name,
                             "inter-token latency at the lowest concurrency, p50 (ms)", "accuracy against latency")


def plot_formats(builds: Sequence[BuildData], path: Path) -> Path:
    """Accuracy against in-process ms/token (batch 1), one point per build and task, a colour per build."""
    def inprocess_ms(b: BuildData) -> tuple[float, str] | None:
        low = b.inprocess_at(LATENCY_BATCH)
        return (low["decode_ms"], device_label(inprocess_device(b))) if low else None

    return _accuracy_scatter(builds, path, inprocess_ms, lambda b: f"{b.precision} ({b.name})",
                             f"in-process decode, batch {LATENCY_BATCH} (ms/token)",
                             "accuracy against ms/token, per weight format")


def _accuracy_scatter(builds: Sequence[BuildData], path: Path, x_of, name_of, xlabel: str, title: str) -> Path:
    """One point per build and task: accuracy against ``x_of(build)`` -> (x, device panel); a colour per build and
    a marker per task, named in legends (labels beside points overlapped where builds sit close); one panel
    per device. Builds without an x or evals are listed as not measured."""
    plt = _pyplot()
    points: dict[str, list[tuple[BuildData, float]]] = {}
    missing = []
    for b in builds:
        found = x_of(b)
        if found is None or not b.evals:
            missing.append(b.name)
            continue
        points.setdefault(found[1], []).append((b, found[0]))
    order = sorted(points, key=lambda p: (not p.startswith("CPU"), p)) or ["not measured"]
    fig, axes = plt.subplots(1, len(order), figsize=(6.4 * len(order) + 2.6, 4.6), squeeze=False)
    axes = list(axes[0])
    markers = dict(zip(TASKS, MARKERS))
    colors = plt.get_cmap("tab10")
    build_handles, task_handles = {}, {}
    for ax, panel in zip(axes, order):
        xs = []
        for b, x in points.get(panel, []):
            known = build_handles.get(b.name)
            color = known.get_color() if known else colors(len(build_handles) % 10)
            size = max(110 - 22 * len(build_handles), 20)  # later builds smaller: equal points show as rings
            for task, results in b.evals.items():
                if TASKS[task].reference:  # fidelity: not an accuracy
                    continue
                ax.scatter(x, 100 * results["score"], marker=markers.get(task, "^"), color=color, s=size,
                           edgecolors="black", linewidths=0.4)
                build_handles.setdefault(b.name, ax.plot([], [], "o", color=color, label=name_of(b))[0])
                task_handles.setdefault(task, ax.plot([], [], markers.get(task, "^"), color="gray",
                                                      label=_label(task))[0])
            xs.append(x)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{title}: {panel}" if points else title, fontsize=9)
        ax.grid(alpha=0.3)
        if xs and max(xs) > 10 * min(xs):
            _log_x(ax)
        if not points:
            ax.text(0.5, 0.5, NOT_MEASURED, ha="center", va="center", transform=ax.transAxes, color="dimgray")
    if build_handles:
        fig.legend(list(build_handles.values()) + list(task_handles.values()),
                   [h.get_label() for h in build_handles.values()] + [h.get_label() for h in task_handles.values()],
                   loc="center right", fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, 0.04 if missing else 0, 1 - 2.6 / (6.4 * len(order) + 2.6), 1))
    return _save(plt, fig, path, missing, layout=not build_handles)
