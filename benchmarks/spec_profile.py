"""Where a batch-1 speculative step's wall time goes on a GPU (issue 35): prompt lookup on a small real model is host
bound (SmolLM2 FP8 on an H100: ~1.3 ms a verify step against ~0.75 ms of its graph), so this says on what.

    python benchmarks/spec_profile.py -c build_configs/smollm2-135m-instruct-fp8-tp1.yaml --engines-dir ENGINES \
        --out OUT [--prompts 6]

The build's runtime with ``runtime.speculative`` ngram (drafting where TRTLLM_PIPELINE_SPEC_DEVICE says: on the
device by default), the grounded workload's first --prompts prompts at batch 1, 128 tokens each; warmed once, then
per mode (plain: speculation off; speculative) the wall time per engine step and the host seconds by step phase
(``phase_times()``, with ``stats()``'s counters)
and cProfile's functions of a second run by own time and by inclusive time (cProfile slows Python, not the GPU: its
shares, not its totals, are the reading). Writes spec_profile.json and spec_profile.txt under --out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from trtllm_pipeline.bench.speculative import SpeculativeSettings, workload_prompts
from trtllm_pipeline.config import load_config
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime

TOP = 30


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run(rt, prompts, tokens: int) -> tuple[float, dict]:
    before = {**rt.stats(), **rt.phase_times()}
    _sync()
    start = time.perf_counter()
    for p in prompts:
        rt.generate([p], SamplingParams(max_tokens=tokens, end_id=-1))
    _sync()
    seconds = time.perf_counter() - start
    after = {**rt.stats(), **rt.phase_times()}
    # (counters and seconds only: a ratio such as the acceptance length has no difference)
    return seconds, {k: round(v - before.get(k, 0), 6) for k, v in after.items()
                     if isinstance(v, (int, float)) and not k.endswith("_length")}


def _profiled(rt, prompts, tokens: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    _run(rt, prompts, tokens)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(TOP)
    stats.sort_stats("cumulative").print_stats(TOP)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    cfg = load_config(Path(args.config))
    rt = load_runtime(cfg.with_runtime(**SpeculativeSettings().runtime_overrides()), args.engines_dir)
    report, text = {"config": cfg.name, "describe": rt.describe()}, []
    try:
        prompts = workload_prompts(rt.tokenizer, "grounded", args.prompts, seed=0)
        for mode in ("plain", "speculative"):
            rt.speculator.enabled = mode == "speculative"
            _run(rt, prompts[:1], 16)  # warm
            seconds, delta = _run(rt, prompts, args.tokens)
            steps = {k: v for k, v in delta.items() if v and not k.startswith(("requests_", "kv_"))}
            n = delta.get("steps") or 1
            report[mode] = {"seconds": seconds, "tokens": args.tokens * len(prompts), "counters": steps,
                            "ms_per_step": 1e3 * seconds / n}
            line = (f"{mode}: {seconds * 1e3:.1f} ms for {args.tokens * len(prompts)} tokens, "
                    f"{report[mode]['ms_per_step']:.3f} ms a step; counters {steps}")
            print(line, flush=True)
            text += [f"==== {line}", _profiled(rt, prompts, args.tokens)]
    finally:
        rt.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec_profile.json").write_text(json.dumps(report, indent=2, default=str))
    (args.out / "spec_profile.txt").write_text("\n".join(text))
    print("\n".join(text)[:20000])


if __name__ == "__main__":
    main()
