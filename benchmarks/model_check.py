"""A built model's answers on this machine through every path of the torch runtime, against each other (issue 33).

On the H200 (2026-12-04) the real SmolLM2-135M answered "What is the capital of France?" with "The capital of France
is Paris." from its FP8 build and with "L'Étoile, la Marseillaise, la femme, la femme, ..." from its BF16 build, both
on the fast path. This says which path parts: for each prompt, the greedy text with the fast decode path and without
(eager decodes); the prompt's last-token logits from the eager prefill with the fused layers (``cuda/prefill``) and
with PyTorch's (their relative difference and whether their argmax agree); and the first decode step's logits on the
fast path against eager's. One call after a build:
    python benchmarks/model_check.py -c build_configs/smollm2-135m-instruct-bf16-tp1.yaml --engines-dir /tmp/engines
Prints a table; ``-o`` writes it as JSON. Runs on the CPU too (eager only: the fast path needs CUDA).

``--require-fast``: exit 1 unless the fast path ran (no eager fallback: a kernel that did not compile or launch on
this GPU) and its first decode step is within ``--max-rel`` of eager's, the queue's smoke check of new kernels before
its long parts; ``--max-batch-size N``: the torch runtime at N rows (its batch buckets compiled and captured at load).
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch

from trtllm_pipeline.config import load_config
from trtllm_pipeline.chat import encode_prompt
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow

PROMPTS = ("What is the capital of France?", "What is 3 + 5? Answer with the number.")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def prefill_logits(rt, ids: list[int]) -> dict[str, torch.Tensor]:
    """The prompt's last-token logits through the eager forward, the layers fused and PyTorch's."""
    out = {}
    for fused in (True, False):
        Qwen2Engine.FUSED_LAYERS = fused
        hidden = rt.hidden_states(ids)
        out["fused" if fused else "torch"] = rt.engine.logits(hidden[-1:]).float()[0]
    Qwen2Engine.FUSED_LAYERS = True
    return out


def first_decode(rt, ids: list[int], token: int) -> dict[str, torch.Tensor]:
    """Logits of one decode step after the prompt (its K/V written by the eager prefill): the fast path's and the
    eager model's, from the same cache."""
    rid = ("check", 0)
    rt.kv.admit(rid, list(ids), len(ids) + 1, use_cache=False, watermark=False)
    table = rt.kv.tables[rid]
    try:
        rt._forward([PlanRow(rid, list(ids), 0, table, False)])
        out = {"eager": rt.engine.logits(rt._forward([PlanRow(rid, [token], len(ids), table, True)])).float()[0]}
        if rt.decoder is not None:
            out["fast"] = rt.decoder.decode([token], [table], [len(ids)]).float()[0].clone()
        return out
    finally:
        rt.kv.free(rid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--require-fast", action="store_true", help="exit 1 unless the fast path ran, within --max-rel")
    ap.add_argument("--max-rel", type=float, default=0.05, help="the first decode step's relative distance from eager")
    ap.add_argument("--max-batch-size", type=int, default=None, help="the torch runtime's rows a step")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    cfg = load_config(Path(args.config))
    if args.max_batch_size:
        cfg = cfg.with_max_batch_size(args.max_batch_size)
    report: dict = {"config": cfg.name, "prompts": []}
    texts: dict[str, list[str]] = {}
    for path, overrides in (("fast", {}), ("eager", {"fast_decode": False})):
        rt = load_runtime(cfg.with_runtime(**overrides), args.engines_dir)
        try:
            end_id = getattr(rt.tokenizer, "eos_token_id", None)
            params = SamplingParams(max_tokens=args.max_tokens, end_id=end_id if end_id is not None else -1)
            ids = [encode_prompt(rt.tokenizer, p, raw=False) for p in PROMPTS]
            texts[path] = [rt.tokenizer.decode(c.token_ids) for c in rt.generate(ids, params)]
            report.setdefault("decode_path", {})[path] = rt.decode_path
            if path == "fast":
                for prompt, prompt_ids in zip(PROMPTS, ids):
                    pre = prefill_logits(rt, prompt_ids)
                    token = int(pre["torch"].argmax())
                    step = first_decode(rt, prompt_ids, token)
                    row = {"prompt": prompt, "prefill_fused_vs_torch": rel(pre["fused"], pre["torch"]),
                           "prefill_argmax_equal": bool(pre["fused"].argmax() == pre["torch"].argmax()),
                           "first_token": rt.tokenizer.decode([token]),
                           # the margin a rounding difference has to cross to change the first token
                           "top4": [(rt.tokenizer.decode([int(i)]), round(float(v), 3))
                                    for v, i in zip(*pre["torch"].topk(4))]}
                    if "fast" in step:
                        row["decode_fast_vs_eager"] = rel(step["fast"], step["eager"])
                        row["decode_argmax_equal"] = bool(step["fast"].argmax() == step["eager"].argmax())
                    report["prompts"].append(row)
        finally:
            rt.close()
            del rt  # the next runtime sizes its KV pool from the memory free: this one's must be gone
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    for i, row in enumerate(report["prompts"]):
        row["text_fast"], row["text_eager"] = texts["fast"][i], texts["eager"][i]
        print(f"-- {row['prompt']}")
        print(f"   prefill fused vs torch: rel {row['prefill_fused_vs_torch']:.2e}, argmax equal "
              f"{row['prefill_argmax_equal']}; first token {row['first_token']!r}; top 4 {row['top4']}")
        if "decode_fast_vs_eager" in row:
            print(f"   first decode step fast vs eager: rel {row['decode_fast_vs_eager']:.2e}, argmax equal "
                  f"{row['decode_argmax_equal']}")
        print(f"   fast : {row['text_fast']!r}\n   eager: {row['text_eager']!r}")
    print(f"decode paths: {report.get('decode_path')}")
    if args.output:
        args.output.write_text(json.dumps(report, indent=1))
    if args.require_fast:
        fast = report["decode_path"]["fast"]
        worst = max((row.get("decode_fast_vs_eager", float("inf")) for row in report["prompts"]), default=float("inf"))
        if not fast.startswith("triton kernels") or not worst <= args.max_rel:
            raise SystemExit(f"smoke check failed for {cfg.name}: decode path {fast!r}, first decode step "
                             f"{worst:.2e} from eager (at most {args.max_rel})")
        print(f"smoke check passed for {cfg.name}: {fast}; first decode step within {worst:.2e} of eager")


if __name__ == "__main__":
    main()
