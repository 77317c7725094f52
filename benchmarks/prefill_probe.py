"""Prefill's time on the GPU (issues 30-32): one prompt of each length through the engine's forward, the layers fused
(``cuda/prefill``) against PyTorch operations (``Qwen2Engine.FUSED_LAYERS = False``), a later chunk over a long
cached prefix (the masked attention: ``model._masked_attention``), each prompt as rows of a fast step and from its
length bucket's prefill graph (``cuda/prefill_graphs``, and that graph against the eager forward; several prompts
a graph against their eager forward), and the fused 2048-token prefill's kernels by device time. One call on the
H200, after a build:
    python benchmarks/prefill_probe.py -c build_configs/r1-distill-qwen-7b-random-fp8-tp1-load.yaml \\
        --engines-dir /tmp/engines -o prefill.json
Prints a table (ms per prefill, median of --repeats after a warm-up) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from trtllm_pipeline.config import load_config
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch

from throughput_probe import kernel_sums  # noqa: E402  (benchmarks/ is the script's directory)


def sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def timed(engine, rows, repeats: int) -> float:
    """Median ms of ``engine(batch)`` over ``repeats`` calls after one warm-up."""
    batch = PagedBatch.of(rows).to(engine.device)
    engine(batch)
    sync(engine)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine(batch)
        sync(engine)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timed_graph(graphs, rows, repeats: int) -> float:
    """Median ms of ``graphs.forward(rows)`` (first chunks from their prefill graph) after one warm-up."""
    graphs.forward(rows)
    sync(graphs.engine)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        graphs.forward(rows)
        sync(graphs.engine)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--engines-dir", type=Path, default=Path("engines"))
    ap.add_argument("--lengths", default="16,128,512,2048", help="prompt lengths, one prompt per call")
    ap.add_argument("--chunk", default="6144/2048", help="a later chunk: cached prefix / chunk tokens")
    ap.add_argument("--prefill-chunk-tokens", type=int, default=None,
                    help="the runtime's prefill chunk (the config's by default): prefill graphs of R prompts hold R x "
                    "length tokens up to the bucket that holds it (4096: two 2048-token prompts a graph)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    rt = load_runtime(load_config(Path(args.config)).with_runtime(prefill_chunk_tokens=args.prefill_chunk_tokens),
                      args.engines_dir)
    engine = rt.engine
    bs = engine.block_size
    prefix, chunk = (int(x) for x in args.chunk.split("/"))
    longest = max([prefix + chunk] + [int(n) for n in args.lengths.split(",")])
    table = list(range(1, 1 + -(-longest // bs)))  # blocks of the pool, scratch for this probe (nothing else runs)
    g = torch.Generator().manual_seed(0)

    vocab = engine.embedding.shape[0]

    def prompt(n):
        return torch.randint(0, min(30000, vocab), (n,), generator=g).tolist()

    results = []
    for fused in (True, False):
        Qwen2Engine.FUSED_LAYERS = fused
        for n in (int(x) for x in args.lengths.split(",")):
            ms = timed(engine, [(prompt(n), 0, table)], args.repeats)
            results.append({"case": f"prompt {n}", "fused": fused, "tokens": n, "ms": ms})
            print(f"{'fused' if fused else 'torch'} prompt {n:5d}: {ms:8.2f} ms  ({n / ms:8.0f} tokens/ms)", flush=True)
        engine(PagedBatch.of([(prompt(prefix), 0, table)]).to(engine.device))  # the cached prefix
        ms = timed(engine, [(prompt(chunk), prefix, table)], args.repeats)
        results.append({"case": f"chunk {chunk} after {prefix}", "fused": fused, "tokens": chunk, "ms": ms})
        print(f"{'fused' if fused else 'torch'} chunk {chunk} after {prefix}: {ms:8.2f} ms", flush=True)
    # a short prompt as rows of one fast step (runtime._split: what a served step does with it now)
    if rt.decoder is not None and hasattr(rt.decoder, "verify"):
        for n in (int(x) for x in args.lengths.split(",")):
            if n > rt.decoder.buckets[-1]:
                continue
            ids = prompt(n)
            rt.decoder.verify([ids], [table], [0], [("probe", 0)])
            sync(engine)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                rt.decoder.verify([ids], [table], [0], [("probe", 0)])
                sync(engine)
                times.append((time.perf_counter() - start) * 1e3)
            ms = statistics.median(times)
            results.append({"case": f"prompt {n}", "fast_step": True, "tokens": n, "ms": ms})
            print(f"fast-step prompt {n:5d}: {ms:8.2f} ms  ({n / ms:8.0f} tokens/ms)", flush=True)
        rt.decoder.release([("probe", 0)])
    # a lone prompt's first chunk from its length bucket's CUDA graph (runtime._forward), and its agreement with the
    # eager forward on the same prompt (the padding after it must change nothing before it); then several prompts'
    # first chunks from one graph (R rows of a bucket) against the eager forward of the same rows, per prompt
    graphs = rt.prefill_graphs
    Qwen2Engine.FUSED_LAYERS = True  # (the graphs were captured so)
    if graphs is not None:
        for n in (int(x) for x in args.lengths.split(",")):
            if graphs.bucket(n) is None:
                continue
            ms = timed_graph(graphs, [(prompt(n), table)], args.repeats)
            results.append({"case": f"prompt {n}", "graph": graphs.bucket(n), "tokens": n, "ms": ms})
            print(f"graph ({graphs.bucket(n)}) prompt {n:5d}: {ms:8.2f} ms  ({n / ms:8.0f} tokens/ms)", flush=True)
        ids = prompt(min(1000, graphs.buckets[-1]))  # (padded: 1000 in the 1024 bucket)
        from_graph = graphs.forward([(ids, table)]).float()
        eager = engine(PagedBatch.of([(ids, 0, table)]).to(engine.device)).float()
        last = [engine.logits(h[-1:].to(engine.dtype)) for h in (from_graph, eager)]
        check_graph = {"tokens": len(ids), "hidden_rel": float((from_graph - eager).norm() / eager.norm()),
                       "last_argmax_equal": bool(last[0].argmax() == last[1].argmax())}
        results.append({"case": "graph vs eager", **check_graph})
        print(f"graph vs eager forward, {len(ids)} tokens: {check_graph}", flush=True)
        # R prompts a step, each its own blocks (scratch past the single prompt's)
        width, base = -(-graphs.buckets[-1] // bs), 1 + len(table)
        for rows, length in (s for s in graphs.shapes if s[0] > 1):
            batch = [(prompt(length), list(range(base + i * width, base + (i + 1) * width))) for i in range(rows)]
            ms = timed_graph(graphs, batch, args.repeats)
            eager_ms = timed(engine, [(ids_, 0, t) for ids_, t in batch], args.repeats)
            from_graph = graphs.forward(batch).float()
            eager = engine(PagedBatch.of([(ids_, 0, t) for ids_, t in batch]).to(engine.device)).float()
            case = {"case": f"{rows} prompts of {length}", "graph": [rows, length], "tokens": rows * length,
                    "ms": ms, "eager_ms": eager_ms, "ms_per_prompt": ms / rows, "eager_ms_per_prompt": eager_ms / rows,
                    "hidden_rel": float((from_graph - eager).norm() / eager.norm())}
            results.append(case)
            print(f"graph {rows} x {length:5d}: {ms:8.2f} ms ({ms / rows:7.2f} a prompt), eager {eager_ms:8.2f} ms "
                  f"({eager_ms / rows:7.2f} a prompt), hidden states {case['hidden_rel']:.1e} from eager's", flush=True)
    # the fused layers against PyTorch's on one prompt: their hidden states and the last token's logits, after the
    # whole network and after its first layer (a random model's 28 layers amplify a rounding difference: the first
    # layer's says whether the kernels agree)
    batch = PagedBatch.of([(prompt(min(512, longest)), 0, table)]).to(engine.device)
    check = {}
    every = engine.layers
    for depth, layers in (("all", every), ("layer0", every[:1])):
        engine.layers = layers
        hidden = {}
        for fused in (True, False):
            Qwen2Engine.FUSED_LAYERS = fused
            hidden[fused] = engine(batch).float()
        engine.layers = every
        rel = float((hidden[True] - hidden[False]).norm() / hidden[False].norm())
        last = [engine.logits(hidden[f][-1:].to(engine.dtype)) for f in (True, False)]
        check[depth] = {"hidden_rel": rel, "last_argmax_equal": bool(last[0].argmax() == last[1].argmax()),
                        "logits_rel": float((last[0] - last[1]).norm() / last[1].norm())}
        print(f"fused vs torch layers ({depth}), {batch.tokens.shape[0]} tokens: hidden rel {rel:.2e}, last logits "
              f"rel {check[depth]['logits_rel']:.2e}, argmax equal {check[depth]['last_argmax_equal']}")
    Qwen2Engine.FUSED_LAYERS = True
    batch = PagedBatch.of([(prompt(min(2048, longest)), 0, table)]).to(engine.device)
    engine(batch)
    sync(engine)
    cuda = engine.device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        engine(batch)
        sync(engine)
    kernels = kernel_sums(prof, 20)
    print("-- the fused 2048-token prefill by kernel:")
    for k in kernels:
        print(f"  {k['device_us'] / 1e3:8.3f} ms {k['calls']:6d}  {k['name']}")
    print(f"runtime: {rt.decode_path}")
    if args.output:
        args.output.write_text(json.dumps({"runtime": rt.decode_path, "results": results, "check": check,
                                           "kernels": kernels},
                                          indent=1))


if __name__ == "__main__":
    main()
