"""``bench --in-process --speculative METHOD``: plain decoding against speculative decoding, same runtime, same prompts.

For each workload and batch: greedy requests of at most ``output_tokens`` tokens, ending at the model's end id as a
served request does (``ignore_eos``: never, every request ``output_tokens`` long, a reply's end followed by whatever
the model writes after it: SmolLM2 opens a new conversation there, which copies nothing), first with speculation off
(the loaded runtime's speculator disabled), then on, ``repeats`` times in turn, the fastest run of each kept (one
run of 128 tokens on a small model is ~50-170 ms: a single one carries the order it ran in and the machine's noise).
At batch 1 a run is ``prompts`` prompts one after another, each alone (prompt lookup's gain is the prompt's: on
SmolLM2 one grounded prompt needs 54 steps for 128 tokens, another 128, in benchmarks/spec_simulate.py); at a batch
b above 1 it is b prompts together. Reported over the run: output tokens/s (prefill included, the same in both), the
speedup, and from ``Runtime.stats()`` over the kept speculative run: tokens drafted and accepted, verify rows, the
acceptance length (mean tokens a verify row emitted: 1 + accepted / rows); at batch 1 each prompt's too
(``per_prompt``). The outputs of the two runs are compared token for token (``identical``: greedy speculation must
not change them).

Where they part, the run says why it may (``plain_deterministic``: whether every plain run gave the same outputs; a
speculative run differing from a plain one is only a finding when plain decoding agrees with itself): for each
differing prompt (at batch 1 in its ``per_prompt`` entry, else in ``differences``) the first output position where
the speculative tokens leave the plain ones (``first_difference``), both tokens, and the ``margin`` there: the plain
token's logit minus the speculative token's, from one eager forward of the model over the prompt and the plain output
up to that position (``first_difference``). A verify row is computed by differently shaped kernels than a 1-token
step, so in bf16 a near-tied argmax may flip and the continuation part: a margin within ``NEAR_TIE_ABS`` or
``NEAR_TIE_REL`` of the logit (``near_tie``) is rounding; a large one is a bug. Over a run: ``differing_prompts``
and ``near_tie_differences``.

Workloads: ``grounded``: rewrite / summarise / answer-from-passage prompts (``passages``: text shipped with the
package; in ``grounded_texts`` order, the rewrites first: 18 = every task x passage pair), through the tokenizer's
chat template where it has one: the output copies from the input, where prompt lookup pays; ``random``: prompts of
random token ids (a real model's answer to noise tends to loop, which lookups hit: SmolLM2 2.7x on the H100);
``open``: open-ended requests with nothing to copy (``passages.OPEN_PROMPTS``, through the chat template), where
lookups hit only where the answer repeats itself and adaptive drafting should make speculation cost (nearly) nothing.

Results file (JSON, ``schema`` ``speculative-3``): ``settings``, ``runtime`` (its ``describe()``), ``runs``.
``speculative-3`` (2026-12-07): requests end at the end id unless ``settings.ignore_eos`` (before, always
``output_tokens`` long), and each ``per_prompt`` entry names its ``output_tokens``. ``speculative-2`` (issue 35): a
batch-1 run covers ``settings.prompts`` prompts, its counts and seconds their totals (``speculative-1``: one
prompt); each run names its ``prompts`` and, at batch 1, lists ``per_prompt``. Added under the same schema (no field
changed meaning: ``identical`` is still every run, plain and speculative, alike): ``plain_deterministic``,
``differing_prompts``, ``near_tie_differences``, ``differences`` (batch > 1) and each ``per_prompt`` entry's
``same`` (with ``first_difference``, ``plain_token``, ``spec_token``, ``margin``, ``near_tie`` where it is False).
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Callable

from trtllm_pipeline import artifacts
from trtllm_pipeline.bench.passages import grounded_texts, open_texts
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

SCHEMA = "speculative-3"
WORKLOADS = ("grounded", "random", "open")
TEXTS = {"grounded": grounded_texts, "open": open_texts}  # the workloads of written prompts (chat template)
SPEC_KEYS = ("spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_verify_rows")
# A margin (plain token's logit minus the speculative token's, recomputed eagerly) below either bound is a near tie,
# which rounding alone can flip: bf16 keeps ~3 significant digits, so two kernels' logits of magnitude L may differ by
# ~L/256 (REL: 1% leaves headroom for the error accumulated over the layers); ABS covers logits near zero.
NEAR_TIE_ABS = 0.05
NEAR_TIE_REL = 0.01


@dataclasses.dataclass(frozen=True)
class SpeculativeSettings:
    method: str = "ngram"
    num_draft_tokens: int | None = None  # None: the method's default (config.DEFAULT_DRAFT_TOKENS: ngram 8, else 4)
    draft_checkpoint: str | None = None
    batches: tuple[int, ...] = (1,)
    workloads: tuple[str, ...] = WORKLOADS
    output_tokens: int = 128
    random_tokens: int = 256  # the random workload's prompt length (about a grounded prompt's)
    seed: int = 1234
    repeats: int = 3  # runs of each mode, alternating; the fastest of each is reported
    prompts: int = 18  # batch 1: prompts of each workload run one after another (grounded: 18 = every pair)
    tree_nodes: int | None = None  # ngram: draft token trees of this many nodes (runtime.speculative.tree.max_nodes)
    ignore_eos: bool = False  # every request output_tokens long, past the model's end id (the bench before 2026-12-07)

    def runtime_overrides(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"method": self.method}
        if self.num_draft_tokens is not None:
            spec["num_draft_tokens"] = self.num_draft_tokens
        if self.tree_nodes is not None:
            spec["tree"] = {"max_nodes": self.tree_nodes}
        if self.draft_checkpoint:
            spec["draft_checkpoint"] = self.draft_checkpoint
        return {"speculative": spec}

    def check(self) -> None:
        if bad := [w for w in self.workloads if w not in WORKLOADS]:
            raise InputError(f"unknown workload {bad[0]!r}.", fix=f"use {', '.join(WORKLOADS)}")
        if self.tree_nodes is not None and self.method != "ngram":
            raise InputError(f"--tree-nodes drafts prompt-lookup trees; --speculative is {self.method}.",
                             fix="use --speculative ngram, or drop --tree-nodes")
        if not self.batches or min(self.batches) < 1 or min(self.output_tokens, self.repeats, self.prompts) < 1:
            raise InputError("--batch values, --output-tokens, --prompts and the repeats must be at least 1.")


@dataclasses.dataclass
class SpeculativeResult:
    path: Path
    data: dict[str, Any]

    def table(self) -> list[str]:
        lines = [f"{'workload':>9} {'batch':>5} {'prompts':>7} {'tokens':>6} {'plain tok/s':>11} {'spec tok/s':>10} "
                 f"{'speedup':>7} {'accept len':>10} {'drafted':>8} {'accepted':>8} {'same':>13} {'plain det':>9}"]
        for r in self.data["runs"]:
            lines.append(f"{r['workload']:>9} {r['batch']:>5} {r['prompts']:>7} {r['output_tokens']:>6} "
                         f"{r['plain_tokens_per_s']:>11.1f} {r['spec_tokens_per_s']:>10.1f} {r['speedup']:>6.2f}x "
                         f"{r['acceptance_length']:>10.2f} "
                         f"{r['draft_tokens']:>8} {r['accepted_tokens']:>8} {same_cell(r):>13} "
                         f"{_yes(r.get('plain_deterministic')):>9}")
        rt = self.data["runtime"]
        ends = "past the end id (--ignore-eos)" if self.data["settings"].get("ignore_eos") else "at the end id"
        lines.append(f"runtime {rt.get('runtime')} on {rt.get('device')}; decode: {rt.get('decode_path')}; "
                     f"speculative: {rt.get('speculative')}; requests end {ends}")
        return lines


def run_speculative(cfg: BuildConfig, *, engines_dir: Path, settings: SpeculativeSettings,
                    output: Path | None = None, progress: Callable[[str], None] = print) -> SpeculativeResult:
    settings.check()
    rt = load_runtime(cfg.with_runtime(**settings.runtime_overrides()), engines_dir)
    try:
        speculator = getattr(rt, "speculator", None)
        if speculator is None:
            raise InputError(f"runtime {rt.name} has no speculative decoding.", fix="bench the torch runtime")
        if max(settings.batches) > rt.max_batch_size:
            raise InputError(f"batch {max(settings.batches)} exceeds build.max_batch_size {rt.max_batch_size}.")
        info, k = rt.describe(), speculator.k  # (k: the settings', else the method's default)
        started = artifacts.now_iso()
        _generate(rt, [[1] * 8], 4)  # one-time costs (allocator, kernels) outside the clock
        runs = []
        for workload in settings.workloads:
            for batch in settings.batches:
                run = {"workload": workload, "batch": batch,
                       **_measure(rt, speculator, _groups(rt, workload, batch, settings), settings)}
                runs.append(run)
                progress(f"bench --in-process --speculative {settings.method}: {workload}, batch {batch}, "
                         f"{run['prompts']} prompts: {run['speedup']:.2f}x, acceptance length "
                         f"{run['acceptance_length']:.2f}, same outputs {same_cell(run)}"
                         f"{'' if run['plain_deterministic'] else ' (plain runs differ among themselves)'}")
    finally:
        rt.close()
    data = {"schema": SCHEMA, "settings": {**dataclasses.asdict(settings), "num_draft_tokens": k, "config": cfg.name,
                                           "started_at": started, "finished_at": artifacts.now_iso()},
            "runtime": info, "runs": runs}
    tree = f"-tree{settings.tree_nodes}" if settings.tree_nodes else ""
    path = output or (artifacts.artifact_paths(engines_dir, cfg.name).bench
                      / f"speculative-{settings.method}-k{k}{tree}.json")
    artifacts.write_json_atomic(path, data)
    return SpeculativeResult(path, data)


def _groups(rt, workload: str, batch: int, settings: SpeculativeSettings) -> list[list[list[int]]]:
    """The prompts a run generates, as the batches it runs in turn: at batch 1 ``settings.prompts`` prompts one by
    one, else ``batch`` prompts together (the random ones from the seed + batch, as before)."""
    count = settings.prompts if batch == 1 else batch
    prompts = workload_prompts(rt.tokenizer, workload, count, seed=settings.seed + batch,
                               random_tokens=settings.random_tokens)
    return [[p] for p in prompts] if batch == 1 else [prompts]


def workload_prompts(tok, workload: str, count: int, *, seed: int, random_tokens: int = 256) -> list[list[int]]:
    """``count`` prompts of ``workload`` as token ids: grounded and open ones (``grounded_texts``, ``open_texts``)
    through the tokenizer's chat template where it has one, random ones of ``random_tokens`` non-special ids drawn
    from ``random.Random(seed)`` (also read by benchmarks/spec_simulate.py, so that the study replays the bench's
    prompts)."""
    if workload in TEXTS:
        texts = TEXTS[workload](count)
        if getattr(tok, "chat_template", None):
            return [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                                 add_generation_prompt=True)) for t in texts]
        return [tok.encode(t) for t in texts]
    rng = random.Random(seed)
    special = set(getattr(tok, "all_special_ids", []))
    ids = [i for i in range(min(len(tok), 50_000)) if i not in special]
    return [[rng.choice(ids) for _ in range(random_tokens)] for _ in range(count)]


def _measure(rt, speculator, groups, settings: SpeculativeSettings) -> dict[str, Any]:
    """The run's record (``runs`` of the results file, less workload and batch): plain against speculative over
    ``groups``, the totals of the fastest run of each mode, and at batch 1 each prompt's."""
    plain, plain_s, plain_deterministic, spec, spec_s, deltas = _best_runs(rt, speculator, groups, settings)
    total = {k: sum(d[k] for d in deltas) for k in SPEC_KEYS}
    tokens, rows = sum(len(t) for t in spec), total["spec_decode_verify_rows"]
    prompts = [p for group in groups for p in group]
    run = {"prompts": len(prompts), "prompt_tokens": sum(len(p) for p in prompts) / len(prompts),
           "output_tokens": tokens, "plain_s": sum(plain_s), "spec_s": sum(spec_s),
           "plain_tokens_per_s": sum(len(t) for t in plain) / sum(plain_s), "spec_tokens_per_s": tokens / sum(spec_s),
           "speedup": sum(plain_s) / sum(spec_s), "draft_tokens": total["spec_decode_draft_tokens"],
           "accepted_tokens": total["spec_decode_accepted_tokens"], "verify_rows": rows,
           "acceptance_length": 1 + total["spec_decode_accepted_tokens"] / rows if rows else 1.0,
           "identical": plain_deterministic and plain == spec, "plain_deterministic": plain_deterministic}
    found = [None if a == b else first_difference(rt, prompt, a, b) for prompt, a, b in zip(prompts, plain, spec)]
    parted = [f for f in found if f is not None]
    run["differing_prompts"] = len(parted)
    run["near_tie_differences"] = sum(bool(f["near_tie"]) for f in parted)
    if len(groups) > 1:  # (batch 1)
        run["per_prompt"] = [{"prompt_tokens": len(g[0]), "output_tokens": len(t), "plain_s": p, "spec_s": s,
                              "speedup": p / s,
                              "draft_tokens": d["spec_decode_draft_tokens"],
                              "accepted_tokens": d["spec_decode_accepted_tokens"],
                              "verify_rows": d["spec_decode_verify_rows"], "same": f is None, **(f or {})}
                             for g, t, p, s, d, f in zip(groups, spec, plain_s, spec_s, deltas, found)]
    else:
        run["differences"] = [{"prompt": i, **f} for i, f in enumerate(found) if f is not None]
    return run


def first_difference(rt, prompt: list[int], plain: list[int], spec: list[int]) -> dict[str, Any] | None:
    """Where ``spec`` (speculative greedy output of ``prompt``) first leaves ``plain`` (plain greedy's), and the
    ``margin`` there: the plain token's logit minus the speculative token's, from one eager forward of ``rt``'s
    model over ``prompt`` and ``plain`` up to that position (``margin`` None where one output only stops first);
    ``near_tie``: whether the margin is small enough for rounding to flip (``is_near_tie``). None: no difference."""
    if plain == spec:
        return None
    at = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    if at == min(len(plain), len(spec)):  # one a prefix of the other: an early stop, not a token choice
        return {"first_difference": at, "plain_token": None, "spec_token": None, "margin": None, "near_tie": False}
    # the executor's logits (not rank 0's engine's): under tensor parallelism it gathers the vocabulary shards
    row = rt.executor.logits(rt.hidden_states(list(prompt) + list(plain[:at]))[-1]).float()
    plain_logit, spec_logit = float(row[plain[at]]), float(row[spec[at]])
    margin = plain_logit - spec_logit
    return {"first_difference": at, "plain_token": plain[at], "spec_token": spec[at], "margin": margin,
            "near_tie": is_near_tie(margin, plain_logit)}


def is_near_tie(margin: float, logit: float) -> bool:
    """Whether two logits ``margin`` apart, the larger about ``logit``, are within rounding (``NEAR_TIE_ABS``,
    ``NEAR_TIE_REL``): either way round, as the eager forward may favour either token."""
    return abs(margin) < max(NEAR_TIE_ABS, NEAR_TIE_REL * abs(logit))


def same_cell(run: dict[str, Any]) -> str:
    """The table's ``same`` cell: prompts whose speculative output equals the plain one, of all, and how many of the
    others part on a near tie (``True`` / ``False`` for results written before the counts were)."""
    if "differing_prompts" not in run:
        return str(run["identical"])
    n = run["prompts"]
    cell = f"{n - run['differing_prompts']}/{n}"
    return f"{cell} ties {run['near_tie_differences']}" if run["differing_prompts"] else cell


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "NO"


def _best_runs(rt, speculator, groups, settings: SpeculativeSettings):
    """(plain outputs (the fastest plain run's), its seconds per group, whether every plain run gave the same
    outputs, speculative outputs (the first speculative run's that differ from the plain ones, else the plain ones),
    the fastest speculative run's seconds and counter deltas per group): ``settings.repeats`` runs of each, in turn;
    a run is every group, one after another."""
    plain_runs, spec_runs = [], []
    for _ in range(settings.repeats):
        speculator.enabled = False
        plain_runs.append(_timed(rt, groups, settings))
        speculator.enabled = True
        spec_runs.append(_timed(rt, groups, settings))
    plain, plain_s, _ = min(plain_runs, key=lambda r: sum(r[1]))
    _, spec_s, deltas = min(spec_runs, key=lambda r: sum(r[1]))
    deterministic = all(r[0] == plain for r in plain_runs)
    # spec against plain only: a plain run differing from another is ``plain_deterministic``'s to report
    spec = next((r[0] for r in spec_runs if r[0] != plain), plain)
    return plain, plain_s, deterministic, spec, spec_s, deltas


def _timed(rt, groups, settings: SpeculativeSettings) -> tuple[list[list[int]], list[float], list[dict[str, int]]]:
    """Every group generated in turn: the outputs (all groups'), each group's seconds and speculation counters."""
    out, seconds, deltas = [], [], []
    for prompts in groups:
        before = rt.stats()
        _sync(rt)
        start = time.perf_counter()
        out += _generate(rt, prompts, settings.output_tokens, end_id=-1 if settings.ignore_eos else None)
        _sync(rt)
        seconds.append(time.perf_counter() - start)
        after = rt.stats()
        deltas.append({k: after.get(k, 0) - before.get(k, 0) for k in SPEC_KEYS})
    return out, seconds, deltas


def _generate(rt, prompts, n: int, end_id: int | None = -1) -> list[list[int]]:
    """Greedy outputs of at most ``n`` tokens; ``end_id`` None: the tokenizer's, -1: none."""
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=n, end_id=end_id))]


def _sync(rt) -> None:
    device = getattr(rt, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)
