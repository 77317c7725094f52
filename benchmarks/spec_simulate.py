"""Prompt lookup offline (issue 35): the model steps each speculation setting needs, replayed on cached greedy outputs.

    python benchmarks/spec_simulate.py [-c build_configs/smollm2-135m-instruct-bf16-tp1.yaml] [--engines-dir engines]
        [--cache spec-greedy.json] [--out spec-simulate.json] [--ks 4,6,8,12,16] [--top 20]

On the GPU a SmolLM2 step costs about the same whether it verifies 1 or 1 + k tokens (the step is the host's), so
the steps a setting takes for the output are the speedup's proxy, and they depend only on the greedy output: a verify
step emits exactly plain greedy decoding's tokens. So:

1. Greedy outputs, made once and cached (``--cache``, JSON; one made with other options is refused): the build
   loaded on the CPU through the project's runtime (built first if needed; speculation off), each prompt alone
   (batch 1), ``--output-tokens`` tokens with no end id, then cut after the model's end id (recorded in the cache)
   as ``bench --in-process --speculative`` generates them since 2026-12-07 (``--ignore-eos``: not cut, as before).
   Workloads: ``grounded``, all 18 task x passage pairs (``bench/passages.py``, chat template, in
   ``grounded_texts`` order: the first is the bench's old single batch-1 prompt); ``random``, ``--random-prompts``
   prompts of random ids (``workload_prompts`` with the bench's batch-1 seed: the first is its prompt); ``open``,
   ``--open-prompts`` open-ended requests (``passages.OPEN_PROMPTS``: nothing to copy). A cache lacking a workload
   (one made before ``open``), or holding one made from other texts (``texts_key``: bench/passages.py changed),
   gets it made and added.
2. Each setting replayed per prompt with the runtime's own ``NgramProposer`` and ``Speculator``, driven as
   ``TorchRuntime`` drives them at batch 1 (``replay``): the prefill emits the first token; then each decode step
   asks ``budget`` within the room left (``max_tokens - generated - 1``), looks up at most that many drafts,
   ``found_nothing`` when none; a step with d drafts is a verify row that emits 1 + (leading drafts equal to the
   greedy continuation), reported by ``verified(d, accepted)``; one without emits one token.
   tests/test_speculative.py checks the replay's counters against ``Runtime.stats()`` of a real run.

Reported per setting and workload: steps (the prefill counted as one: plain decoding takes ``output_tokens``), verify
rows, steps the GPU would chain on the one before (``chain``: a plain step after a plain one whose request
``drafts_next`` said no, as ``OverlapSteps`` decides), drafted / accepted, tokens per step, the ideal speedup (plain
steps / speculative steps, summed over the prompts: a verify row costing a plain step) with the worst prompt's and
the first's, a modelled speedup (``modelled``: a verify row ``--verify-cost`` plain steps, a chained step
``--chain-cost``; plain decoding chains too) with the worst prompt's, and the proposer's host time per lookup on
this CPU. Judge a setting on all 18 grounded prompts, not the first alone. ``--cache`` alone (made) needs no model
and runs in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import time
from pathlib import Path

from trtllm_pipeline.runtimes.torch_engine.speculative import speculator as speculator_module
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import DraftRequest, NgramProposer
from trtllm_pipeline.runtimes.torch_engine.speculative.speculator import Speculator

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "build_configs" / "smollm2-135m-instruct-bf16-tp1.yaml"
BENCH_SEED = 1234  # bench --in-process --speculative's default --seed; its batch-1 random prompts use seed + 1
GROUNDED_PROMPTS = 18  # every task x passage pair of bench/passages.py


def texts_key(workload: str, count: int) -> str | None:
    """A digest of a written workload's prompt texts (None for the random one, drawn from the seed): a cache made
    from other texts (bench/passages.py changed) is remade for that workload."""
    from trtllm_pipeline.bench.speculative import TEXTS

    return hashlib.sha256(json.dumps(TEXTS[workload](count)).encode()).hexdigest()[:16] if workload in TEXTS else None


def answers(workloads: dict, end_id: int | None) -> dict:
    """The cached outputs cut after the first ``end_id`` (kept: the step that emits it is a step), as requests that
    end at the model's end id generate them; ``end_id`` None: as cached (--ignore-eos)."""
    def cut(out):
        return out[: out.index(end_id) + 1] if end_id is not None and end_id in out else out
    return {w: [{**it, "output": cut(it["output"])} for it in items] for w, items in workloads.items()}


def greedy_outputs(config: Path, engines_dir: Path, cache: Path, output_tokens: int, random_prompts: int,
                   compute_dtype: str, open_prompts: int = 6, ignore_eos: bool = False) -> dict:
    """{"grounded": [{"prompt", "output"}...], "random": [...], "open": [...]} from ``cache`` where it holds them for
    these options; a workload it lacks (or holds another count of, or made from other texts) is generated and added
    to it. Outputs are generated past the end id and returned cut after it unless ``ignore_eos`` (``answers``)."""
    from trtllm_pipeline.bench.speculative import workload_prompts
    from trtllm_pipeline.build import build
    from trtllm_pipeline.config import load_config
    from trtllm_pipeline.runtimes.base import SamplingParams
    from trtllm_pipeline.runtimes.registry import load_runtime

    cfg = load_config(config).with_runtime(device="cpu", compute_dtype=compute_dtype)
    key = {"config": cfg.name, "compute_dtype": compute_dtype, "output_tokens": output_tokens}
    counts = {"grounded": GROUNDED_PROMPTS, "random": random_prompts, "open": open_prompts}
    workloads, texts, end_id = {}, {}, None
    if cache.is_file():  # made for these options, or refused (a cache of before the open workload: its key also
        data = json.loads(cache.read_text())  # named random_prompts, the count now checked per workload)
        found = {k: v for k, v in data.get("key", {}).items() if k != "random_prompts"}
        if found != key:
            raise SystemExit(f"{cache} holds the outputs of {data.get('key')}, not {key}: give its options, or "
                             "another --cache")
        texts, end_id = data.get("texts", {}), data.get("end_id")
        workloads = {w: items for w, items in data["workloads"].items()
                     if len(items) == counts.get(w) and texts.get(w) == texts_key(w, counts[w])}
    missing = {w: n for w, n in counts.items() if w not in workloads}
    if not missing:
        if end_id is None and not ignore_eos:
            raise SystemExit(f"{cache} does not name the model's end id (made before 2026-12-07): remake it (delete "
                             "it), or give --ignore-eos")
        return answers(workloads, None if ignore_eos else end_id)
    build(cfg, engines_dir=engines_dir, runtime="torch")  # a cache hit once built
    rt = load_runtime(cfg, engines_dir)
    end_id = rt.tokenizer.eos_token_id
    try:
        for workload, count in missing.items():
            texts[workload] = texts_key(workload, count)
            prompts = workload_prompts(rt.tokenizer, workload, count, seed=BENCH_SEED + 1)
            workloads[workload] = []
            for i, prompt in enumerate(prompts):
                start = time.perf_counter()
                out = rt.generate([prompt], SamplingParams(max_tokens=output_tokens, end_id=-1))[0].token_ids
                workloads[workload].append({"prompt": list(prompt), "output": list(out)})
                print(f"{workload} {i}: {len(prompt)} prompt tokens, {len(out)} generated in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
    finally:
        rt.close()
    cache.write_text(json.dumps({"key": key, "texts": texts, "end_id": end_id, "workloads": workloads}))
    return answers(workloads, None if ignore_eos else end_id)


def replay(prompt: list[int], output: list[int], *, k: int, ngram_min: int, ngram_max: int, adaptive: bool = True,
           quiet: bool = True) -> dict:
    """One request of greedy ``output`` replayed under a setting, as ``TorchRuntime._propose`` / ``_verify`` /
    ``_record_verified`` run the speculator at batch 1 (max_tokens = len(output); max_seq_len never binds)."""
    sp = Speculator(NgramProposer(ngram_min, ngram_max), k, adaptive=adaptive)
    sp.quiet_backoff = adaptive and quiet  # (the runtime's: adaptive and TRTLLM_PIPELINE_SPEC_QUIET != 0)
    rid, generated, steps, lookups, lookup_s = "r", list(output[:1]), 1, 0, 0.0  # step 1: the prefill's token
    chained, chain_next = 0, False
    while len(generated) < len(output):
        chained += chain_next
        room = len(output) - len(generated) - 1
        budget = min(room, sp.budget(rid)) if room > 0 else 0
        drafts = []
        if budget > 0:
            start = time.perf_counter()
            drafts = [int(t) for t in sp.propose([DraftRequest(rid, prompt, generated, budget)])[0][:budget]]
            lookup_s += time.perf_counter() - start
            lookups += 1
            if not drafts:
                sp.found_nothing(rid)
        steps += 1
        at = len(generated)
        if drafts:
            accepted = next((i for i, d in enumerate(drafts) if d != output[at + i]), len(drafts))
            sp.verified(rid, len(drafts), accepted)
            generated += output[at : at + accepted + 1]
            chain_next = False  # (a verify step is never left running)
        else:
            generated.append(output[at])
            chain_next = not sp.drafts_next(rid)  # the GPU chains the next step on this one (OverlapSteps)
    sp.release(rid)
    return {"steps": steps, "tokens": len(generated), "chained": chained, "lookups": lookups, "lookup_s": lookup_s,
            "drafted": sp.draft_tokens, "accepted": sp.accepted_tokens, "verify_rows": sp.verify_rows}


def settings_grid(ks, mins, maxs) -> list[dict]:
    modes = [(True, True), (True, False), (False, False)]  # adaptive + quiet (today), adaptive alone, neither
    return [{"k": k, "ngram_min": lo, "ngram_max": hi, "adaptive": a, "quiet": q}
            for k, lo, hi, (a, q) in itertools.product(ks, mins, maxs, modes) if lo <= hi]


def modelled(run: dict, verify_cost: float, chain_cost: float) -> tuple[float, float]:
    """(plain decoding's cost, this run's), in unchained plain steps: the prefill 1, a verify row ``verify_cost``, a
    chained plain step ``chain_cost``, any other step 1. Plain decoding chains every decode step but the first (the
    prefill before it runs eagerly: SmolLM2's prompts are longer than the fast path's largest verify bucket)."""
    plain = 2 + (run["tokens"] - 2) * chain_cost
    other = run["steps"] - 1 - run["verify_rows"] - run["chained"]
    return plain, 1 + run["verify_rows"] * verify_cost + run["chained"] * chain_cost + other


def summarise(setting: dict, runs: list[dict], verify_cost: float, chain_cost: float) -> dict:
    steps = sum(r["steps"] for r in runs)
    plain = sum(r["tokens"] for r in runs)  # plain decoding: one step a token (the prefill's included)
    lookups = sum(r["lookups"] for r in runs)
    costs = [modelled(r, verify_cost, chain_cost) for r in runs]
    return {**setting, "prompts": len(runs), "steps": steps,
            **{key: sum(r[key] for r in runs) for key in ("verify_rows", "chained", "drafted", "accepted")},
            "tokens_per_step": plain / steps, "speedup": plain / steps,
            "modelled_speedup": sum(c[0] for c in costs) / sum(c[1] for c in costs),
            "worst_prompt_modelled": min(c[0] / c[1] for c in costs),
            "worst_prompt_speedup": min(r["tokens"] / r["steps"] for r in runs),
            "first_prompt_speedup": runs[0]["tokens"] / runs[0]["steps"],
            "per_prompt_steps": [r["steps"] for r in runs],
            "lookup_us": 1e6 * sum(r["lookup_s"] for r in runs) / lookups if lookups else 0.0}


def label(s: dict) -> str:
    mode = "adaptive+quiet" if s["quiet"] else "adaptive" if s["adaptive"] else "fixed"
    return f"k={s['k']:<2} n={s['ngram_min']}..{s['ngram_max']} {mode}"


def table(results: list[dict], top: int, default: dict) -> list[str]:
    """Per mode (adaptive + quiet, adaptive, fixed) its ``top`` settings by grounded ideal speedup, then the default
    (marked *), each with its random row beside it."""
    ranked = []
    for mode in ("adaptive+quiet", "adaptive", "fixed"):
        ranked += sorted((r for r in results if label(r["setting"]).endswith(mode)),
                         key=lambda r: -r["grounded"]["speedup"])[:top]
    if default not in [r["setting"] for r in ranked]:
        ranked += [r for r in results if r["setting"] == default]
    head = (f"{'setting':<29} | {'grounded: steps':>15} {'rows':>4} {'chain':>5} {'drafted':>7} {'acc':>4} "
            f"{'tok/step':>8} {'ideal':>6} {'worst':>6} {'first':>6} {'model':>6} {'worst':>6} | "
            f"{'random: steps':>13} {'ideal':>6} {'model':>6} | {'open: steps':>11} {'ideal':>6} {'model':>6} "
            f"{'worst':>6} | {'lookup us':>9}")
    lines = [head, "-" * len(head)]
    for r in ranked:
        g, x, o = r["grounded"], r["random"], r["open"]
        mark = " *" if r["setting"] == default else ""
        lines.append(f"{label(r['setting']) + mark:<29} | {g['steps']:>15} {g['verify_rows']:>4} {g['chained']:>5} "
                     f"{g['drafted']:>7} {g['accepted']:>4} {g['tokens_per_step']:>8.2f} {g['speedup']:>5.2f}x "
                     f"{g['worst_prompt_speedup']:>5.2f}x {g['first_prompt_speedup']:>5.2f}x "
                     f"{g['modelled_speedup']:>5.2f}x {g['worst_prompt_modelled']:>5.2f}x | {x['steps']:>13} "
                     f"{x['speedup']:>5.2f}x {x['modelled_speedup']:>5.2f}x | {o['steps']:>11} "
                     f"{o['speedup']:>5.2f}x {o['modelled_speedup']:>5.2f}x {o['worst_prompt_modelled']:>5.2f}x | "
                     f"{(g['lookup_us'] + x['lookup_us']) / 2:>9.1f}")
    return lines


def ints(text: str) -> list[int]:
    """A comma-separated list of integers (an option's value)."""
    return [int(v) for v in text.split(",") if v.strip()]


def greedy_arguments(description: str, out: str) -> argparse.ArgumentParser:
    """A parser with the options of the cached greedy outputs (``greedy_outputs``) and ``--out`` (default ``out``):
    this study's and ``spec_tree.py``'s."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=description)
    parser.add_argument("-c", "--config", type=Path, default=DEFAULT_CONFIG, help="build config (default SmolLM2)")
    parser.add_argument("--engines-dir", type=Path, default=REPO / "engines")
    parser.add_argument("--cache", type=Path, default=Path("spec-greedy.json"), help="greedy outputs (JSON)")
    parser.add_argument("--out", type=Path, default=Path(out), help="every setting's figures (JSON)")
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--random-prompts", type=int, default=6)
    parser.add_argument("--open-prompts", type=int, default=6)
    parser.add_argument("--compute-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="the CPU runtime's matmuls (auto: float32 on the CPU)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="replay every output --output-tokens long, past the model's end id (default: cut after "
                        "it, as `bench --in-process --speculative` generates since 2026-12-07)")
    return parser


def main(argv=None) -> None:
    parser = greedy_arguments(__doc__, "spec-simulate.json")
    parser.add_argument("--ks", type=ints, default=[4, 6, 8, 12, 16])
    parser.add_argument("--ngram-mins", type=ints, default=[1, 2, 3])
    parser.add_argument("--ngram-maxs", type=ints, default=[3, 4, 6])
    parser.add_argument("--verify-cost", type=float, default=1.0,
                        help="the model's verify row, in unchained plain steps (SmolLM2 on the H200: about 1)")
    parser.add_argument("--chain-cost", type=float, default=0.85,
                        help="the model's chained plain step, in unchained ones (an assumption: SmolLM2's graph replay "
                        "is 0.62 ms of a 0.74-0.80 ms step; chaining is not measured on a GPU yet)")
    parser.add_argument("--top", type=int, default=6, help="settings printed per mode (by grounded ideal speedup)")
    args = parser.parse_args(argv)

    workloads = greedy_outputs(args.config, args.engines_dir, args.cache, args.output_tokens, args.random_prompts,
                               args.compute_dtype, args.open_prompts, args.ignore_eos)
    from trtllm_pipeline.config import SpeculativeSection

    d = SpeculativeSection(method="ngram")  # (prompt lookup's defaults: k is by method)
    default = {"k": d.num_draft_tokens, "ngram_min": d.ngram_min, "ngram_max": d.ngram_max, "adaptive": d.adaptive,
               "quiet": d.adaptive}
    grid = settings_grid(args.ks, args.ngram_mins, args.ngram_maxs)
    if default not in grid:
        grid.append(default)
    results = []
    for setting in grid:
        row = {"setting": setting}
        for workload, items in workloads.items():
            runs = [replay(it["prompt"], it["output"], **setting) for it in items]
            row[workload] = summarise(setting, runs, args.verify_cost, args.chain_cost)
        results.append(row)
    print("\n".join(table(results, args.top, default)))
    print(f"({len(results)} settings; grounded: {len(workloads['grounded'])} prompts, random: "
          f"{len(workloads['random'])}, open: {len(workloads['open'])}; modelled: a verify row {args.verify_cost}, "
          f"a chained step {args.chain_cost}; "
          f"Speculator: QUIET_AFTER {speculator_module.QUIET_AFTER}, MAX_QUIET {speculator_module.MAX_QUIET}, "
          f"FIRST_BACKOFF {speculator_module.FIRST_BACKOFF}, MAX_BACKOFF {speculator_module.MAX_BACKOFF})")
    args.out.write_text(json.dumps({"verify_cost": args.verify_cost, "chain_cost": args.chain_cost,
                                    "output_tokens": args.output_tokens,
                                    "default": default, "results": results}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
