"""The accuracy table's runs on two machines, item by item (issue 33): the GPU's fast path against the CPU's float32.

    python benchmarks/accuracy_compare.py extract --engines-dir ENGINES [--model M] [--formats "bf16 fp8"] -o DIR
    python benchmarks/accuracy_compare.py yardstick --engines-dir ENGINES --data-dir DATA -o DIR
    python benchmarks/accuracy_compare.py compare CPU_DIR GPU_DIR [--yardstick DIR [--yardstick-base DIR]] [--formats ...] [-o compare.json]

``extract`` keeps, per format, what the comparison reads from a run's ``eval/<task>.json`` (``tools/accuracy_table.py``
made them): each MMLU item's letter log-likelihoods and prediction, each GSM8K item's output and answer, fidelity's
statistics and, per scored token, the build's top-1 token and its NLL of the real one; the device, and the hash of the
quantized checkpoint (the same bytes on both machines, or another calibration). The CPU's are committed
(``benchmarks/results/cpu-accuracy-smollm2/``); ``benchmarks/h200_run.sh accuracy`` extracts the GPU's and compares.

``compare`` writes JSON and prints a markdown table, per format: MMLU items with the same letter, each differing item
with its margin (best minus runner-up log-likelihood) on each machine, and the largest and mean |ΔLL| of the letters;
GSM8K's same answers and same outputs; fidelity's mean KLD, top-1 agreement and PPL on each machine, how often the
build's top-1 token is the same on both, and |ΔNLL|. Two runs compare only where their settings and data hashes are
equal (the same items, prompts and exemplars); where they are not, the task says why and is not judged.

Tolerance. The GPU computes in bfloat16 (8 significant bits), the CPU in float32, and rounding alone moves a 135M
model's log-likelihoods, the more so where a format quantizes activations or the KV cache: a rounding-sized change of
an activation moves its FP8/INT8/FP4 code by a whole step. ``yardstick`` measures it on the CPU: every format evaluated
again with bfloat16 compute (``runtime.compute_dtype``), committed in ``cpu-accuracy-smollm2/bf16-compute/``. On
2026-12-05 bfloat16 alone changed 0 of 20 MMLU letters for BF16, INT4-AWQ; 1 for INT8-WO; 2 for FP8 + FP8 KV and
W4A8; 4 for FP8; 6 for INT8-SQ; 10 for NVFP4 (max |ΔLL| 0.04 for BF16, 0.37 FP8, 0.84 INT8-SQ, 1.18 NVFP4; the
top-1 token the same on 99.6% of fidelity's tokens for BF16, 90% FP8, 73% NVFP4). So a format's GPU run is within
tolerance when each difference from the CPU's float32 run is at most twice what bfloat16 made of it on the CPU
(three times for the largest |ΔLL|, the tail of 80 letters; ``FACTORS``; a floor where that was ~0, ``FLOORS``):
MMLU's max and mean |ΔLL|, fidelity's PPL (relative), mean KLD (floor: its standard error) and the share of tokens
whose top-1 differs. The GPU's fused kernels round in other orders than the CPU's bfloat16 matmuls: another draw of
the same noise, hence the factor. A wrong cache, position or scale moves these by far more (whole nats, most tokens),
and a format where rounding flips letters flips about as many on the GPU. Without a yardstick (or for a format it
lacks), the fixed ``DEFAULT_TOLERANCE``. Each flipped MMLU item's margins are listed: a flip at a CPU margin within
the rounding's |ΔLL| is a near tie. GSM8K is not judged: a greedy output parts at the first near-tied token and is
another text from there; the same answers are counted, the outputs' common prefix shown.

Exit code: 0 every format on both sides and within tolerance, 1 a format out of tolerance or missing on one side,
2 bad input (a missing dir, a damaged file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError, PipelineError
from trtllm_pipeline.tasks import fidelity

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("bf16", "fp8", "fp8-fp8kv", "int4-awq", "w4a8-awq", "int8-sq", "int8-wo", "nvfp4")
TASKS = ("mmlu", "gsm8k", "fidelity")
SCHEMA = "trtllm-pipeline/accuracy-extract/1"
# Judged quantities: MMLU's max and mean |ΔLL| of the letters (nats), fidelity's relative PPL change, absolute mean KLD
# change, and the share of tokens whose top-1 token differs between the machines.
# x what bfloat16 compute alone changes on the CPU (the yardstick): twice for a mean or a rate over many items or tokens
# (a second draw of the same rounding noise), three times for the largest |ΔLL| (the tail of 80 letters)
FACTORS = {"max_dll": 3.0, "mean_dll": 2.0, "ppl_rel": 2.0, "kld_abs": 2.0, "top1_miss": 2.0}
# where the yardstick measured ~0 (by chance: FP8 + FP8 KV's PPL moved 0.1%, FP8's 1.5%); mean KLD's floor is also
# the CPU's standard error of it
FLOORS = {"max_dll": 0.05, "mean_dll": 0.01, "ppl_rel": 0.01, "kld_abs": 0.002, "top1_miss": 0.01}
DEFAULT_TOLERANCE = {"max_dll": 0.25, "mean_dll": 0.05, "ppl_rel": 0.02, "kld_abs": 0.01, "top1_miss": 0.05}


# --------------------------------------------------------------------------- extract


def extract_format(engines_dir: Path, model: str, fmt: str, results_dir: Path | None = None) -> dict[str, Any] | None:
    """What the comparison reads of one format's run (``results_dir/<task>.json``, default the build's
    ``eval/``); None where any task's results are missing."""
    name = f"{model}-{fmt}-tp1"
    paths = artifacts.artifact_paths(engines_dir, name)
    results = {}
    for task in TASKS:
        path = results_dir / f"{task}.json" if results_dir else paths.eval_results(task)
        try:
            results[task] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a results file ({exc}).",
                             fix="evaluate the build again (tools/accuracy_table.py)") from None
    manifest = artifacts.read_manifest(paths.engine) or {}
    info = results["mmlu"].get("runtime_info") or {}
    return {
        "schema": SCHEMA, "format": fmt, "config": name,
        "device": info.get("device"), "dtype": info.get("dtype"), "linear": info.get("linear"),
        "engine": results["mmlu"].get("engine"),
        "checkpoint_sha256": (manifest.get("checkpoint") or {}).get("content_sha256"),
        "versions": results["mmlu"].get("versions"),
        "mmlu": {**_head(results["mmlu"]), "items": [
            {k: r.get(k) for k in ("id", "target", "prediction", "logprobs", "prompt_sha256", "error")}
            for r in results["mmlu"]["items"]]},
        "gsm8k": {**_head(results["gsm8k"]), "items": [
            {k: r.get(k) for k in ("id", "target", "prediction", "prediction_flexible", "output", "output_tokens",
                                   "prompt_sha256", "error")} for r in results["gsm8k"]["items"]]},
        "fidelity": {**_head(results["fidelity"]), "reference": (results["fidelity"].get("reference") or {}).get("config"),
                     "summary": fidelity.summarize(results["fidelity"]["items"]),
                     "chunks": _chunks(results["fidelity"]["items"])},
    }


def _head(results: dict) -> dict:
    return {"settings": results["settings"], "n": results["n"], "score": results["score"]}


def _chunks(records: list[dict]) -> dict[str, dict[str, list]]:
    """Per chunk, in position order: the real token, the build's top-1 token, its NLL of the real one."""
    out: dict[str, dict[str, list]] = {}
    for r in records:
        chunk, position = r["id"].rsplit("/", 1)
        c = out.setdefault(chunk, {"first": int(position), "token": [], "top1": [], "nll": []})
        c["token"].append(r["token"])
        c["top1"].append(r["prediction"])
        c["nll"].append(round(r["nll"], 5))
    return out


def write_record(out: Path, record: dict) -> None:
    with artifacts.atomic_file(out / f"{record['format']}.json") as tmp:  # compact: ~25 kB a format, committed
        tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")


def extract(engines_dir: Path, model: str, formats: tuple[str, ...], out: Path) -> list[str]:
    """One ``<format>.json`` per format evaluated in ``engines_dir``; returns the formats written."""
    written = []
    for fmt in formats:
        record = extract_format(engines_dir, model, fmt)
        if record is None:
            print(f"{fmt}: no complete results in {engines_dir} (not produced there)", file=sys.stderr)
            continue
        write_record(out, record)
        written.append(fmt)
    return written


def yardstick(engines_dir: Path, model: str, formats: tuple[str, ...], data_dir: Path, limits: dict[str, int],
              out: Path, compute_dtype: str = "bfloat16") -> list[str]:
    """Every format's built engine evaluated again on this machine with bfloat16 compute, extracted to ``out``: what
    rounding alone changes against the float32 runs. The engines and their results are left as they are (results
    go to a temporary folder); fidelity is against BF16 with bfloat16 compute too. ``compute_dtype="float32"`` on a
    GPU instead: the GPU's float32 against the CPU's, where only summation order differs (a wrong kernel shows
    there, not hidden by bfloat16's rounding)."""
    import tempfile

    import yaml

    from trtllm_pipeline.config import load_config
    from trtllm_pipeline.eval import evaluate

    formats = ("bf16", *(f for f in formats if f != "bf16"))
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        configs = REPO / "build_configs"
        base_cfg = load_config(configs / f"{model}-bf16-tp1.yaml").with_runtime(compute_dtype=compute_dtype)
        reference = Path(tmp) / f"{base_cfg.name}.yaml"  # a file: eval opens the reference from its config file
        reference.write_text(yaml.safe_dump(base_cfg.to_dict()), encoding="utf-8")
        for fmt in formats:
            cfg = load_config(configs / f"{model}-{fmt}-tp1.yaml").with_runtime(compute_dtype=compute_dtype)
            results = Path(tmp) / fmt
            for task, limit in limits.items():
                evaluate(cfg, engines_dir=engines_dir, tasks=[task], limit=limit, data_dir=data_dir,
                         output=results / f"{task}.json",
                         reference=reference if task == "fidelity" and fmt != "bf16" else None)
            write_record(out, extract_format(engines_dir, model, fmt, results))
            written.append(fmt)
            print(f"{fmt}: evaluated with {compute_dtype} compute", flush=True)
    return written


# --------------------------------------------------------------------------- compare


def load_dir(directory: Path) -> dict[str, dict]:
    if not directory.is_dir():
        raise InputError(f"{directory}: no such directory.", fix="pass a directory `extract` wrote")
    runs = {}
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not JSON ({exc}).", fix="extract it again") from None
        if isinstance(record, dict) and record.get("schema") == SCHEMA:
            runs[record["format"]] = record
    if not runs:
        raise InputError(f"{directory}: no extracted runs (<format>.json from `extract`).",
                         fix="run `benchmarks/accuracy_compare.py extract` first")
    return runs


def _not_comparable(cpu: dict, gpu: dict) -> str | None:
    """Why two runs of one task do not compare (other settings or data), or None."""
    keys = sorted(k for k in set(cpu["settings"]) | set(gpu["settings"])
                  if cpu["settings"].get(k) != gpu["settings"].get(k))
    if keys:
        return f"settings differ: {', '.join(keys)}"
    if [i["id"] for i in cpu.get("items", [])] != [i["id"] for i in gpu.get("items", [])]:
        return "other items"
    return None


def _margin(logprobs: list[float], letter: int) -> float:
    """How far ``letter`` (the prediction) leads the runner-up, in nats."""
    return logprobs[letter] - max(lp for i, lp in enumerate(logprobs) if i != letter)


def compare_mmlu(cpu: dict, gpu: dict) -> dict:
    why = _not_comparable(cpu, gpu)
    if why:
        return {"comparable": False, "why": why}
    letters = "ABCD"
    same, differ, shifts, prompts, unscored = 0, [], [], [], []
    for a, b in zip(cpu["items"], gpu["items"]):
        if a["prompt_sha256"] != b["prompt_sha256"]:
            prompts.append(a["id"])
        if a["logprobs"] is None or b["logprobs"] is None:  # a prompt too long on one side: counted as differing
            unscored.append(a["id"])
            differ.append({"id": a["id"], "cpu": a["prediction"], "gpu": b["prediction"],
                           "error": a.get("error") or b.get("error")})
            continue
        shifts += [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])]
        if a["prediction"] == b["prediction"]:
            same += 1
            continue
        differ.append({"id": a["id"], "target": a["target"], "cpu": a["prediction"], "gpu": b["prediction"],
                       "cpu_margin": round(_margin(a["logprobs"], letters.index(a["prediction"])), 4),
                       "gpu_margin": round(_margin(b["logprobs"], letters.index(b["prediction"])), 4),
                       "max_dll": round(max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])), 4)})
    return {"comparable": True, "n": len(cpu["items"]), "same": same, "differ": differ,
            "max_dll": round(max(shifts, default=0.0), 5),
            "mean_dll": round(sum(shifts) / len(shifts), 5) if shifts else 0.0,
            "score": {"cpu": cpu["score"], "gpu": gpu["score"]}, "prompts_differ": prompts, "unscored": unscored}


def compare_gsm8k(cpu: dict, gpu: dict) -> dict:
    why = _not_comparable(cpu, gpu)
    if why:
        return {"comparable": False, "why": why}
    same_answer = same_output = 0
    differ = []
    for a, b in zip(cpu["items"], gpu["items"]):
        same_answer += a["prediction"] == b["prediction"]
        if a["output"] == b["output"]:
            same_output += 1
            continue
        x, y = a["output"] or "", b["output"] or ""
        common = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        differ.append({"id": a["id"], "cpu": a["prediction"], "gpu": b["prediction"], "target": a["target"],
                       "common_prefix_chars": common, "chars": {"cpu": len(x), "gpu": len(y)},
                       "parted_at": {"cpu": x[common:common + 40], "gpu": y[common:common + 40]}})
    return {"comparable": True, "n": len(cpu["items"]), "same_answers": same_answer, "same_outputs": same_output,
            "differ": differ, "score": {"cpu": cpu["score"], "gpu": gpu["score"]}}


def compare_fidelity(cpu: dict, gpu: dict) -> dict:
    why = _not_comparable(cpu, gpu)
    if not why and cpu.get("reference") != gpu.get("reference"):
        why = f"other references: {cpu.get('reference')} and {gpu.get('reference')}"
    if not why and any(cpu["chunks"][c]["token"] != gpu["chunks"].get(c, {}).get("token") for c in cpu["chunks"]):
        why = "other text (token ids differ)"
    if why:
        return {"comparable": False, "why": why}
    keys = ("kld_mean", "kld_p99", "top1", "ppl", "ppl_ratio")
    stats = {k: {"cpu": round(cpu["summary"][k], 5), "gpu": round(gpu["summary"][k], 5)} for k in keys}
    same_top1 = total = 0
    dnll = []
    for chunk, a in cpu["chunks"].items():
        b = gpu["chunks"][chunk]
        same_top1 += sum(x == y for x, y in zip(a["top1"], b["top1"]))
        total += len(a["top1"])
        dnll += [abs(x - y) for x, y in zip(a["nll"], b["nll"])]
    return {"comparable": True, "tokens": total, "stats": stats,
            "top1_miss": round(1 - same_top1 / total, 5) if total else 0.0,
            "ppl_rel": round(abs(stats["ppl"]["gpu"] - stats["ppl"]["cpu"]) / stats["ppl"]["cpu"], 5),
            "kld_abs": round(abs(stats["kld_mean"]["gpu"] - stats["kld_mean"]["cpu"]), 5),
            "max_dnll": round(max(dnll, default=0.0), 5),
            "mean_dnll": round(sum(dnll) / len(dnll), 5) if dnll else 0.0}


def measure(cpu: dict, gpu: dict) -> dict:
    """What differs between two runs of one format (no verdict)."""
    return {
        "devices": {"cpu": f"{cpu['device']} ({cpu['dtype']})", "gpu": f"{gpu['device']} ({gpu['dtype']})"},
        "same_checkpoint": cpu["checkpoint_sha256"] is not None and cpu["checkpoint_sha256"] == gpu["checkpoint_sha256"],
        "mmlu": compare_mmlu(cpu["mmlu"], gpu["mmlu"]),
        "gsm8k": compare_gsm8k(cpu["gsm8k"], gpu["gsm8k"]),
        "fidelity": compare_fidelity(cpu["fidelity"], gpu["fidelity"]),
    }


def tolerance(cpu: dict, rounding: dict | None) -> tuple[dict[str, float], str]:
    """(tolerance, how it was set): ``FACTORS`` x what bfloat16 compute alone changed on the CPU (``rounding``: the
    yardstick's ``measure``), each at least its floor (mean KLD's: the CPU's standard error of it); the fixed
    ``DEFAULT_TOLERANCE`` without one."""
    if rounding is None or not (rounding["mmlu"]["comparable"] and rounding["fidelity"]["comparable"]):
        return dict(DEFAULT_TOLERANCE), "fixed"
    m, f = rounding["mmlu"], rounding["fidelity"]
    seen = {"max_dll": m["max_dll"], "mean_dll": m["mean_dll"], "ppl_rel": f["ppl_rel"],
            "kld_abs": max(f["kld_abs"], cpu["fidelity"]["summary"]["kld_mean_error"]), "top1_miss": f["top1_miss"]}
    return {k: round(FACTORS[k] * max(v, FLOORS[k]), 5) for k, v in seen.items()}, "the CPU's bfloat16 rounding"


def judge(measured: dict, tol: dict[str, float]) -> list[str]:
    """Why ``measured`` is out of tolerance (empty: within)."""
    problems = []
    m, f, g = measured["mmlu"], measured["fidelity"], measured["gsm8k"]
    if not m["comparable"]:
        problems.append(f"mmlu not comparable: {m['why']}")
    else:
        problems += [f"mmlu: max |ΔLL| {m['max_dll']:.3f} > {tol['max_dll']:.3f}"] if m["max_dll"] > tol["max_dll"] else []
        problems += [f"mmlu: mean |ΔLL| {m['mean_dll']:.3f} > {tol['mean_dll']:.3f}"] if m["mean_dll"] > tol["mean_dll"] else []
        problems += [f"mmlu: {len(m['prompts_differ'])} prompts differ"] if m["prompts_differ"] else []
        problems += [f"mmlu: {i} unscored on one side" for i in m["unscored"]]
    if not f["comparable"]:
        problems.append(f"fidelity not comparable: {f['why']}")
    else:
        s = f["stats"]
        if f["ppl_rel"] > tol["ppl_rel"]:
            problems.append(f"fidelity: PPL {s['ppl']['cpu']:.3f} -> {s['ppl']['gpu']:.3f} (> {100 * tol['ppl_rel']:.1f}%)")
        if f["kld_abs"] > tol["kld_abs"]:
            problems.append(f"fidelity: mean KLD {s['kld_mean']['cpu']:.4f} -> {s['kld_mean']['gpu']:.4f} "
                            f"(> ±{tol['kld_abs']:.4f})")
        if f["top1_miss"] > tol["top1_miss"]:
            problems.append(f"fidelity: top-1 token differs on {100 * f['top1_miss']:.1f}% of tokens "
                            f"(> {100 * tol['top1_miss']:.1f}%)")
    if not g["comparable"]:
        problems.append(f"gsm8k not comparable: {g['why']}")
    return problems


def compare_format(cpu: dict, gpu: dict, rounding: dict | None = None) -> dict:
    """``measure`` of the two runs, the tolerance (from ``rounding``, the CPU's bfloat16 run, where given) and the
    verdict."""
    out = measure(cpu, gpu)
    tol, basis = tolerance(cpu, rounding)
    out["tolerance"], out["tolerance_basis"] = tol, basis
    if rounding is not None:
        out["cpu_bfloat16"] = {"mmlu_same": rounding["mmlu"].get("same"), "max_dll": rounding["mmlu"].get("max_dll"),
                               "mean_dll": rounding["mmlu"].get("mean_dll"),
                               "top1_miss": rounding["fidelity"].get("top1_miss"),
                               "ppl_rel": rounding["fidelity"].get("ppl_rel")}
    out["problems"] = judge(out, tol)
    out["within"] = not out["problems"]
    return out


def compare(cpu_dir: Path, gpu_dir: Path, formats: tuple[str, ...] | None = None,
            yardstick_dir: Path | None = None, yardstick_base: Path | None = None) -> dict:
    """Every format of ``formats`` (default: those of either dir), a format on one side only a failure;
    ``yardstick_dir``: the CPU's bfloat16 runs (``yardstick``), which set each format's tolerance, measured against
    ``yardstick_base`` (the CPU's float32 runs they were made from; default ``cpu_dir``). A base of its own lets the
    first side be another machine's float32 runs: the GPU's own, whose checkpoints are the GPU's bfloat16 runs' bytes
    (a calibration on CUDA reduces in another order than the CPU's), so that the comparison is of the runtime alone."""
    cpu, gpu = load_dir(cpu_dir), load_dir(gpu_dir)
    rounding_runs = load_dir(yardstick_dir) if yardstick_dir else {}
    base = load_dir(yardstick_base) if yardstick_base else cpu
    if formats is None:
        formats = tuple(f for f in FORMATS if f in cpu or f in gpu) + tuple(sorted((set(cpu) | set(gpu)) - set(FORMATS)))
    result: dict[str, Any] = {"cpu": str(cpu_dir), "gpu": str(gpu_dir), "yardstick": str(yardstick_dir or ""),
                              "factors": FACTORS, "floors": FLOORS, "formats": {}}
    for fmt in formats:
        if fmt not in cpu or fmt not in gpu:
            missing = "cpu" if fmt not in cpu else "gpu"
            result["formats"][fmt] = {"within": False, "problems": [f"no {missing} run"], "missing": missing}
            continue
        rounding = measure(base[fmt], rounding_runs[fmt]) if fmt in rounding_runs and fmt in base else None
        result["formats"][fmt] = compare_format(cpu[fmt], gpu[fmt], rounding)
    result["within"] = all(r["within"] for r in result["formats"].values())
    return result


# --------------------------------------------------------------------------- table


def table(result: dict) -> str:
    header = ["format", "same ckpt", "MMLU same (CPU bf16)", "MMLU differing: CPU→GPU (CPU/GPU margin, nats)",
              "max / mean |ΔLL| (tolerance)", "GSM8K same answers / outputs", "mean KLD CPU → GPU", "top-1 % CPU → GPU",
              "PPL CPU → GPU", "top-1 token differs (CPU bf16)", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for fmt, r in result["formats"].items():
        if "missing" in r:
            lines.append(f"| {fmt} | " + " | ".join(["—"] * (len(header) - 2)) + f" | no {r['missing']} run |")
            continue
        m, g, f, tol = r["mmlu"], r["gsm8k"], r["fidelity"], r["tolerance"]
        yard = r.get("cpu_bfloat16") or {}
        cells = [fmt, "yes" if r["same_checkpoint"] else "no"]
        if m["comparable"]:
            flips = ", ".join(f"{d['id']} {d['cpu']}→{d['gpu']} ({d.get('cpu_margin', '—')}/{d.get('gpu_margin', '—')})"
                              for d in m["differ"]) or "none"
            same = f"{m['same']}/{m['n']}" + (f" ({yard['mmlu_same']}/{m['n']})" if yard.get("mmlu_same") is not None else "")
            cells += [same, flips, f"{m['max_dll']:.3f} / {m['mean_dll']:.3f} ({tol['max_dll']:.2f} / {tol['mean_dll']:.2f})"]
        else:
            cells += ["—", f"not comparable: {m['why']}", "—"]
        cells.append(f"{g['same_answers']}/{g['n']} / {g['same_outputs']}/{g['n']}" if g["comparable"]
                     else f"not comparable: {g['why']}")
        if f["comparable"]:
            s = f["stats"]
            miss = f"{100 * f['top1_miss']:.1f}%" + (f" ({100 * yard['top1_miss']:.1f}%)" if yard.get("top1_miss") is not None else "")
            cells += [f"{s['kld_mean']['cpu']:.4f} → {s['kld_mean']['gpu']:.4f}",
                      f"{100 * s['top1']['cpu']:.1f} → {100 * s['top1']['gpu']:.1f}",
                      f"{s['ppl']['cpu']:.2f} → {s['ppl']['gpu']:.2f}", miss]
        else:
            cells += [f"not comparable: {f['why']}", "—", "—", "—"]
        cells.append("within tolerance" if r["within"] else "; ".join(r["problems"]))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    basis = ("twice (means, rates; three times the largest |ΔLL|) what bfloat16 compute alone changed on the CPU "
             f"({result['yardstick']}), each at least its floor" if result["yardstick"] else f"fixed: {DEFAULT_TOLERANCE}")
    lines += ["", (f"Tolerance per format: {basis}; judged: MMLU's max and mean |ΔLL|, fidelity's PPL, mean KLD and "
                   "the share of tokens whose top-1 differs. GSM8K is not judged (a greedy text parts at a near tie). "
                   "A flipped item's CPU margin below the rounding's |ΔLL| is a near tie.")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="per format, what the comparison reads of a run")
    ex.add_argument("--engines-dir", type=Path, required=True)
    ex.add_argument("--model", default="smollm2-135m-instruct")
    ex.add_argument("--formats", default=" ".join(FORMATS))
    ex.add_argument("-o", "--out", type=Path, required=True)
    ys = sub.add_parser("yardstick", help="every format evaluated again with bfloat16 compute, extracted")
    ys.add_argument("--engines-dir", type=Path, required=True, help="where the float32 runs' builds are")
    ys.add_argument("--data-dir", type=Path, required=True)
    ys.add_argument("--model", default="smollm2-135m-instruct")
    ys.add_argument("--formats", default=" ".join(FORMATS))
    ys.add_argument("--limits", default="mmlu=20,gsm8k=4,fidelity=4", help="as the float32 runs' (accuracy_table's)")
    ys.add_argument("--compute-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="float32 on a GPU: its float32 against the CPU's (summation order only)")
    ys.add_argument("-o", "--out", type=Path, required=True)
    cmp_ = sub.add_parser("compare", help="two extracted runs, item by item")
    cmp_.add_argument("cpu", type=Path)
    cmp_.add_argument("gpu", type=Path)
    cmp_.add_argument("-o", "--out", type=Path, help="the comparison as JSON")
    cmp_.add_argument("--formats", help="these formats only (default: every format of either dir)")
    cmp_.add_argument("--yardstick", type=Path, help="the CPU's bfloat16 runs (`yardstick`): each format's tolerance")
    cmp_.add_argument("--yardstick-base", type=Path,
                      help="the float32 runs the yardstick's were made from (default: the first dir; give it where "
                      "the first dir is another machine's float32 runs)")
    args = parser.parse_args(argv)
    try:
        if args.command == "extract":
            written = extract(args.engines_dir, args.model, tuple(args.formats.split()), args.out)
            print(f"{args.out}: {', '.join(written) or 'nothing'}")
            return 0 if written else 1
        if args.command == "yardstick":
            limits = {k: int(v) for k, v in (pair.split("=") for pair in args.limits.split(","))}
            written = yardstick(args.engines_dir, args.model, tuple(args.formats.split()), args.data_dir, limits,
                                args.out, args.compute_dtype)
            print(f"{args.out}: {', '.join(written)}")
            return 0
        result = compare(args.cpu, args.gpu, tuple(args.formats.split()) if args.formats else None, args.yardstick,
                         args.yardstick_base)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.out:
        artifacts.write_json_atomic(args.out, result)
    print(table(result))
    return 0 if result["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
