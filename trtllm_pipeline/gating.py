"""The accuracy gate's rules: the gates file, the thresholds, and the verdict on two results files.

Two eval results files of one task are compared item by item (paired: both runs answered the same
questions, so only the items where they disagree carry information). The verdict:

* **fail** when the drop (baseline minus candidate accuracy, in points) exceeds ``max_drop``
  *and* the difference is significant (exact McNemar test, p < ``alpha``), or when the candidate
  scores below ``min_score``. Requiring both keeps the gate from flaking on noise: on a small
  subset a few items changing sides can push the observed drop past the threshold, but then the
  discordant counts are balanced enough that McNemar calls it chance. A real drop beyond the
  threshold fails once the items show it. When the 95% interval of the drop is wider than
  ``max_drop``, the verdict notes that the subset is too small to resolve a drop of that size.
* **cannot judge** when the files are not comparable or not trustworthy: another task, other
  settings or data, other item ids or prompts, incomplete runs, a malformed file, non-finite
  numbers. The gate fails closed: nothing it cannot check passes.

Thresholds come from the command line, else from ``eval/gates.yaml`` (the entry naming the two
configs, else the file's per-task defaults), else from the task itself (``Task.max_drop``). The
``gate`` stage runs these rules; ``report`` shows their verdicts.

The **fidelity** task is judged on its own rules (``judge_fidelity``): its candidate results were
measured against a reference build, which must be the gate's baseline as built now (the engine
hash in the candidate's results is the baseline's); the gate fails when the mean KL divergence
exceeds ``max_mean_kld``, top-1 agreement falls below ``min_top1``, or the perplexity ratio
exceeds ``max_ppl_ratio`` (the ``fidelity`` section of the gates file, or of its entry). These are
measured over thousands of tokens of one fixed text: no significance test, the numbers are the verdict.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_pipeline.config import load_yaml
from trtllm_pipeline.errors import ConfigError, InputError
from trtllm_pipeline.results import load_eval
from trtllm_pipeline.tasks import fidelity
from trtllm_pipeline.tasks.registry import TASKS, TaskName
from trtllm_pipeline.tasks.stats import PairedComparison, compare_paired

log = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.05


# --------------------------------------------------------------------------- gates.yaml


class _Strict(BaseModel):
    # Fails closed: a threshold that is NaN, infinite, a string or a boolean is an error, never a pass.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


MaxDrop = Annotated[float, Field(ge=0, le=100)]  # points
Score = Annotated[float, Field(ge=0, le=1)]


class FidelityLimits(_Strict):
    """The fidelity task's thresholds (llama.cpp's `perplexity --kl-divergence` statistics)."""

    max_mean_kld: float = Field(0.1, ge=0, description="largest mean KL(P_base || P_cand), nats per token")
    min_top1: float = Field(0.85, ge=0, le=1, description="smallest top-1 agreement, 0..1")
    max_ppl_ratio: float = Field(1.1, ge=1, description="largest PPL(candidate) / PPL(baseline)")


class GateEntry(_Strict):
    baseline: str = Field(description="config name of the reference build")
    candidates: list[str] = Field(min_length=1, description="config names judged against it")
    tasks: list[TaskName] = Field(default_factory=lambda: list(TASKS))
    max_drop: dict[TaskName, MaxDrop] = Field(default_factory=dict, description="points; overrides the defaults")
    min_score: dict[TaskName, Score] = Field(default_factory=dict, description="0..1; overrides the defaults")
    fidelity: FidelityLimits | None = Field(None, description="overrides the file's fidelity thresholds")


class GatesFile(_Strict):
    alpha: float = Field(DEFAULT_ALPHA, gt=0, lt=1, description="significance level of the McNemar test")
    max_drop: dict[TaskName, MaxDrop] = Field(default_factory=dict, description="default allowed drop, points")
    min_score: dict[TaskName, Score] = Field(default_factory=dict, description="default absolute floor, 0..1")
    fidelity: FidelityLimits = Field(default_factory=FidelityLimits)
    gates: list[GateEntry] = Field(default_factory=list)

    def entry(self, baseline: str, candidate: str) -> GateEntry | None:
        return next((g for g in self.gates if g.baseline == baseline and candidate in g.candidates), None)


def load_gates(path: Path) -> GatesFile:
    if not Path(path).is_file():
        raise ConfigError(f"{path}: cannot read the gates file (no such file).",
                          fix="pass --gates FILE, or --max-drop on the command line")
    try:
        data = load_yaml(path, "gates") or {}
    except ConfigError as exc:
        raise ConfigError(exc.message, fix="see the comments at the top of eval/gates.yaml") from None
    try:
        return GatesFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid gates file: {_first_error(exc)}",
                          fix="see the comments at the top of eval/gates.yaml") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    value = repr(err.get("input"))
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {value[:60]})"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    max_drop: float  # points
    min_score: float | None
    alpha: float


def thresholds(task: str, baseline: str, candidate: str, gates: GatesFile | None, *,
               max_drop: float | None = None, min_score: float | None = None,
               alpha: float | None = None) -> Thresholds:
    """Command line first, then the gates file's entry for these configs, then its defaults, then the task's."""
    entry = gates.entry(baseline, candidate) if gates else None

    def first(given: float | None, key: str) -> float | None:
        found = [given] + [getattr(source, key).get(task) for source in (entry, gates) if source is not None]
        return next((value for value in found if value is not None), None)

    chosen_drop = first(max_drop, "max_drop")
    if chosen_drop is None and task in TASKS:
        chosen_drop = TASKS[task].max_drop
    if chosen_drop is None:
        raise InputError(f"no max-drop for {task} ({candidate} vs {baseline}).",
                         fix="pass --max-drop POINTS, or set it in the gates file (eval/gates.yaml)")
    chosen_alpha = alpha if alpha is not None else (gates.alpha if gates else DEFAULT_ALPHA)
    limits = Thresholds(chosen_drop, first(min_score, "min_score"), chosen_alpha)
    check_thresholds(limits)
    return limits


def check_thresholds(limits: Thresholds) -> None:
    """Fail closed on a threshold no comparison can honestly be made against (NaN compares false)."""
    for name, value, low, high in (("max-drop", limits.max_drop, 0.0, 100.0), ("min-score", limits.min_score, 0.0, 1.0),
                                   ("alpha", limits.alpha, 0.0, 1.0)):
        if value is None and name == "min-score":
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or not low <= value <= high or (name == "alpha" and value in (0.0, 1.0)):
            raise InputError(f"{name} is {value!r}: a threshold must be a finite number in "
                             f"{'(0, 1)' if name == 'alpha' else f'{low:g}..{high:g}'}.",
                             fix=f"pass a number (--{name}) or correct it in the gates file")


# --------------------------------------------------------------------------- verdicts


@dataclasses.dataclass
class Verdict:
    task: str
    baseline: str  # config names
    candidate: str
    comparison: PairedComparison | dict[str, Any] | None  # fidelity: ``fidelity.summarize``'s statistics
    limits: Thresholds | FidelityLimits | None
    status: Literal["pass", "fail", "cannot judge"]
    reason: str
    notes: list[str] = dataclasses.field(default_factory=list)


def _check_comparable(baseline: dict[str, Any], candidate: dict[str, Any]) -> None:
    """InputError unless the two files are of one task, run with the same settings."""
    b_name, c_name = baseline["config"], candidate["config"]
    if baseline["task"] != candidate["task"]:
        raise InputError(f"the baseline is {baseline['task']} and the candidate {candidate['task']}: different tasks.")
    task = baseline["task"]
    differ = sorted(k for k in set(baseline["settings"]) | set(candidate["settings"])
                    if baseline["settings"].get(k) != candidate["settings"].get(k))
    if differ:
        shown = "; ".join(f"{k}: {baseline['settings'].get(k)!r} vs {candidate['settings'].get(k)!r}" for k in differ)
        raise InputError(f"{task}: {c_name} and {b_name} ran with different settings ({shown}).",
                         fix="re-run both evals with the same --limit, data and evaluation settings")


def judge(baseline: dict[str, Any], candidate: dict[str, Any], limits: Thresholds) -> Verdict:
    """Compare two loaded results files; InputError when they cannot be compared."""
    _check_comparable(baseline, candidate)
    b_name, c_name, task = baseline["config"], candidate["config"], baseline["task"]
    base_items = {it["id"]: it for it in baseline["items"]}
    cand_items = {it["id"]: it for it in candidate["items"]}
    if base_items.keys() != cand_items.keys():
        missing, extra = sorted(base_items.keys() - cand_items.keys()), sorted(cand_items.keys() - base_items.keys())
        raise InputError(f"{task}: the two runs hold different items: the candidate lacks {len(missing)} of the "
                         f"baseline's ({', '.join(missing[:3]) or '-'}) and has {len(extra)} others "
                         f"({', '.join(extra[:3]) or '-'}).", fix="compare runs over the same selection of items")
    for key in ("target", "prompt_sha256"):
        changed = [i for i, it in base_items.items() if it.get(key) != cand_items[i].get(key)]
        if changed:
            raise InputError(f"{task}: {len(changed)} items differ in `{key}` between the runs (e.g. {changed[0]}); "
                             "they did not see the same questions or prompts.",
                             fix="re-run both evals with the same data and engine input limits")
    notes = [f"{r['config']}: header score {r['score']:.4f} disagrees with its items "
             f"({sum(it['correct'] for it in r['items']) / len(r['items']):.4f}); judging the items"
             for r in (baseline, candidate)
             if abs(r["score"] - sum(it["correct"] for it in r["items"]) / len(r["items"])) > 1e-9]
    order = list(base_items)
    cmp = compare_paired([base_items[i]["correct"] for i in order], [cand_items[i]["correct"] for i in order])
    status, reason = _decide(cmp, limits)
    half_width = (cmp.drop_ci95[1] - cmp.drop_ci95[0]) / 2
    if half_width > limits.max_drop:
        notes.append(f"{task}: the drop's 95% interval is ±{half_width:.1f} points on {cmp.n} items, wider than "
                     f"max-drop {limits.max_drop:g}: too few items to resolve a drop of that size")
    if baseline.get("model") != candidate.get("model"):
        notes.append(f"{task}: different models ({baseline.get('model')} vs {candidate.get('model')})")
    return Verdict(task, b_name, c_name, cmp, limits, status, reason, notes)


def _decide(cmp: PairedComparison, limits: Thresholds) -> tuple[Literal["pass", "fail"], str]:
    if limits.min_score is not None and cmp.candidate_score < limits.min_score:
        return "fail", f"score {100 * cmp.candidate_score:.2f} below min-score {100 * limits.min_score:.2f}"
    if cmp.drop > limits.max_drop:
        if cmp.p_value < limits.alpha:
            return "fail", f"drop {cmp.drop:.2f} > {limits.max_drop:g} points, significant (p={cmp.p_value:.2g})"
        return "pass", f"drop {cmp.drop:.2f} > {limits.max_drop:g} points but within noise (p={cmp.p_value:.2g})"
    return "pass", f"drop {cmp.drop:.2f} <= {limits.max_drop:g} points"


def fidelity_limits(baseline: str, candidate: str, gates: GatesFile | None) -> FidelityLimits:
    """The gates file's entry for these configs, else its defaults, else the built-in defaults."""
    entry = gates.entry(baseline, candidate) if gates else None
    if entry is not None and entry.fidelity is not None:
        return entry.fidelity
    return gates.fidelity if gates else FidelityLimits()


def judge_fidelity(baseline: dict[str, Any], candidate: dict[str, Any], limits: FidelityLimits) -> Verdict:
    """The candidate's fidelity results against the thresholds; InputError when they were not
    measured against this baseline as it is built now, or hold no fidelity statistics."""
    _check_comparable(baseline, candidate)
    b_name, c_name, task = baseline["config"], candidate["config"], baseline["task"]
    measured = candidate.get("reference") or {}
    fix = (f"re-run `trtllm-pipeline eval -c <{c_name} config> --tasks fidelity --reference <{b_name} config>` "
           f"(or set evaluation.fidelity_reference: {b_name})")
    if measured.get("config") != b_name:
        raise InputError(f"{task}: {c_name} was compared with {measured.get('config') or 'itself'}, not {b_name}.",
                         fix=fix)
    if measured.get("engine") != baseline.get("engine"):
        raise InputError(f"{task}: {b_name}'s engine is not the one {c_name} was compared with (rebuilt since?).",
                         fix=fix)
    fields = ("kld", "nll", "nll_reference")
    for results in (baseline, candidate):
        if bad := next((it["id"] for it in results["items"]
                        if not all(isinstance(it.get(k), (int, float)) for k in fields)), None):
            raise InputError(f"{task}: item {bad} of {results['config']} lacks its {'/'.join(fields)} numbers.",
                             fix="re-run the eval")
    stats = fidelity.summarize(candidate["items"])
    failed = [text for broken, text in (
        (stats["kld_mean"] > limits.max_mean_kld, f"mean KLD {stats['kld_mean']:.4f} > {limits.max_mean_kld:g}"),
        (stats["top1"] < limits.min_top1, f"top-1 agreement {100 * stats['top1']:.2f}% < {100 * limits.min_top1:g}%"),
        (stats["ppl_ratio"] > limits.max_ppl_ratio,
         f"PPL ratio {stats['ppl_ratio']:.4f} > {limits.max_ppl_ratio:g}"),
    ) if broken]
    reason = "; ".join(failed) or (f"mean KLD {stats['kld_mean']:.4f} <= {limits.max_mean_kld:g}, top-1 "
                                   f"{100 * stats['top1']:.2f}% >= {100 * limits.min_top1:g}%, PPL ratio "
                                   f"{stats['ppl_ratio']:.4f} <= {limits.max_ppl_ratio:g}")
    notes = []
    own = fidelity.summarize(baseline["items"])["ppl"]
    if abs(own - stats["ppl_reference"]) > 1e-4 * own:
        notes.append(f"{task}: {b_name}'s own PPL {own:.4f} differs from the {stats['ppl_reference']:.4f} measured "
                     f"beside {c_name} (another runtime setting?)")
    return Verdict(task, b_name, c_name, stats, limits, "fail" if failed else "pass", reason, notes)


def gate_pair(baseline_path: str | Path, candidate_path: str | Path, *, gates: GatesFile | None,
              max_drop: float | None = None, min_score: float | None = None,
              alpha: float | None = None) -> Verdict:
    baseline, candidate = load_eval(baseline_path), load_eval(candidate_path)
    if baseline["task"] in TASKS and TASKS[baseline["task"]].reference:
        return judge_fidelity(baseline, candidate,
                              fidelity_limits(baseline["config"], candidate["config"], gates))
    limits = thresholds(baseline["task"], baseline["config"], candidate["config"], gates,
                        max_drop=max_drop, min_score=min_score, alpha=alpha)
    return judge(baseline, candidate, limits)
