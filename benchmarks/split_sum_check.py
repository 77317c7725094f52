"""The INT4 decode step's split-K sums on a GPU: each way of summing against the eager model, with and without
PDL and CUDA graphs, three steps each (a race shows as steps that differ).

    python benchmarks/split_sum_check.py [--layers 4] [-o split_sum_check.json]

A 7B-shaped Qwen2 (DeepSeek-R1-Distill-Qwen-7B's widths, ``--layers`` layers) with random weights, quantized
to INT4-AWQ on the GPU by round-to-nearest (benchmarks/quant_fast_path.py), a random KV cache at context
2048; one decode step per configuration, its logits against the eager (dequantized) model's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quant_fast_path import input_amax, quantized_checkpoint, rel  # noqa: E402
from torch_runtime_gpu import synthetic_tensors  # noqa: E402

from trtllm_pipeline.model.catalog import KNOWN_MODELS  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda import decode_step  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine  # noqa: E402

DEV = torch.device("cuda")
CTX = 2048


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("-o", "--out", default="split_sum_check.json")
    a = ap.parse_args()
    shape = dataclasses.replace(KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"], num_hidden_layers=a.layers)
    config, tensors = synthetic_tensors(shape, False, DEV)
    amax = input_amax(config, tensors, DEV)
    cfg, tensors = quantized_checkpoint("int4_awq", config, tensors, amax, DEV)
    engine = Qwen2Engine(cfg, tensors, device=DEV, max_slots=2, max_seq_len=CTX + 64)
    engine.cache_k.normal_()
    engine.cache_v.normal_()
    token, pos = 7, CTX
    snap = engine.cache_k.clone(), engine.cache_v.clone()
    zero = torch.zeros(1, dtype=torch.long, device=DEV)
    with torch.no_grad():
        eager = engine.logits(engine(torch.tensor([[token]], device=DEV), zero, torch.tensor([pos], device=DEV),
                                     -(-(pos + 1) // 64) * 64)[:, -1]).float()
    rows = []
    # "fixed" with the input norms folded into the QKV GEMVs (gemv_input.NormFold) and without
    for split_sum, fold in (("last", False), ("fixed", False), ("fixed", True), ("none", False)):
        for pdl in (False, True):
            for graphs in (False, True):
                engine.cache_k.copy_(snap[0])
                engine.cache_v.copy_(snap[1])
                decode_step.FOLD_INPUT_NORM = fold
                step = DecodeStep(engine, pdl=pdl, split_sum=split_sum)
                g = DecodeGraphs(step, [1], use_graphs=graphs)
                g.prepare()
                runs = [g.decode([token], g.step.engine.slot_tables([0]), [pos]).clone() for _ in range(3)]
                row = {"split_sum": split_sum + ("+fold" if fold else ""), "pdl": step.pdl, "graphs": g.use_graphs,
                       "rel_vs_eager": rel(runs[-1], eager), "runs_equal": all(torch.equal(r, runs[0]) for r in runs),
                       "greedy_is_argmax": int(g.greedy(1)[0]) == int(runs[-1].argmax())}
                rows.append(row)
                print(json.dumps(row), flush=True)
                del g, step
    Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "layers": a.layers, "rows": rows},
                                      indent=1))
    print(f"{'split_sum':10} {'pdl':5} {'graphs':6} {'rel vs eager':>12} {'runs equal':>10} {'greedy ok':>9}")
    for r in rows:
        print(f"{r['split_sum']:10} {r['pdl']!s:5} {r['graphs']!s:6} {r['rel_vs_eager']:12.3e} {r['runs_equal']!s:>10} "
              f"{r['greedy_is_argmax']!s:>9}")


if __name__ == "__main__":
    main()
