"""Stage ``gate``: does a candidate build keep the accuracy of its baseline? A CI check.

One pair of results files (``--baseline``/``--candidate``), or every gate of ``eval/gates.yaml`` on
the results under the engines directory; the rules and the verdicts are ``gating``'s. The table
shows each verdict; the exit status is 0 when every gate passed, 1 when one failed (a definite
failure outranks the rest), 2 when one cannot be judged.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError, StageFailed
from trtllm_pipeline.gating import FidelityLimits, GatesFile, Verdict, gate_pair, load_gates


def run(*, baseline: Path | None, candidate: Path | None, gates_path: Path, engines_dir: str | Path,
        only: str | None, **limits: float | None) -> list[Verdict]:
    """The verdicts of one pair (with ``baseline`` and ``candidate``) or of the gates file.

    ``limits`` (max_drop, min_score, alpha) override the file's thresholds; with ``max_drop`` given,
    a pair needs no gates file.
    """
    if baseline is not None and candidate is not None:
        gates = load_gates(gates_path) if gates_path.is_file() or limits.get("max_drop") is None else None
        return [gate_pair(baseline, candidate, gates=gates, **limits)]
    verdicts = gate_all(load_gates(gates_path), engines_dir=engines_dir, only=only, **limits)
    if not verdicts:
        raise InputError(f"{gates_path}: no gates" + (f" with a baseline starting {only!r}" if only else "") + ".")
    return verdicts


def check(verdicts: list[Verdict]) -> str:
    """The closing line when every gate passed; else StageFailed (exit 1) or InputError (exit 2)."""
    failed = [v for v in verdicts if v.status == "fail"]
    unjudged = [v for v in verdicts if v.status == "cannot judge"]
    if failed:
        raise StageFailed("accuracy gate failed: " + "; ".join(f"{v.task} {v.candidate}: {v.reason}" for v in failed))
    if unjudged:
        raise InputError("cannot judge: " + "; ".join(f"{v.task} {v.candidate}: {v.reason}" for v in unjudged))
    return "gate passed"


def gate_all(gates: GatesFile, *, engines_dir: str | Path = "engines", only: str | None = None,
             **limits: float | None) -> list[Verdict]:
    """Every gate of the gates file (those whose baseline starts with ``only``), on the eval results
    under ``engines_dir``; a pair that cannot be judged is a verdict of its own. ``limits``
    (max_drop, min_score, alpha) override the file's thresholds."""
    verdicts = []
    for entry in gates.gates:
        if only and not entry.baseline.startswith(only):
            continue
        for candidate in entry.candidates:
            for task in entry.tasks:
                base_path = artifacts.artifact_paths(engines_dir, entry.baseline).eval_results(task)
                cand_path = artifacts.artifact_paths(engines_dir, candidate).eval_results(task)
                try:
                    verdicts.append(gate_pair(base_path, cand_path, gates=gates, **limits))
                except InputError as exc:
                    verdicts.append(Verdict(task, entry.baseline, candidate, None, None, "cannot judge", exc.message))
    return verdicts


# --------------------------------------------------------------------------- the table


COLUMNS = ("task", "candidate", "baseline", "n", "base %", "cand %", "drop", "drop 95% CI", "McNemar p",
           "lost/gained", "max drop", "verdict")


FIDELITY_COLUMNS = ("task", "candidate", "baseline", "tokens", "mean KLD", "KLD p99", "KLD max", "top-1 %",
                    "PPL base", "PPL cand", "PPL ratio", "limits (KLD/top-1/ratio)", "verdict")


def format_table(verdicts: list[Verdict]) -> str:
    """The accuracy verdicts' table, the fidelity verdicts' table (where there are any), then each reason."""
    accuracy = [v for v in verdicts if not isinstance(v.limits, FidelityLimits)]
    fidelity = [v for v in verdicts if isinstance(v.limits, FidelityLimits)]
    tables = ([_columns(COLUMNS, [_accuracy_row(v) for v in accuracy])] if accuracy or not fidelity else []) + \
             ([_columns(FIDELITY_COLUMNS, [_fidelity_row(v) for v in fidelity])] if fidelity else [])
    lines = ["\n\n".join(tables)]
    for v in verdicts:
        lines.append(f"{v.task} {v.candidate}: {v.status}: {v.reason}")
        lines.extend(f"  note: {note}" for note in v.notes)
    return "\n".join(lines)


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fidelity_row(v: Verdict) -> tuple[str, ...]:
    s, lim = v.comparison, v.limits
    return (v.task, v.candidate, v.baseline, str(s["tokens"]), f"{s['kld_mean']:.4f}", f"{s['kld_p99']:.4f}",
            f"{s['kld_max']:.3f}", f"{100 * s['top1']:.2f}", f"{s['ppl_reference']:.3f}", f"{s['ppl']:.3f}",
            f"{s['ppl_ratio']:.4f}", f"{lim.max_mean_kld:g}/{100 * lim.min_top1:g}%/{lim.max_ppl_ratio:g}",
            v.status.upper())


def _accuracy_row(v: Verdict) -> tuple[str, ...]:
    c = v.comparison
    if c is None:
        return (v.task, v.candidate, v.baseline, *["-"] * 8, v.status.upper())
    return (v.task, v.candidate, v.baseline, str(c.n), f"{100 * c.baseline_score:.2f}",
            f"{100 * c.candidate_score:.2f}", f"{c.drop:+.2f}", f"[{c.drop_ci95[0]:+.2f}, {c.drop_ci95[1]:+.2f}]",
            f"{c.p_value:.3g}", f"{c.lost}/{c.gained}", f"{v.limits.max_drop:g}", v.status.upper())

