"""Stage ``eval``: the accuracy of a build on the registered tasks (MMLU, GSM8K), run with its runtime.

Results go to ``engines/<config>/eval/<task>.json`` (or ``-o``), one JSON file per task, written
atomically: the task, config, runtime and model, the settings that make two runs comparable,
``n``, ``score`` with its 95% interval, sub-scores, ``complete``, and one record per item (stable
``id``, ``correct``, ``prediction``, ``target``, prompt hash) for the paired ``gate``. Each file
carries the hash of its inputs (engine, task settings, selected data, eval code revision): a run
whose inputs are unchanged is a cache hit and evaluates nothing.

A task that compares the build with a reference build (``fidelity``) gets the reference's runtime
as well, opened in this process from ``--reference CONFIG`` or ``evaluation.fidelity_reference``;
its results name the reference and the hash of the reference's engine (``reference``), and every
results file names its own engine's (``engine``), so that ``gate`` can tell a stale comparison.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from trtllm_pipeline import artifacts, machine
from trtllm_pipeline.config import BuildConfig, load_config
from trtllm_pipeline.endpoints import resolve_url
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.results import EVAL_SCHEMA
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.served_model import ServedModel
from trtllm_pipeline.tasks.base import Item, Task, TaskData
from trtllm_pipeline.tasks.model import LanguageModel
from trtllm_pipeline.tasks.registry import get_task, task_names
from trtllm_pipeline.tasks.stats import wilson_interval
from trtllm_pipeline.tasks.subset import stratified_subset
from trtllm_pipeline.tokenizer import Tokenizer

log = logging.getLogger(__name__)

EVAL_REVISION = 2  # bump when prompts, extraction or scoring change, so cached results are redone


@dataclasses.dataclass
class EvalResult:
    task: str
    path: Path
    results: dict[str, Any]
    cache_hit: bool

    def summary(self) -> str:
        res = self.results
        lo, hi = res["ci95"]
        state = "cache hit" if self.cache_hit else f"{res['timings']['items_per_s']:.2f} items/s"
        complete = "" if res["complete"] else f", INCOMPLETE ({res['n']} of {res['n_selected']} scored)"
        task = get_task(self.task)
        shown = (task.cell(res, False) if task.cell else
                 f"{100 * res['score']:.2f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f})")
        return (f"{self.task}: {shown} on {res['n']} {task.unit}, {res['runtime']} runtime{complete} [{state}] "
                f"-> {self.path}")


def evaluate(cfg: BuildConfig, *, engines_dir: str | Path = "engines", tasks: list[str] | None = None,
             limit: int | None = None, data_dir: str | Path | None = None, output: str | Path | None = None,
             force: bool = False, url: str | None = None, protocol: str = "grpc",
             reference: str | Path | None = None) -> list[EvalResult]:
    """Evaluate the built engine of ``cfg`` on ``tasks`` (default: the config's evaluation.tasks).

    ``reference``: the config file of the build that reference tasks (fidelity) compare with
    (default: ``evaluation.fidelity_reference``).

    With ``url`` (HOST:PORT, or ``default`` for where ``serve`` runs ``cfg``) the deployed model
    answers instead; its results go to ``eval/served/<task>.json`` and are never a cache hit (what
    a server runs cannot be known from here).
    """
    names = task_names(tasks or cfg.evaluation.tasks)
    limit = limit if limit is not None else cfg.evaluation.limit
    paths = artifacts.artifact_paths(engines_dir, cfg.name)
    artifacts.remove_stale_in(paths.root)
    identity = {"served": url} if url else artifacts.engine_manifest(engines_dir, cfg)["inputs_hash"]
    default_dir = paths.eval / "served" if url else paths.eval
    outputs = {name: output_path(default_dir, name, output, several=len(names) > 1) for name in names}
    ref_cfg = reference_config(cfg, reference) if any(get_task(n).reference for n in names) else None
    runtime = ref_runtime = None
    done = []
    try:
        for name, path in outputs.items():
            task = get_task(name)
            settings = task.settings(cfg.evaluation, limit)
            task_data = task.load(Path(data_dir) if data_dir else None)
            items = stratified_subset(task_data.items, limit, settings["seed"])
            settings["data_sha256"] = data_fingerprint(items, task_data)
            inputs = {"engine": identity, "task": name, "settings": settings,
                      "runtime": None if url else runtime_identity(cfg), "revision": EVAL_REVISION}
            ref_identity = None
            if task.reference and ref_cfg is not None:
                ref_identity = {"config": ref_cfg.name,
                                "engine": artifacts.engine_manifest(engines_dir, ref_cfg)["inputs_hash"],
                                "runtime": runtime_identity(ref_cfg)}
            if task.reference:
                inputs["reference"] = ref_identity
            inputs_hash = artifacts.fingerprint(inputs)
            cached = None if force or url else cached_results(path, inputs_hash)
            if cached is not None:
                log.info("eval %s: cache hit for %s (engine, data and settings unchanged); %s", name, cfg.name, path)
                done.append(EvalResult(name, path, cached, cache_hit=True))
                continue
            if runtime is None:
                runtime = open_model(cfg, engines_dir, url, protocol)
            extra = {}
            if task.reference:
                if ref_identity is not None and ref_runtime is None:
                    ref_runtime = load_runtime(ref_cfg, engines_dir)
                extra["reference"] = ref_runtime
                if not url:  # the reference's log-probabilities are reused within the process under its identity
                    extra["reference_key"] = artifacts.fingerprint(ref_identity or {
                        "config": cfg.name, "engine": identity, "runtime": runtime_identity(cfg)})
            results = _run(cfg, task, runtime, items, task_data, settings, inputs_hash, **extra)
            results["engine"] = identity
            if task.reference:
                results["reference"] = ref_identity
            artifacts.write_json_atomic(path, results)
            done.append(EvalResult(name, path, results, cache_hit=False))
    finally:
        for opened in (runtime, ref_runtime):
            if opened is not None:
                opened.close()
    return done


def reference_config(cfg: BuildConfig, reference: str | Path | None) -> BuildConfig | None:
    """The build reference tasks compare ``cfg`` with: ``reference`` (a config file), else
    ``evaluation.fidelity_reference`` (a config name beside ``cfg``'s file, or a file); None when
    there is none, or it is ``cfg`` itself (the build is its own reference)."""
    if reference is None:
        name = cfg.evaluation.fidelity_reference
        if name is None:
            return None
        here = cfg.path.parent if cfg.path else Path("build_configs")
        reference = Path(name) if "/" in name or name.endswith((".yaml", ".yml")) else here / f"{name}.yaml"
    ref = load_config(reference)
    return None if ref.name == cfg.name else ref


def open_model(cfg: BuildConfig, engines_dir: str | Path, url: str | None, protocol: str) -> LanguageModel:
    """The built engine in-process, or the model served at ``url`` (with the build's tokenizer)."""
    if url is None:
        return load_runtime(cfg, engines_dir)
    tokenizer_dir = artifacts.artifact_paths(engines_dir, cfg.name).tokenizer
    if not tokenizer_dir.is_dir():
        raise InputError(f"{tokenizer_dir} does not exist; --url needs the build's tokenizer to write the prompts.",
                         fix=f"run `trtllm-pipeline quantize -c {cfg.file_arg}`, or point --engines-dir at it")
    return ServedModel(resolve_url(url, protocol, cfg, engines_dir), protocol,
                       Tokenizer(tokenizer_dir), max_input_len=cfg.build.max_input_len,
                       max_seq_len=cfg.build.max_seq_len, concurrency=cfg.serving.max_batch_size)


def output_path(default_dir: Path, task: str, output: str | Path | None, *, several: bool) -> Path:
    """``<default_dir>/<task>.json``; ``-o FILE`` for one task; ``-o DIR`` holds ``<task>.json``."""
    if output is None:
        return default_dir / f"{task}.json"
    output = Path(output)
    if output.suffix == ".json":
        if several:
            raise InputError(f"-o {output}: one file cannot hold the results of several tasks.",
                             fix="give a directory (-o DIR writes DIR/<task>.json) or one task (--tasks mmlu)")
        return output
    return output / f"{task}.json"


def runtime_identity(cfg: BuildConfig) -> dict[str, Any]:
    """The runtime settings that change what an in-process run computes (its numerics), as configured:
    the same engine evaluated in float32 or bfloat16, on another device, merged or distributed (a
    row-parallel sum rounds unlike the whole GEMM), or with the fused CUDA kernels (or the batch-invariant ones) is
    another result."""
    identity = {key: getattr(cfg.runtime, key) for key in ("device", "compute_dtype", "tp_mode", "fast_decode")}
    if identity["device"] == "auto" and machine.cuda_available():
        # "auto" runs on the GPU here (and computes in bfloat16 there): not the CPU's result of the same config, which
        # keeps its key (a CPU machine's cached results stay valid)
        identity["resolved_device"] = "cuda"
    if cfg.runtime.batch_invariant:  # (other kernels; a key only when on: results cached without it keep theirs)
        identity["batch_invariant"] = True
    return identity


def cached_results(path: Path, inputs_hash: str) -> dict[str, Any] | None:
    """The results in ``path`` if they were made from exactly these inputs (runs are deterministic:
    greedy decoding, fixed items; an interrupted run never leaves a file, it is written at the end)."""
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(results, dict) and results.get("inputs_hash") == inputs_hash:
        return results
    return None


def data_fingerprint(items: list[Item], task_data: TaskData) -> str:
    """Hash of the selected items and the few-shot pools: same data whether from the hub or files."""
    return artifacts.fingerprint({"items": [(it.id, it.doc) for it in items], "fewshot": task_data.fewshot})


def input_limit(cfg: BuildConfig, runtime: LanguageModel) -> int:
    """Longest token sequence the engine takes as input (scoring feeds context + continuation):
    the build's max_input_len, or less where the runtime says so."""
    own = getattr(runtime, "max_input_len", None) or runtime.max_seq_len - 1
    return min(cfg.build.max_input_len, own)


def _run(cfg: BuildConfig, task: Task, runtime: LanguageModel, items: list[Item], task_data: TaskData,
         settings: dict, inputs_hash: str, **extra: Any) -> dict[str, Any]:
    from tqdm import tqdm

    name = task.name
    described = runtime.describe()
    log.info("eval %s: %d items of %s with the %s runtime (%s)", name, len(items), task_data.source,
             described["runtime"], described.get("device") or described.get("url", ""))
    start = time.perf_counter()
    with tqdm(total=len(items), desc=f"{name} {cfg.name}", unit="item", disable=None, dynamic_ncols=True) as bar:
        records = task.run(runtime, items, task_data, settings, batch_size=cfg.evaluation.batch_size,
                           input_limit=input_limit(cfg, runtime), progress=bar, **extra)
    wall = time.perf_counter() - start
    scored = [r["correct"] for r in records if r.get("correct") is not None]
    n, k, selected = len(scored), sum(scored), len(items) * task.records_per_item
    results = {
        "schema": EVAL_SCHEMA,
        "task": name,
        "config": cfg.name,
        "runtime": described["runtime"],
        "tp_mode": described.get("tp_mode"),  # merged | distributed (torch runtime), as it ran
        "world_size": described.get("world_size", 1),  # processes that ran it
        "runtime_info": described,
        "model": cfg.model.source,
        "model_revision": cfg.model.revision,
        "quantization": {"format": cfg.quantization.format, "kv_cache": cfg.quantization.kv_cache,
                         "dtype": cfg.dtype, "tp": cfg.parallelism.tp},
        "settings": settings,
        "data_source": task_data.source,
        "n": n,
        "n_selected": selected,
        "score": k / n if n else math.nan,
        "ci95": list(wilson_interval(k, n)),
        "subscores": task.subscores(records),
        "complete": n == selected and n > 0,
        "inputs_hash": inputs_hash,
        "created_at": artifacts.now_iso(),
        "timings": {"wall_s": round(wall, 3), "items_per_s": round(len(items) / wall, 3) if wall > 0 else None},
        "versions": artifacts.package_versions("torch", "transformers", "datasets", "tensorrt_llm"),
        "items": records,
    }
    if not results["complete"]:
        log.warning("eval %s: %d of %d items could not be scored (see their `error`); results are incomplete",
                    name, selected - n, selected)
    return results
