"""The torch runtime's fast CUDA path on a GPU: kernels checked and timed, then whole decode steps.

    python benchmarks/gpu_fast_path.py --out DIR [--parts kernels,attention,step,prefill,hf]
    python benchmarks/gpu_fast_path.py --out DIR --parts quant [--formats int4_awq,w4a8_awq,int8_sq,int8_wo]

Parts (each one's failure is recorded and the next part still runs):
  kernels    each linear kernel at the 7B shapes (QKV, dense, fc+gate, proj, lm_head): error against a
             float32 reference on fresh random inputs, and time at M = 1/8/32/64 against cuBLAS, over
             rotating weight copies larger than L2 (a decode step reads every weight from HBM)
  attention  the decode attention kernel against float32 SDPA; time by batch and context
  step       a Qwen2 decoder of DeepSeek-R1-Distill-Qwen-7B's shape with random weights (shortcut: the
             tensors a TensorRT-LLM checkpoint holds, made and max-calibrated on the GPU, not by
             ModelOpt), BF16 and FP8:
             greedy tokens and logits of the fast path against eager, then ms/token by batch and context
  prefill    eager prefill of a 2048-token prompt, BF16 and FP8
  hf         Hugging Face transformers generate on the same random BF16 weights, and ours beside it
  runtime    TorchRuntime (submit/step, sampling, continuous batching) on the tiny pipeline checkpoints,
             fast path against eager; then on the 7B-shaped checkpoints written to disk: ms/token by batch
  quant      (only when named) the 4/8-bit kernels of runtimes/torch_engine/cuda/quant_linear.py at the 7B shapes, batch 1
             and 32: error against float32 x @ W^T (W dequantized as the format defines it), time and GB/s of
             weight bytes, a tile/split sweep at batch 1, BF16 and FP8 linears beside; then the whole decode
             step at batch 1, context 2048, per --formats (bf16 and fp8 may be added), on 7B-shaped engines
             quantized on the GPU by round-to-nearest (benchmarks/quant_fast_path.py): checked against the
             eager dequantized model, then timed against its bandwidth floor. Table on stdout and in
             DIR/quant_table.txt. --no-quant-sweep: default tiles only.

Results: DIR/gpu_fast_path.json, and a table on stdout. Numbers are the torch runtime's, never
TensorRT-LLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_fast_path  # noqa: E402
from torch_runtime_gpu import synthetic_tensors  # noqa: E402

from trtllm_pipeline.model.catalog import KNOWN_MODELS  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda import attention, linear  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine  # noqa: E402

SHAPE = KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]
DEV = torch.device("cuda")
L2_BYTES = 60 * 2**20
SM = torch.cuda.get_device_properties(0).multi_processor_count
COMPILE_HF = os.environ.get("HF_COMPILE", "1") == "1"  # transformers' static cache + torch.compile beside eager


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def time_graph(fn, reps: int, iters: int = 10) -> float:
    """Median microseconds of one ``fn()``, from a CUDA graph of ``reps`` calls replayed ``iters`` times."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ kernels

PARTIALS, GLU = 0, 2
PDL = DEV.type == "cuda"
LINEARS = [("qkv", 4608, 3584, PARTIALS), ("dense", 3584, 3584, PARTIALS), ("glu", 18944, 3584, GLU),
           ("proj", 3584, 18944, PARTIALS), ("lm_head", 152064, 3584, PARTIALS)]
# (block_n, bytes of K per row, num_warps, num_stages): fewer stages fit more programs per SM
SWEEP = [(64, 128, 4, 3), (64, 256, 4, 2), (64, 128, 4, 4), (32, 128, 4, 3), (32, 256, 4, 3), (16, 128, 4, 3),
         (16, 256, 4, 3), (16, 128, 4, 5), (32, 128, 8, 3), (128, 128, 4, 3)]


def _fp8(t):
    return t.clamp(-448, 448).to(torch.float8_e4m3fn)


def _launch(name, epi, x, w, w2, scale, out, residual, sumsq, cfg, fp8):
    if epi == GLU:
        linear.glu(x, w, w2, scale, None, out, cfg, torch.bfloat16, pdl=PDL)
    else:
        linear.linear_partials(x, w, scale, out, cfg, pdl=PDL)


def kernels_part() -> dict:
    rows = []
    for fp8 in (True, False):
        for name, n, k, epi in LINEARS:
            if name == "lm_head" and fp8:
                continue
            wbytes = 1 if fp8 else 2
            mats = 2 if name == "glu" else 1
            bytes_per_call = n * k * wbytes * mats
            copies = max(2, -(-4 * L2_BYTES // bytes_per_call))
            ws = [(_fp8(torch.randn(n, k, device=DEV) * 8) if fp8 else torch.randn(n, k, device=DEV, dtype=torch.bfloat16) / k**0.5)
                  for _ in range(copies * mats)]
            scale = torch.tensor([0.01], device=DEV) if fp8 else None
            for m in (1, 8, 32, 64):
                norm_in = False
                # the input: a residual stream (NORM_IN, all-ones norm weight, sums of squares in tile 0)
                # or a stored activation (FP8-quantized for FP8 weights)
                x = (torch.randn(m, k, device=DEV) * 3).to(torch.bfloat16)
                sumsq = None
                if norm_in:
                    h = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
                    xin = _fp8(h.float() * 100).float() if fp8 else h.float()
                    xin_scale = 1.0  # the kernel's scale (0.01) stands for activation x weight scale
                    x_arg = x
                else:
                    x_arg = _fp8(x.float() * 8) if fp8 else x
                    xin, xin_scale = x_arg.float(), 1.0
                wf = [w.float() * (0.01 if fp8 else 1) for w in ws[:mats]]
                ref = (xin * xin_scale) @ wf[0].t()
                if name == "glu":
                    gate = ((xin * xin_scale) @ wf[1].t()).to(torch.bfloat16).float()
                    fc = ref.to(torch.bfloat16).float()
                    ref = (F.silu(fc).to(torch.bfloat16).float() * gate)
                results = {}
                res0 = (torch.randn(m, n, device=DEV) * 3).to(torch.bfloat16)  # the residual a RESIDUAL linear adds to
                base = linear.pick_config(m, n, k, wbytes, SM, glu=epi == GLU, splits=1 if name == "lm_head" else None)
                own = (base.block_n, base.block_k * wbytes, base.num_warps, base.num_stages)
                sweep = [own] + [c for c in SWEEP if c != own] if m in (1, 32) else [own]
                split_factors = (0.5, 1, 2) if epi == PARTIALS and name != "lm_head" and m in (1, 32) else (1,)
                for block_n, kbytes, warps, stages in sweep:
                    for sfac in split_factors:
                        splits = max(1, int(base.splits * sfac)) if name != "lm_head" else 1
                        cfg = linear.LinearConfig(base.block_m, block_n, kbytes // wbytes, splits, warps, stages)
                        key = (block_n, cfg.block_k, warps, stages, splits)
                        try:
                            residual = res0.clone()
                            out = (torch.empty(splits, m, n, device=DEV) if epi == PARTIALS else
                                   torch.empty(m, n, device=DEV, dtype=torch.bfloat16))
                            _launch(name, epi, x_arg, ws[0], ws[1] if mats == 2 else None, scale, out, residual,
                                    None, cfg, fp8)
                            got = (out.sum(0) if epi == PARTIALS else
                                   out.float() if epi == GLU else residual.float() - res0.float())
                            err = rel(got, ref)
                            it = iter(range(10**9))
                            res2, ss2 = res0.clone(), None

                            def call(cfg=cfg, out=out, it=it, res2=res2, ss2=ss2):
                                j = next(it) % copies
                                _launch(name, epi, x_arg, ws[mats * j], ws[mats * j + 1] if mats == 2 else None, scale,
                                        out, res2, ss2, cfg, fp8)
                            us = time_graph(call, copies * 2)
                            results[key] = (us, err)
                        except Exception as exc:  # a config that does not compile is a finding, not a stop
                            results[key] = (float("inf"), repr(exc)[:200])
                dkey = (base.block_n, base.block_k, base.num_warps, base.num_stages, base.splits)
                best = min(results, key=lambda c: results[c][0])
                try:
                    it2 = iter(range(10**9))
                    if fp8:
                        xs = x.to(torch.float8_e4m3fn)
                        one = torch.ones((), device=DEV)

                        def cub(it2=it2):
                            j = next(it2) % copies
                            for w in ws[mats * j: mats * j + mats]:
                                torch._scaled_mm(xs, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                    else:
                        def cub(it2=it2):
                            j = next(it2) % copies
                            for w in ws[mats * j: mats * j + mats]:
                                F.linear(x, w)
                    cublas_us = time_graph(cub, copies * 2)
                except Exception as exc:
                    cublas_us = float("nan")
                    print(f"cuBLAS {name} m={m}: {exc!r}"[:300])
                row = {"dtype": "fp8" if fp8 else "bf16", "linear": name, "n": n, "k": k, "m": m,
                       "bytes": bytes_per_call, "default_config": dkey, "default_us": results.get(dkey, (None,))[0],
                       "default_err": results.get(dkey, (None, None))[1], "best_config": best,
                       "best_us": results[best][0], "best_err": results[best][1], "cublas_us": cublas_us,
                       "sweep": {str(c): v for c, v in results.items()}}
                for key in ("default_us", "best_us", "cublas_us"):
                    row[key.replace("_us", "_gbps")] = bytes_per_call / (row[key] or float("nan")) / 1e3
                rows.append(row)
                print(f"{row['dtype']:5}{name:>8} m={m:<3} default {row['default_us']:8.1f} us "
                      f"({row['default_gbps']:6.0f} GB/s, err {row['default_err']})  best {best} {row['best_us']:8.1f} us "
                      f"({row['best_gbps']:6.0f} GB/s)  cuBLAS {cublas_us:8.1f} us ({row['cublas_gbps']:6.0f} GB/s)", flush=True)
            del ws
            torch.cuda.empty_cache()
    return {"linears": rows}


# ---------------------------------------------------------------------------------------- attention


def attention_part() -> dict:
    # each row's keys are one block of the pool (block b: row b's, the whole context), so its table is [b]
    heads, kvh, d = SHAPE.num_attention_heads, SHAPE.num_key_value_heads, SHAPE.head_dim
    qkv_w = (heads + 2 * kvh) * d
    out = {"checks": [], "timings": []}
    for batch, ctx in ((4, 300), (1, 2048), (8, 8192 - 1)):
        max_len = ctx + 64
        kc = torch.randn(batch + 1, kvh, max_len, d, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        parts = torch.randn(2, batch, qkv_w, device=DEV) * 2
        bias = torch.randn(qkv_w, device=DEV, dtype=torch.bfloat16)
        pos = torch.randint(ctx // 2, ctx, (batch,), device=DEV)
        pos[0] = ctx - 1
        slots = torch.arange(batch, device=DEV)
        base = float(SHAPE.rope_theta)
        inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], -1)
        cos, sin = ang.cos().float().to(DEV), ang.sin().float().to(DEV)
        splits = attention.pick_splits(batch, kvh, SM)
        o = torch.empty(batch, heads, splits, d, device=DEV)
        lse = torch.empty(batch, heads, splits, device=DEV)
        y = torch.empty(batch, heads * d, device=DEV, dtype=torch.bfloat16)
        kc0, vc0 = kc.clone(), vc.clone()
        attention.decode_attention(parts, bias, cos, sin, kc, vc, pos, slots, slots[:, None], o, lse, y, None, heads=heads,
                                   kv_heads=kvh, compute=torch.bfloat16)
        # float32 reference
        qkv = (parts.sum(0) + bias.float()).to(torch.bfloat16).float()
        errs, kerr = [], 0.0
        for b in range(batch):
            p = int(pos[b])
            q = qkv[b, : heads * d].view(heads, d)
            k = qkv[b, heads * d: (heads + kvh) * d].view(kvh, d)
            v = qkv[b, (heads + kvh) * d:].view(kvh, d).to(torch.bfloat16)

            def rope(t):
                half = d // 2
                r = torch.cat([-t[..., half:], t[..., :half]], -1)
                return (t * cos[p] + r * sin[p]).to(torch.bfloat16)
            q, k = rope(q), rope(k)
            kerr = max(kerr, rel(kc[b, :, p], k), rel(vc[b, :, p], v))
            keys = kc0[b, :, : p + 1].float().clone()
            vals = vc0[b, :, : p + 1].float().clone()
            keys[:, p], vals[:, p] = k.float(), v.float()
            keys = keys.repeat_interleave(heads // kvh, 0)
            vals = vals.repeat_interleave(heads // kvh, 0)
            att = torch.softmax((q.float()[:, None] @ keys.transpose(-1, -2)) / d**0.5, -1) @ vals
            errs.append(rel(y[b].view(heads, d), att[:, 0]))
        out["checks"].append({"batch": batch, "ctx": ctx, "splits": splits, "max_rel_err": max(errs),
                              "cache_write_rel_err": kerr})
        print(f"attention check batch {batch} ctx {ctx}: rel err {max(errs):.2e}, cache write {kerr:.2e}", flush=True)
    for batch in (1, 8, 32, 64):
        for ctx in (128, 2048, 8192):
            max_len = ctx + 8
            kc = torch.randn(batch + 1, kvh, max_len, d, device=DEV, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            parts = torch.randn(1, batch, qkv_w, device=DEV)
            pos = torch.full((batch,), ctx - 1, device=DEV)
            slots = torch.arange(batch, device=DEV)
            cos = torch.randn(max_len, d, device=DEV)
            splits = attention.pick_splits(batch, kvh, SM)
            o = torch.empty(batch, heads, splits, d, device=DEV)
            lse = torch.empty(batch, heads, splits, device=DEV)
            y = torch.empty(batch, heads * d, device=DEV, dtype=torch.bfloat16)

            def call():
                attention.decode_attention(parts, None, cos, cos, kc, vc, pos, slots, slots[:, None], o, lse, y, None, heads=heads,
                                           kv_heads=kvh, compute=torch.bfloat16)
            us = time_graph(call, 20)
            kv_bytes = 2 * batch * kvh * ctx * d * 2
            out["timings"].append({"batch": batch, "ctx": ctx, "splits": splits, "us": us, "kv_gbps": kv_bytes / us / 1e3})
            print(f"attention batch {batch:2} ctx {ctx:5}: {us:7.1f} us, {kv_bytes / us / 1e3:6.0f} GB/s of KV", flush=True)
            del kc, vc
    return out


# --------------------------------------------------------------------------------------------- step


def calibrated_tensors(fp8: bool) -> tuple[dict, dict]:
    """Random BF16 tensors of the 7B shape; for FP8, quantized with max calibration like ModelOpt's.

    Shortcut (not ModelOpt): per-tensor weight scales amax(W)/448 (fc and gate share one, as the
    export fuses them) and activation scales amax(x)/448 over a 512-token random prompt run through
    the BF16 model.
    """
    config, t = synthetic_tensors(SHAPE, False, DEV)
    if not fp8:
        return config, t
    amax = quant_fast_path.input_amax(config, t, DEV)  # max calibration: one eager BF16 pass of 512 tokens
    names = {"qkv": ["attention.qkv"], "dense": ["attention.dense"], "fc_gate": ["mlp.fc", "mlp.gate"], "proj": ["mlp.proj"]}
    for (i, key), a in amax.items():
        p = f"transformer.layers.{i}."
        ws = [t[p + n + ".weight"] for n in names[key]]
        w_scale = torch.tensor([max(float(w.float().abs().max()) for w in ws) / 448], device=DEV)
        for n, w in zip(names[key], ws):
            t[p + n + ".weight"] = (w.float() / w_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            t[p + n + ".weights_scaling_factor"] = w_scale
            t[p + n + ".activation_scaling_factor"] = torch.tensor([a / 448], device=DEV)
    config["quantization"] = {"quant_algo": "FP8"}
    return config, t


def make_engine(fp8: bool, max_slots: int, max_seq_len: int) -> Qwen2Engine:
    config, tensors = calibrated_tensors(fp8)
    return Qwen2Engine(config, tensors, device=DEV, max_slots=max_slots, max_seq_len=max_seq_len)


def weight_bytes(engine) -> int:
    total = engine.lm_head.numel() * engine.lm_head.element_size()
    for layer in engine.layers:
        for key in ("qkv", "dense", "fc_gate", "proj"):
            w = layer[key].weight
            total += w.numel() * w.element_size()
    return total


def _prefill(engine, prompts):
    firsts = []
    for b, p in enumerate(prompts):
        h = engine.forward_slots(p, torch.tensor([b], device=DEV), torch.tensor([0], device=DEV), 256)
        firsts.append(int(engine.logits(h[:, -1]).argmax(-1)))
    return firsts


def _eager_step(engine, tokens, lens, s):
    tok = torch.tensor(tokens, device=DEV)[:, None]
    pos = torch.tensor([n + s for n in lens], device=DEV)
    h = engine.forward_slots(tok, torch.arange(len(tokens), device=DEV), pos, 512)
    return engine.logits(h[:, -1]).float()


def check_against_eager(fp8: bool, graphs, engine, n_check=32) -> dict:
    """Fast path vs eager (same weights, same cache) and both vs an eager float32 reference."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    lens = [37, 64, 111, 200]
    prompts = [torch.randint(0, SHAPE.vocab_size, (1, n), device=DEV, generator=gen) for n in lens]
    config, tensors = calibrated_tensors(fp8)
    ref = Qwen2Engine(config, tensors, device=DEV, max_slots=4, max_seq_len=512, dtype=torch.float32)
    del tensors
    firsts = _prefill(ref, prompts)
    ref_logits = _eager_step(ref, firsts, lens, 0)
    del ref
    torch.cuda.empty_cache()
    firsts_bf16 = _prefill(engine, prompts)
    snap_k, snap_v = engine.cache_k[:, : 1 + 4 * engine.slot_blocks].clone(), engine.cache_v[:, : 1 + 4 * engine.slot_blocks].clone()
    eager_tokens, eager_logits = [firsts_bf16], None
    for s in range(n_check):
        lg = _eager_step(engine, eager_tokens[-1], lens, s)
        eager_logits = lg.clone() if s == 0 else eager_logits
        eager_tokens.append(lg.argmax(-1).tolist())
    engine.cache_k[:, : 1 + 4 * engine.slot_blocks], engine.cache_v[:, : 1 + 4 * engine.slot_blocks] = snap_k, snap_v
    fast_tokens, fast_logits = [firsts_bf16], None
    for s in range(n_check):
        lg = graphs.decode(fast_tokens[-1], graphs.step.engine.slot_tables([0, 1, 2, 3]), [n + s for n in lens])
        fast_logits = lg.clone() if s == 0 else fast_logits
        fast_tokens.append(graphs.greedy(4).tolist())
    same = sum(a == b for ea, fa in zip(eager_tokens[1:], fast_tokens[1:]) for a, b in zip(ea, fa))
    first_div = next((s for s, (ea, fa) in enumerate(zip(eager_tokens[1:], fast_tokens[1:])) if ea != fa), n_check)
    return {"precision": "fp8" if fp8 else "bf16",
            "step0_rel_err_fast_vs_eager": rel(fast_logits, eager_logits),
            "step0_rel_err_eager_vs_fp32": rel(eager_logits, ref_logits),
            "step0_rel_err_fast_vs_fp32": rel(fast_logits, ref_logits),
            "prefill_greedy_equal_fp32": firsts == firsts_bf16,
            "step0_argmax_equal": bool((fast_logits.argmax(-1) == eager_logits.argmax(-1)).all()),
            "greedy_tokens_equal": f"{same}/{4 * n_check}", "first_divergent_step": first_div}


def _time_decode(graphs, batch, ctx, steps):
    slots, tokens = list(range(batch)), [1] * batch
    tables = graphs.step.engine.slot_tables(slots)  # resident on the device after the first step (request ids)
    for w in range(3):
        graphs.decode(tokens, tables, [ctx + w] * batch, slots)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall0 = time.perf_counter()
    for s in range(steps):
        graphs.decode(tokens, tables, [ctx + s] * batch, slots)
        tokens = graphs.greedy(batch).tolist()  # the one copy a served token needs
    wall = (time.perf_counter() - wall0) / steps * 1000
    a.record()
    for _ in range(20):
        graphs.graphs[batch].replay()
    b.record()
    b.synchronize()
    return wall, a.elapsed_time(b) / 20


def step_part(batches=(1, 8, 32, 64), contexts=(128, 2048, 8192), steps=128) -> dict:
    out = {"runs": [], "checks": [], "variants": []}
    max_b = max(batches)
    for fp8 in (True, False):
        label = "fp8" if fp8 else "bf16"
        engine = make_engine(fp8, max_slots=max_b + 1, max_seq_len=max(contexts) + steps + 16)
        wbytes = weight_bytes(engine)
        for pdl in (True, False):
            graphs = DecodeGraphs(DecodeStep(engine, pdl=pdl), [1, 64])
            graphs.prepare()
            for batch in (1, 64):
                wall, replay = _time_decode(graphs, batch, 2048, 32)
                v = {"precision": label, "pdl": pdl, "batch": batch, "context": 2048,
                     "ms_per_step": wall, "graph_replay_ms": replay}
                out["variants"].append(v)
                print(f"variant {v}", flush=True)
            del graphs
        graphs = DecodeGraphs(DecodeStep(engine), list(batches))
        t0 = time.perf_counter()
        graphs.prepare()
        setup = time.perf_counter() - t0
        check = check_against_eager(fp8, graphs, engine)
        check["setup_s"] = setup
        out["checks"].append(check)
        print(f"{label} check: {check}", flush=True)
        # timing: random cache contents, every row at the same context
        engine.cache_k.normal_()
        engine.cache_v.normal_()
        for ctx in contexts:
            for batch in batches:
                wall, replay = _time_decode(graphs, batch, ctx, steps)
                kv = 2 * SHAPE.num_hidden_layers * SHAPE.num_key_value_heads * SHAPE.head_dim * 2 * ctx * batch
                floor_ms = (wbytes + kv) / 4.3e12 * 1000
                run = {"precision": label, "batch": batch, "context": ctx, "ms_per_step": wall,
                       "graph_replay_ms": replay, "tokens_per_s": batch * 1000 / wall, "weight_bytes": wbytes,
                       "kv_bytes": kv, "achieved_gbps": (wbytes + kv) / replay / 1e6,
                       "floor_ms_at_4.3TBps": floor_ms, "fraction_of_floor": floor_ms / wall}
                out["runs"].append(run)
                print(f"{label} b={batch:2} ctx={ctx:5}: {wall:6.3f} ms/step ({run['tokens_per_s']:8.0f} tok/s), "
                      f"replay {replay:6.3f} ms, {run['achieved_gbps']:5.0f} GB/s, floor {floor_ms:.3f} ms "
                      f"({run['fraction_of_floor']:.0%})", flush=True)
        del graphs, engine
        torch.cuda.empty_cache()
    return out


def prefill_part(n=2048) -> dict:
    out = []
    for fp8 in (True, False):
        engine = make_engine(fp8, max_slots=2, max_seq_len=n + 64)
        prompt = torch.randint(0, SHAPE.vocab_size, (1, n), device=DEV)
        slot, start = torch.zeros(1, dtype=torch.long, device=DEV), torch.zeros(1, dtype=torch.long, device=DEV)
        key_len = -(-n // 256) * 256
        times = []
        for i in range(6):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            h = engine.forward_slots(prompt, slot, start, key_len)
            engine.logits(h[:, -1])
            b.record()
            b.synchronize()
            if i:
                times.append(a.elapsed_time(b))
        out.append({"precision": "fp8" if fp8 else "bf16", "prompt": n, "prefill_ms": statistics.median(times)})
        print(f"prefill {out[-1]}", flush=True)
        del engine
        torch.cuda.empty_cache()
    return {"prefill": out}


def hf_part(new_tokens=64, ctx=512) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=SHAPE.hidden_size, intermediate_size=SHAPE.intermediate_size,
                      num_hidden_layers=SHAPE.num_hidden_layers, num_attention_heads=SHAPE.num_attention_heads,
                      num_key_value_heads=SHAPE.num_key_value_heads, vocab_size=SHAPE.vocab_size,
                      max_position_embeddings=SHAPE.max_position_embeddings, rope_theta=SHAPE.rope_theta,
                      rms_norm_eps=SHAPE.rms_norm_eps, tie_word_embeddings=False)
    with torch.device(DEV):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    prompt = torch.randint(0, SHAPE.vocab_size, (1, ctx), device=DEV)
    res = {}
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        ids = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
        res["hf_eager_ms_per_token"] = (time.perf_counter() - t) * 1000 / new_tokens
        if COMPILE_HF:
            # transformers' own fast mode: a static KV cache and the decode step under torch.compile
            # ("reduce-overhead": CUDA graphs); timed after two warm-up generations that compile it.
            try:
                model.generation_config.cache_implementation = "static"
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                t0 = time.perf_counter()
                for _ in range(2):
                    model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
                res["hf_compile_warmup_s"] = time.perf_counter() - t0
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
                torch.cuda.synchronize()
                res["hf_static_compile_ms_per_token"] = (time.perf_counter() - t) * 1000 / new_tokens
            except Exception as exc:  # a failure of HF's compile mode is a finding, not a stop
                res["hf_static_compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
            model.forward = model.__class__.forward.__get__(model)
    hf_tokens = ids[0, ctx:].tolist()
    # the same weights in the checkpoint's layout, through our fast path
    sd = model.state_dict()
    t = {"transformer.vocab_embedding.weight": sd["model.embed_tokens.weight"], "transformer.ln_f.weight": sd["model.norm.weight"],
         "lm_head.weight": sd["lm_head.weight"]}
    for i in range(SHAPE.num_hidden_layers):
        a, p = f"model.layers.{i}.", f"transformer.layers.{i}."
        t[p + "input_layernorm.weight"] = sd[a + "input_layernorm.weight"]
        t[p + "post_layernorm.weight"] = sd[a + "post_attention_layernorm.weight"]
        t[p + "attention.qkv.weight"] = torch.cat([sd[a + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        t[p + "attention.qkv.bias"] = torch.cat([sd[a + f"self_attn.{x}_proj.bias"] for x in "qkv"])
        t[p + "attention.dense.weight"] = sd[a + "self_attn.o_proj.weight"]
        t[p + "mlp.fc.weight"] = sd[a + "mlp.gate_proj.weight"]
        t[p + "mlp.gate.weight"] = sd[a + "mlp.up_proj.weight"]
        t[p + "mlp.proj.weight"] = sd[a + "mlp.down_proj.weight"]
    del model
    config = {"architecture": "Qwen2ForCausalLM", "dtype": "bfloat16", "hidden_size": SHAPE.hidden_size,
              "intermediate_size": SHAPE.intermediate_size,
              "num_hidden_layers": SHAPE.num_hidden_layers, "num_attention_heads": SHAPE.num_attention_heads,
              "num_key_value_heads": SHAPE.num_key_value_heads, "head_size": SHAPE.head_dim, "vocab_size": SHAPE.vocab_size,
              "norm_epsilon": SHAPE.rms_norm_eps, "rotary_base": SHAPE.rope_theta, "mapping": {"tp_size": 1},
              "quantization": {"quant_algo": None}}
    engine = Qwen2Engine(config, t, device=DEV, max_slots=2, max_seq_len=ctx + new_tokens + 64)
    del t, sd
    graphs = DecodeGraphs(DecodeStep(engine), [1])
    graphs.prepare()
    h = engine.forward_slots(prompt, torch.zeros(1, dtype=torch.long, device=DEV), torch.zeros(1, dtype=torch.long, device=DEV), ctx)
    tokens = [int(engine.logits(h[:, -1]).argmax(-1))]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(new_tokens - 1):
        graphs.decode([tokens[-1]], graphs.step.engine.slot_tables([0]), [ctx + s])
        tokens.append(int(graphs.greedy(1)[0]))
    torch.cuda.synchronize()
    res["ours_bf16_ms_per_token"] = (time.perf_counter() - t0) * 1000 / (new_tokens - 1)
    res["speedup"] = res["hf_eager_ms_per_token"] / res["ours_bf16_ms_per_token"]
    if "hf_static_compile_ms_per_token" in res:
        res["speedup_vs_hf_compile"] = res["hf_static_compile_ms_per_token"] / res["ours_bf16_ms_per_token"]
    res["greedy_tokens_equal_hf"] = f"{sum(a == b for a, b in zip(tokens, hf_tokens))}/{len(tokens)}"
    res["first_divergence"] = next((i for i, (a, b) in enumerate(zip(tokens, hf_tokens)) if a != b), len(tokens))
    print(f"hf: {res}", flush=True)
    return res


def write_checkpoint(fp8: bool, out: Path, tokenizer_dir: Path) -> Path:
    """The calibrated random 7B tensors as a TensorRT-LLM checkpoint the torch runtime loads."""
    import shutil

    from safetensors.torch import save_file

    config, tensors = calibrated_tensors(fp8)
    config.update({"architecture": "Qwen2ForCausalLM", "qwen_type": "qwen2",
                   "max_position_embeddings": SHAPE.max_position_embeddings,
                   "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}})
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(out / "rank0.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copytree(tokenizer_dir, out / "tokenizer", dirs_exist_ok=True)
    return out


def _runtime_generate(rt, prompts, params_list, stagger: bool):
    """Generate with continuous batching; with ``stagger`` a new request joins every 3 steps."""
    from trtllm_pipeline.runtimes.base import TextStream

    streams = {i: TextStream(rt.tokenizer) for i in range(len(prompts))}
    reasons, pending, steps = {}, list(range(len(prompts))), 0
    while pending or rt.has_work():
        if pending and (not stagger or steps % 3 == 0):
            i = pending.pop(0)
            rt.submit(i, prompts[i], params_list[i])
        for ev in rt.step():
            rt.apply_event(ev, streams, reasons)
        steps += 1
    return [streams[i].token_ids for i in range(len(prompts))]


def runtime_part() -> dict:
    """The torch runtime users run: the tiny pipeline checkpoints, then the 7B-shaped one, on CUDA."""
    from trtllm_pipeline.runtimes.base import SamplingParams
    from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

    root = Path(__file__).resolve().parents[1] / "engines"
    out = {"tiny": [], "bench": []}
    for name in ("tiny-qwen2-fp8-tp1", "tiny-qwen2-bf16-tp1"):
        ckpt = root / name / "checkpoint"
        fast = TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", max_batch_size=8, max_seq_len=1024)
        eager = TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", max_batch_size=8, max_seq_len=1024,
                             fast_decode=False)
        gen = torch.Generator().manual_seed(3)
        prompts = [torch.randint(100, 2000, (n,), generator=gen).tolist() for n in (5, 40, 77, 130, 9, 300)]
        greedy = [SamplingParams(max_tokens=48, end_id=-1)] * len(prompts)
        seeded = [SamplingParams(max_tokens=24, temperature=0.8, top_k=40, top_p=0.9, seed=11 + i, end_id=-1)
                  for i in range(len(prompts))]
        row = {"checkpoint": name, "describe": fast.describe()["decode_path"]}
        for label, params in (("greedy", greedy), ("seeded", seeded)):
            for stagger in (False, True):
                a = _runtime_generate(fast, prompts, params, stagger)
                b = _runtime_generate(eager, prompts, params, stagger)
                same = sum(x == y for ta, tb in zip(a, b) for x, y in zip(ta, tb))
                total = sum(len(t) for t in a)
                row[f"{label}_{'staggered' if stagger else 'together'}_tokens_equal"] = f"{same}/{total}"
                row[f"{label}_{'staggered' if stagger else 'together'}_lengths_ok"] = all(
                    len(t) == p.max_tokens for t, p in zip(a, params))
        out["tiny"].append(row)
        print(f"runtime tiny: {row}", flush=True)
        del fast, eager
    tok_dir = root / "tiny-qwen2-fp8-tp1" / "checkpoint" / "tokenizer"
    for fp8 in (True, False):
        ckpt = write_checkpoint(fp8, Path("/tmp") / f"r1-7b-shape-{'fp8' if fp8 else 'bf16'}", tok_dir)
        t0 = time.perf_counter()
        rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", max_batch_size=64, max_seq_len=2048 + 160)
        load_s = time.perf_counter() - t0
        print(f"7B {'fp8' if fp8 else 'bf16'} runtime loaded in {load_s:.1f} s: {rt.describe()['decode_path']}", flush=True)
        for batch, ctx in ((1, 128), (1, 2048), (8, 2048), (32, 2048), (64, 2048), (64, 128)):
            gen = torch.Generator().manual_seed(batch * 7 + ctx)
            prompts = [torch.randint(1000, 100000, (ctx,), generator=gen).tolist() for _ in range(batch)]
            n_out = 144
            params = SamplingParams(max_tokens=n_out, min_tokens=n_out, end_id=-1)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for i, p in enumerate(prompts):
                rt.submit(i, p, params)
            step_times, first = [], None
            while rt.has_work():
                s0 = time.perf_counter()
                events = rt.step()
                dt = time.perf_counter() - s0
                if first is None and events:
                    first = time.perf_counter() - t0
                elif events and all(len(e.token_ids) <= 1 for e in events) and len(events) == batch:
                    step_times.append(dt)
            decode = statistics.median(step_times[16:]) * 1000 if len(step_times) > 32 else float("nan")
            row = {"precision": "fp8" if fp8 else "bf16", "batch": batch, "context": ctx, "decode_ms_per_step": decode,
                   "tokens_per_s": batch * 1000 / decode, "ttft_all_prefilled_s": first, "steps_timed": len(step_times),
                   "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30, "load_s": load_s}
            out["bench"].append(row)
            print(f"runtime 7B {row}", flush=True)
        del rt
        torch.cuda.empty_cache()
    return out


def tiny_part() -> dict:
    """The tiny pipeline checkpoints on CUDA: fast and eager BF16 against eager float32, logits and tokens."""
    from trtllm_pipeline.runtimes.base import SamplingParams
    from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
    from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

    root = Path(__file__).resolve().parents[1] / "engines"
    out = []
    for name in ("tiny-qwen2-bf16-tp1", "tiny-qwen2-fp8-tp1"):
        ckpt = root / name / "checkpoint"
        rts = {label: TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", max_batch_size=8, max_seq_len=1024,
                                   dtype=dtype, fast_decode=fast)
               for label, dtype, fast in (("fast", None, True), ("eager", None, False), ("fp32", "float32", False))}
        gen = torch.Generator().manual_seed(3)
        prompts = [torch.randint(100, 2000, (n,), generator=gen).tolist() for n in (5, 40, 77, 130, 9, 300)]
        logits = {}
        for label, rt in rts.items():
            rows = []
            for i, p in enumerate(prompts):  # each prompt in blocks of the runtime's pool
                rt.kv.admit(("check", i), p, len(p) + 1, use_cache=False, watermark=False)
                rows.append(PlanRow(("check", i), p, 0, rt.kv.tables[("check", i)], False))
            rt._forward(rows)
            tables, pos = [r.block_table for r in rows], [len(p) for p in prompts]
            if rt.decoder is not None:
                logits[label] = rt.decoder.decode([7] * len(prompts), tables, pos).float().clone()
            else:
                logits[label] = rt.engine.logits(rt._forward([PlanRow(r.request_id, [7], n, r.block_table, True)
                                                              for r, n in zip(rows, pos)])).float()
            for i in range(len(prompts)):
                rt.kv.free(("check", i))
        tokens = {label: [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=48, end_id=-1))]
                  for label, rt in rts.items()}

        def agree(a, b):
            return f"{sum(x == y for ta, tb in zip(tokens[a], tokens[b]) for x, y in zip(ta, tb))}/{48 * len(prompts)}"
        row = {"checkpoint": name,
               "logits_rel_err_fast_vs_fp32": rel(logits["fast"], logits["fp32"]),
               "logits_rel_err_eager_vs_fp32": rel(logits["eager"], logits["fp32"]),
               "tokens_fast_vs_fp32": agree("fast", "fp32"), "tokens_eager_vs_fp32": agree("eager", "fp32"),
               "tokens_fast_vs_eager": agree("fast", "eager")}
        out.append(row)
        print(f"tiny: {row}", flush=True)
        del rts
    return {"tiny": out}


QUANT = {"formats": list(quant_fast_path.QUANT_FORMATS), "sweep": True, "out": None}


def quant_part() -> dict:
    """The 4/8-bit kernels at the 7B shapes (with BF16 and FP8 linears beside), then whole decode steps."""
    t0 = time.perf_counter()
    formats = QUANT["formats"]
    kernel_formats = [f for f in formats if f in quant_fast_path.QUANT_FORMATS] + ["bf16", "fp8"]
    out = {"formats": formats}
    # the sweep stops after 4 minutes, so the part stays well inside one 10-minute call
    qkv = (SHAPE.num_attention_heads + 2 * SHAPE.num_key_value_heads) * SHAPE.head_dim
    out["kernels"] = quant_fast_path.kernel_rows(kernel_formats, time_graph, DEV, SM, l2_bytes=L2_BYTES,
                                                 hidden=SHAPE.hidden_size, intermediate=SHAPE.intermediate_size, qkv=qkv,
                                                 deadline=t0 + (240 if QUANT["sweep"] else 0),
                                                 log=lambda s: print(s, flush=True))
    out["kernels_seconds"] = time.perf_counter() - t0
    out["steps"] = quant_fast_path.step_rows(formats, lambda: synthetic_tensors(SHAPE, False, DEV), DEV,
                                             log=lambda s: print(s, flush=True))
    text = quant_fast_path.table(out)
    print(text, flush=True)
    if QUANT["out"] is not None:
        (QUANT["out"] / "quant_table.txt").write_text(text + "\n")
    return out


PARTS = {"tiny": tiny_part, "runtime": runtime_part, "kernels": kernels_part, "attention": attention_part, "step": step_part, "prefill": prefill_part,
         "hf": hf_part, "quant": quant_part}
DEFAULT_PARTS = [p for p in PARTS if p != "quant"]  # the quant part runs when named


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS))
    ap.add_argument("--formats", default=",".join(quant_fast_path.QUANT_FORMATS),
                    help="quant part: formats of the decode steps (int4_awq,w4a8_awq,int8_sq,int8_wo,fp8,bf16)")
    ap.add_argument("--no-quant-sweep", action="store_true", help="quant part: default tiles only")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    QUANT["formats"] = [f for f in args.formats.split(",") if f]
    unknown = set(QUANT["formats"]) - set(quant_fast_path.QUANT_ALGO)
    if unknown:
        ap.error(f"--formats: unknown {sorted(unknown)}; choose from {sorted(quant_fast_path.QUANT_ALGO)}")
    QUANT["sweep"], QUANT["out"] = not args.no_quant_sweep, args.out
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "sm_count": SM,
              "weights": "random, DeepSeek-R1-Distill-Qwen-7B shape; tensors made on the GPU (not by ModelOpt)"}
    import triton
    result["triton"] = triton.__version__
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            result[part] = PARTS[part]()
        except Exception:
            result[part] = {"error": traceback.format_exc()}
            print(f"PART {part} FAILED:\n{traceback.format_exc()}", flush=True)
        result[part + "_seconds"] = time.perf_counter() - t0
        (args.out / "gpu_fast_path.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"--- {part} done in {result[part + '_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
