"""The ``quant`` part of benchmarks/gpu_fast_path.py: the 4/8-bit decode kernels and decode steps at the 7B shape.

Importable without a GPU (the tensors and checks take a device; the CPU tests run them at a tiny shape
through Triton's interpreter); timing takes ``gpu_fast_path``'s CUDA-graph timer as an argument.

Weights are synthetic: the random BF16 7B tensors of ``torch_runtime_gpu.synthetic_tensors``, quantized on
the device by round-to-nearest (not ModelOpt, not AWQ's search): INT4 per group of 128 inputs (amax / 7),
INT8 per output channel (amax / 127), W4A8's second-level scale so that the largest group step is 448 / 8
FP8 steps, pre-quant scales drawn in [0.8, 1.25] (different for mlp.fc and mlp.gate, as ModelOpt's exports
of these formats have them, so fc/gate run as a pair of matrices), activation scales from the amax of each
linear's input in an eager BF16 pass over a random prompt (max calibration), widened by the largest
pre-quant scale. The numbers are random; the byte counts, shapes and code paths are the 7B's.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtllm_pipeline.runtimes.torch_engine.cuda import (attention, decode_step, fixed_sum, linear, norm, quant_gemv, quant_gemv_ws,
                                           quant_linear, support)
from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import CARVEOUT_MODULES, DecodeStep
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs
from trtllm_pipeline.runtimes.torch_engine.model import Linear, Qwen2Engine, fake_fp8, fake_int8

QUANT_FORMATS = ("int4_awq", "w4a8_awq", "int8_sq", "int8_wo")
QUANT_ALGO = {"int4_awq": "W4A16_AWQ", "w4a8_awq": "W4A8_AWQ", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int8_wo": "W8A16",
              "fp8": "FP8", "bf16": None}
GROUP = 128
LINEAR_NAMES = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
HOOKED = {"attention.qkv": "qkv", "attention.dense": "dense", "mlp.fc": "fc_gate", "mlp.gate": "fc_gate",
          "mlp.proj": "proj"}


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


# --------------------------------------------------------------------------------- synthetic tensors


def pack_int4_rows(v: torch.Tensor) -> torch.Tensor:
    """(N, K) integers in [-8, 7] -> (N/2, K) int8, row 2j in the low nibble (torch_model.unpack_int4_rows)."""
    v = v.to(torch.int16)
    return ((v[0::2] & 0xF) | ((v[1::2] & 0xF) << 4)).to(torch.uint8).view(torch.int8)


def quantize_linear(fmt: str, w: torch.Tensor, amax_in: float | None, gen: torch.Generator,
                    group: int = GROUP, w_amax: float | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (names without the layer prefix) of BF16 weight ``w`` [N, K] in ``fmt``, by RTN."""
    n, k = w.shape
    dev = w.device
    wf = w.float()
    out: dict[str, torch.Tensor] = {}
    pqs = None
    if fmt in ("int4_awq", "w4a8_awq", "int8_sq"):
        pqs = 0.8 + 0.45 * torch.rand(k, generator=gen, device=dev)
        out["prequant_scaling_factor"] = pqs.to(torch.bfloat16)
    a_amax = (amax_in or 8.0) * (1.25 if pqs is not None else 1.0)
    if fmt in ("int4_awq", "w4a8_awq"):
        g = wf.reshape(n, k // group, group)
        s = (g.abs().amax(-1) / 7).clamp_min(1e-8)
        v = torch.round(g / s[..., None]).clamp(-8, 7).reshape(n, k)
        out["weight"] = pack_int4_rows(v)
        out["weights_scaling_factor"] = s
        if fmt == "w4a8_awq":
            out["weights_scaling_factor_2"] = (s.max() * 8 / 448).reshape(1)
            out["activation_scaling_factor"] = torch.tensor([a_amax / 448], device=dev)
    elif fmt in ("int8_sq", "int8_wo"):
        s = (wf.abs().amax(1) / 127).clamp_min(1e-8)
        out["weight"] = torch.round(wf / s[:, None]).clamp(-127, 127).to(torch.int8)
        if fmt == "int8_sq":
            out["weights_scaling_factor"] = s
            out["activation_scaling_factor"] = torch.tensor([a_amax / 127], device=dev)
        else:
            out["per_channel_scale"] = s[:, None]
    elif fmt == "fp8":
        s = (torch.tensor(w_amax, device=dev) if w_amax else wf.abs().max()).reshape(1) / 448
        out["weight"] = (wf / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        out["weights_scaling_factor"] = s
        out["activation_scaling_factor"] = torch.tensor([a_amax / 448], device=dev)
    else:
        out["weight"] = w
    return out


def input_amax(config: dict, tensors: dict, device, prompt_len: int = 512) -> dict[tuple[int, str], float]:
    """Max calibration: the amax of each linear's input (by layer and engine key) in an eager BF16 pass."""
    eng = Qwen2Engine(config, tensors, device=device, max_slots=1, max_seq_len=prompt_len + 64)
    amax, hooks = {}, []
    for i, layer in enumerate(eng.layers):
        for key in ("qkv", "dense", "fc_gate", "proj"):
            def hook(mod, args, key=(i, key)):
                amax[key] = max(amax.get(key, 0.0), float(args[0].float().abs().max()))
            hooks.append(layer[key].register_forward_pre_hook(hook))
    gen = torch.Generator(device=device).manual_seed(2)
    prompt = torch.randint(0, config["vocab_size"], (1, prompt_len), device=device, generator=gen)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    eng.forward_slots(prompt, zero, zero, prompt_len)
    for h in hooks:
        h.remove()
    return amax


def quantized_checkpoint(fmt: str, config: dict, tensors: dict, amax: dict | None, device) -> tuple[dict, dict]:
    """(config, tensors) of the BF16 checkpoint ``tensors`` quantized to ``fmt`` (consumed: BF16 weights freed)."""
    if fmt == "bf16":
        return config, tensors
    config = {**config, "quantization": {"quant_algo": QUANT_ALGO[fmt], "kv_cache_quant_algo": None,
                                         **({"group_size": GROUP, "has_zero_point": False, "pre_quant_scale": True}
                                            if fmt in ("int4_awq", "w4a8_awq") else {}),
                                         "exclude_modules": ["lm_head"]}}
    gen = torch.Generator(device=device).manual_seed(5)
    layers = config["num_hidden_layers"]
    shared: dict[int, float] = {}
    for i in range(layers):
        p = f"transformer.layers.{i}."
        for name in LINEAR_NAMES:
            w = tensors.pop(p + name + ".weight")
            a = (amax or {}).get((i, HOOKED[name]))
            # FP8: fc and gate share one per-tensor weight scale, as ModelOpt's export gives them (one GEMM)
            w_amax = None
            if fmt == "fp8" and name in ("mlp.fc", "mlp.gate"):
                other = tensors.get(p + "mlp.gate.weight", w)
                w_amax = shared.setdefault(i, max(float(w.float().abs().max()), float(other.float().abs().max())))
            if name == "mlp.gate" and a is not None and fmt in ("w4a8_awq", "int8_sq"):
                a *= 1.01  # fc and gate calibrated apart, as ModelOpt's exports of these formats are
            for suffix, t in quantize_linear(fmt, w, a, gen, w_amax=w_amax).items():
                tensors[p + name + "." + suffix] = t
            del w
    return config, tensors


# ------------------------------------------------------------------------------------------- kernels


def reference_input(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    """Float32: the eager product ``x * pre_quant_scale`` (compute dtype), then the activation quantizer."""
    if lin.pre_quant_scale is not None:
        x = x * lin.pre_quant_scale.to(x.dtype)
    if lin.format == "w4a8_awq":
        return fake_fp8(x, lin.a_scale)
    if lin.format == "int8_sq":
        return fake_int8(x, lin.a_scale)
    return x.float()


def kernel_cases(hidden: int, intermediate: int, qkv: int) -> list[tuple[str, int, int, bool]]:
    """(name, N, K, glu) of the decode linears (fc+gate as one GLU launch of two N x K matrices)."""
    return [("qkv", qkv, hidden, False), ("dense", hidden, hidden, False), ("glu", intermediate, hidden, True),
            ("proj", hidden, intermediate, False)]


def _sweep(q: quant_linear.QuantWeight, m: int, sm: int, glu: bool, sweep: bool) -> list[linear.LinearConfig]:
    base = quant_linear.pick_config(q, m, sm, glu=glu)
    out = [base]
    if base.gemv:  # INT4-AWQ at batch 1: the dot kernel it replaces is always timed beside it
        out.append(quant_linear.pick_config(q, m, sm, glu=glu, gemv=False))
        if base.tma:  # and the register-load GEMV's default
            out.append(quant_gemv.pick_config(q, sm, glu=glu, tma=False))
    if not sweep:
        return out
    if base.gemv:
        # (block_n, block_k, splits, warps, stages): weight tiles by the bulk tensor copy engine, ``stages``
        # deep (the register-load tiles were swept in runs 33-38, docs/perf-notes.md)
        r = dataclasses.replace
        if glu:  # splits > 1: the row tile's last program sums fc and gate (a grid of whole waves)
            shapes = [(64, 128, 1, 4, 3), (64, 128, 1, 4, 4), (128, 128, 1, 4, 3), (128, 128, 1, 8, 4),
                      (32, 128, 1, 4, 4), (64, 128, 1, 2, 4), (32, 128, 2, 4, 4), (64, 128, 2, 4, 4)]
        elif triton.cdiv(q.k, 128) > 32:  # proj: K long
            shapes = [(128, 128, 14, 4, 4), (128, 128, 14, 4, 3), (128, 128, 28, 4, 3), (64, 128, 28, 4, 4),
                      (256, 128, 14, 8, 4), (256, 128, 28, 8, 4)]
        else:  # qkv, dense: K short
            shapes = [(128, 128, 7, 4, 4), (128, 128, 14, 4, 3), (64, 128, 7, 4, 4), (256, 128, 7, 8, 4)]
        for block_n, block_k, splits, warps, stages in shapes:
            cfg = r(base, block_n=block_n, block_k=block_k, splits=splits, num_warps=warps, num_stages=stages,
                    tma=True)
            if cfg not in out:
                out.append(cfg)
        return out
    for block_n in ((64, 128, 256) if q.int4 else (32, 64, 128)):
        for factor in ((1,) if glu else (0.5, 1, 2)):
            cfg = quant_linear.pick_config(q, m, sm, glu=glu, block_n=block_n)
            cfg = dataclasses.replace(cfg, splits=max(1, int(cfg.splits * factor)))
            if cfg not in out:
                out.append(cfg)
    # The 4-bit kernels are compute-bound (run 12): more warps per program and other stage counts.
    for warps, stages in ((8, 3), (8, 2), (4, 2), (4, 4)):
        cfg = dataclasses.replace(base, num_warps=warps, num_stages=stages)
        if cfg not in out:
            out.append(cfg)
    return out


def kernel_rows(formats, time_fn, device, sm: int, *, batches=(1, 32), hidden=3584, intermediate=18944,
                qkv=4608, l2_bytes=60 * 2**20, sweep_batches=(1,), deadline: float | None = None,
                log=print) -> list[dict]:
    """Each quant kernel at the given shapes: error against float32 ``x @ W^T`` (W dequantized as the format
    defines it, x quantized as its activation quantizer does), then time over rotating weight copies larger
    than L2, with a small tile / split sweep at ``sweep_batches``; BF16 and FP8 linears' default configs beside."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(11)
    dt = torch.bfloat16
    for fmt in formats:
        for name, n, k, glu in kernel_cases(hidden, intermediate, qkv):
            mats = 2 if glu else 1
            w = [(torch.randn(n, k, generator=gen, device=device) / k**0.5).to(dt) for _ in range(mats)]
            lins = []
            for j in range(mats):
                t = {f"p.{s}": v for s, v in quantize_linear(fmt, w[j], 5.0 * (1.01 if j else 1), gen).items()}
                if fmt in QUANT_FORMATS:
                    lins.append(Linear(t, "p", dt, device, fmt, GROUP))
                else:
                    lins.append(Linear(t, "p", dt, device, "none" if fmt == "bf16" else fmt, None))
            del w
            quant = fmt in QUANT_FORMATS
            if quant:
                qs = [quant_linear.QuantWeight.of(lin) for lin in lins]
                per_call = sum(q.nbytes() for q in qs)
            else:
                per_call = sum(lin.weight.numel() * lin.weight.element_size() for lin in lins)
            copies = max(2, -(-4 * l2_bytes // per_call)) if device.type == "cuda" else 1
            if quant:
                sets = [qs] + [[dataclasses.replace(q, weight=q.weight.clone(), scales=q.scales.clone()) for q in qs]
                               for _ in range(copies - 1)]
            else:
                sets = [[lin.weight for lin in lins]] + [[lin.weight.clone() for lin in lins]
                                                         for _ in range(copies - 1)]
            for m in batches:
                x = (torch.randn(m, k, generator=gen, device=device) * 2).to(dt)
                refs = [reference_input(lin, x) @ lin._dequantize().t() if quant else None for lin in lins]
                if quant and glu:
                    want = F.silu(refs[0].to(dt).float()).to(dt).float() * refs[1].to(dt).float()
                elif quant:
                    want = refs[0]
                if quant:
                    configs = _sweep(qs[0], m, sm, glu, m in sweep_batches and (deadline is None or
                                                                                  time.perf_counter() < deadline))
                else:
                    configs = [linear.pick_config(m, n, k, lins[0].weight.element_size(), sm, glu=glu)]
                if not quant:  # FP8 linears take their input quantized by the producer
                    xin = x if fmt == "bf16" else (x.float() * lins[0].a_inv).to(torch.float8_e4m3fn)
                    scale = None if fmt == "bf16" else (lins[0].a_scale * lins[0].w_scale).reshape(1)
                if quant and any(c.gemv for c in configs):  # the GEMV's input as its producer prepares it
                    prepared = [quant_gemv.launch_input(x, q, dt) for q in qs]
                    counters = torch.zeros(4096, dtype=torch.int32, device=device)  # a split GLU's row tiles
                    workspace = torch.empty(8 * 2 * n, device=device)  # a split GLU's fc and gate (<= 8 splits)
                results, regs = {}, {}
                for cfg in configs:
                    key = (cfg.block_n, cfg.block_k, cfg.splits, cfg.num_warps, cfg.num_stages, cfg.gemv, cfg.tma)
                    try:
                        if glu:
                            out = torch.empty(m, n, device=device, dtype=dt)
                        elif cfg.gemv:  # the splits added into int64 accumulators, as in the step
                            out = fixed_sum.accumulator(m, n, device=device)
                        else:
                            out = torch.empty(cfg.splits, m, n, device=device)

                        if quant and cfg.ws and quant_gemv_ws.TILED_WEIGHTS:  # as the decode step lays them
                            cfg_sets = [[quant_gemv_ws.tile_weights(q, cfg.block_n // 2) for q in qs_] for qs_ in sets]
                        else:
                            cfg_sets = sets

                        def call(s=0, cfg=cfg, out=out, cfg_sets=cfg_sets):
                            ws = cfg_sets[s % copies]
                            xq = prepared[0] if cfg.gemv else x
                            if quant and glu:
                                gemv = ({"x2": prepared[1], "counters": counters, "workspace": workspace}
                                        if cfg.gemv else {})
                                return quant_linear.quant_glu(xq, ws[0], ws[1], out, cfg, dt, pdl=device.type == "cuda",
                                                              **gemv)
                            elif quant:
                                return quant_linear.quant_partials(xq, ws[0], out, cfg, dt, pdl=device.type == "cuda")
                            else:
                                if glu:
                                    linear.glu(xin, ws[0], ws[1], scale, None, out, cfg, dt, pdl=device.type == "cuda")
                                else:
                                    linear.linear_partials(xin, ws[0], scale, out, cfg, pdl=device.type == "cuda")
                        handle = call()
                        if hasattr(handle, "n_regs"):  # registers per thread and spills of the compiled kernel
                            regs[key] = (handle.n_regs, handle.n_spills)
                        summed = fixed_sum.to_float(out) if cfg.gemv and not glu else out.sum(0)
                        err = rel(out.float() if glu else summed, want) if quant else None
                        it = iter(range(10**9))
                        us = time_fn(lambda: call(next(it)), copies * 2) if time_fn else float("nan")
                        results[key] = (us, err)
                    except Exception as exc:  # a config that does not compile is a finding, not a stop
                        results[key] = (float("inf"), repr(exc)[:300])
                first = configs[0]
                base = (first.block_n, first.block_k, first.splits, first.num_warps, first.num_stages, first.gemv,
                        first.tma)
                best = min(results, key=lambda c: results[c][0])
                row = {"format": fmt, "linear": name, "n": n, "k": k, "m": m, "matrices": mats,
                       "weight_bytes": per_call,
                       "default_config": base, "default_us": results[base][0], "default_err": results[base][1],
                       "best_config": best, "best_us": results[best][0], "best_err": results[best][1],
                       "sweep": {str(c): v for c, v in results.items()},
                       "registers_spills": {str(c): v for c, v in regs.items()}}
                if first.gemv:  # the dot kernel the GEMV replaced, at its own default tiles
                    dot = configs[1]
                    row["dot_us"] = results[(dot.block_n, dot.block_k, dot.splits, dot.num_warps, dot.num_stages,
                                             False, False)][0]
                    # the fastest correct GEMV configs, for the step variants "best" and "best-tma"
                    cfgs = {(c.block_n, c.block_k, c.splits, c.num_warps, c.num_stages, c.gemv, c.tma): c
                            for c in configs}
                    ok = {c: v for c, v in results.items() if cfgs[c].gemv and isinstance(v[1], float) and v[1] < 1e-2}
                    for variant, keep in (("best", lambda c: True), ("best-tma", lambda c: cfgs[c].tma)):
                        fast = [c for c in ok if keep(c)]
                        if fast:
                            SWEEP_BEST.setdefault(variant, {})[(n, k, glu)] = cfgs[min(fast, key=lambda c: ok[c][0])]
                for key in ("default_us", "best_us"):
                    us = row[key]
                    row[key.replace("_us", "_gbps")] = per_call / us / 1e3 if us and us == us and us > 0 else None
                rows.append(row)
                log(f"quant kernel {fmt:8} {name:5} m={m:<3} {per_call / 1e6:7.1f} MB  default {base} "
                    f"{row['default_us']:8.1f} us ({row['default_gbps'] or 0:6.0f} GB/s, err {row['default_err']})  "
                    f"{'dot %.1f us  ' % row['dot_us'] if 'dot_us' in row else ''}regs {regs.get(base)}  "
                    f"best {best} {row['best_us']:8.1f} us ({row['best_gbps'] or 0:6.0f} GB/s)")
            del sets, lins
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------- step


def check_step(graphs: DecodeGraphs, engine: Qwen2Engine, prompt_len: int = 64, steps: int = 16) -> dict:
    """Fast path against the eager (dequantized) model on the same weights and cache: step-0 logits and
    greedy tokens, one row."""
    dev = engine.cache_k.device
    gen = torch.Generator(device=dev).manual_seed(1)
    prompt = torch.randint(0, engine.lm_head.shape[0], (1, prompt_len), device=dev, generator=gen)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    h = engine.forward_slots(prompt, zero, zero, prompt_len)
    first = int(engine.logits(h[:, -1]).argmax(-1))
    snap_k, snap_v = engine.cache_k[:, : 1 + engine.slot_blocks].clone(), engine.cache_v[:, : 1 + engine.slot_blocks].clone()
    eager, eager0 = [first], None
    for s in range(steps):
        tok = torch.tensor([[eager[-1]]], device=dev)
        lg = engine.logits(engine.forward_slots(tok, zero, torch.tensor([prompt_len + s], device=dev))[:, -1]).float()
        eager0 = lg.clone() if s == 0 else eager0
        eager.append(int(lg.argmax(-1)))
    engine.cache_k[:, : 1 + engine.slot_blocks], engine.cache_v[:, : 1 + engine.slot_blocks] = snap_k, snap_v
    fast, fast0, argmax_ok = [first], None, 0
    for s in range(steps):
        lg = graphs.decode([fast[-1]], graphs.step.engine.slot_tables([0]), [prompt_len + s])
        fast0 = lg.clone() if s == 0 else fast0
        fast.append(int(graphs.greedy(1)[0]))
        argmax_ok += fast[-1] == int(lg.argmax(-1))  # the step's greedy token is its logits' argmax
    same = sum(a == b for a, b in zip(eager[1:], fast[1:]))
    return {"greedy_is_logits_argmax": f"{argmax_ok}/{steps}",
            "step0_rel_err_fast_vs_eager": rel(fast0, eager0),
            "step0_argmax_equal": bool(fast0.argmax() == eager0.argmax()),
            "greedy_tokens_equal": f"{same}/{steps}",
            "first_divergent_step": next((i for i, (a, b) in enumerate(zip(eager[1:], fast[1:])) if a != b), steps)}


def time_step(graphs: DecodeGraphs, ctx: int, steps: int) -> tuple[float, float]:
    """(ms per step as the runtime runs it: input copy, replay, token read back; ms per graph replay)."""
    tokens = [1]
    for w in range(3):
        graphs.decode(tokens, graphs.step.engine.slot_tables([0]), [ctx + w])
    torch.cuda.synchronize()
    wall0 = time.perf_counter()
    for s in range(steps):
        graphs.decode(tokens, graphs.step.engine.slot_tables([0]), [ctx + s])
        tokens = graphs.greedy(1).tolist()
    wall = (time.perf_counter() - wall0) / steps * 1000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        a.record()
        for _ in range(10):
            graphs.graphs[1].replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 10)
    return wall, statistics.median(times)


def kernel_breakdown(engine: Qwen2Engine, replays: int = 5) -> dict:
    """Microseconds per step by kernel name, from the profiler's trace of graph replays of the step captured
    without programmatic dependent launch: under PDL a kernel starts while its predecessor runs and waits,
    so its traced time would include the wait. Without PDL the kernels do not overlap (the replay is slower
    by the launch gaps PDL hides; its time is returned beside)."""
    from torch.profiler import ProfilerActivity, profile

    graphs = DecodeGraphs(DecodeStep(engine, pdl=False), [1])
    graphs.prepare()
    graphs.graphs[1].replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graphs.graphs[1].replay()
        torch.cuda.synchronize()
    times: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    events = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda ev: ev.time_range.start)
    gemvs = 0
    for ev in events:
        name = ev.name[:40]
        if name == "_int4_gemv_kernel":  # a layer launches its GEMVs in this order: each by its linear
            name += "/" + ("qkv", "dense", "glu", "proj")[gemvs % 4]
            gemvs += 1
        times[name] += ev.time_range.elapsed_us() / replays
        calls[name] += 1
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        graphs.graphs[1].replay()
    b.record()
    b.synchronize()
    return {"replay_ms_without_pdl": a.elapsed_time(b) / 10,
            "us_per_step": {k: [round(v, 1), calls[k] // replays]
                            for k, v in sorted(times.items(), key=lambda kv: -kv[1])}}


# the kernel sweep's fastest GEMV config per (N, K, glu), by variant: "best" of all, "best-tma" of the
# copy-engine ones (kernel_rows fills it; the step's variants of the same name take them)
SWEEP_BEST: dict[str, dict[tuple[int, int, bool], linear.LinearConfig]] = {}


def _with_configs(configs: dict[tuple[int, int, bool], linear.LinearConfig], pick):
    """quant_linear.pick_config over ``pick``, with ``configs`` by (N, K, glu) for the GEMVs they name."""
    def pick_variant(q, m, sm_count, *, glu=False, **kw):
        cfg = pick(q, m, sm_count, glu=glu, **kw)
        return configs.get((q.n, q.k, glu), cfg) if cfg.gemv else cfg
    return pick_variant


# the whole-step variants' parts by name (variant_rows), and by prefix
VARIANT_PARTS = ("default", "argmax:torch", "nofold", "partials", "sum:last", "nopdl", "tma", "late", "tiled",
                 "untiled", "scales32", "nocarveout", "dot", "regs", "glu32", "glu32p")
VARIANT_PREFIXES = ("skip:", "attn:", "norm", "combine", "early:", "carveout:", "splits/")


def _known_part(part: str) -> bool:
    return (part in VARIANT_PARTS or part.startswith(VARIANT_PREFIXES) or part in SWEEP_BEST
            or part.split(":")[0] in LINEAR_KEYS)


def _gemv_variant(name: str):
    """A replacement for quant_linear.pick_config: the batch-1 INT4 step with other tiles or split counts,
    timed whole (split-K trades kernel time against the reduction in the next kernel, which the per-kernel
    timings do not see)."""
    pick = quant_linear.pick_config

    def pick_variant(q, m, sm_count, *, glu=False, **kw):
        cfg = pick(q, m, sm_count, glu=glu, **kw)
        if not cfg.gemv:
            return cfg
        if name == "dot":  # the tensor-core kernels the GEMV replaced
            return pick(q, m, sm_count, glu=glu, gemv=False)
        if name == "regs":  # the GEMV loading its weights straight to registers (before run 45)
            return quant_gemv.pick_config(q, sm_count, glu=glu, tma=False)
        if name.startswith("splits/"):
            return dataclasses.replace(cfg, splits=max(1, cfg.splits // int(name.split("/")[1])))
        if name == "glu32" and glu:  # twice the rows per program (run 21: 49.6 us against 42.7)
            return quant_gemv.pick_config(q, sm_count, glu=True, block_n=32)
        if name == "glu32p" and glu:  # 32 rows, the next tile prefetched
            return dataclasses.replace(quant_gemv.pick_config(q, sm_count, glu=True, block_n=32), num_stages=2)
        return cfg
    return pick_variant


# the whole-step variants timed beside the default (INT4_VARIANTS in the environment: comma-separated)
INT4_VARIANTS = tuple(os.environ.get("INT4_VARIANTS", "tma,late,regs,nocarveout,nopdl").split(","))
# a GEMV's config by linear in a variant: "<linear>:<block_n>/<block_k>/<splits>/<warps>/<stages>", copy-engine
# tiles unless "/r" ends it (registers), warp-specialized with "/w" (the 7B's shapes)
LINEAR_KEYS = {name: (n, k, glu) for name, n, k, glu in kernel_cases(3584, 18944, 4608)}


class _NoLaunch:
    """A kernel left out of a variant's graph (``kernel[grid](...)`` launches nothing)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@triton.jit
def _empty_kernel(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


class _EmptyLaunch:
    """A kernel replaced by one that does nothing on the same grid (PDL's wait and trigger kept): against
    "skip" it separates what a launch costs in the chain from what its work costs."""

    def __getitem__(self, grid):
        return lambda *args, launch_pdl=False, **kwargs: _empty_kernel[grid](PDL=launch_pdl, launch_pdl=launch_pdl)


def _attention_option(option: str) -> list[tuple[object, str, object]]:
    """A patch of attention's launch for variant "attn:<option>"; returns what undoes it."""
    if option == "nokvpre":  # no L2 prefetch of the cached keys and values before the PDL wait
        undo = [(attention, "PREFETCH_KV", attention.PREFETCH_KV)]
        attention.PREFETCH_KV = False
        return undo
    if option.startswith("splits"):
        undo = [(attention, "pick_splits", attention.pick_splits)]
        attention.pick_splits = lambda *args, n=int(option[6:]), **kwargs: n
        return undo
    attr = {"warps": "ATTENTION_WARPS", "stages": "ATTENTION_STAGES", "tile": "BLOCK_T"}[option.rstrip("0123456789")]
    undo = [(attention, attr, getattr(attention, attr))]
    setattr(attention, attr, int(option[len(option.rstrip("0123456789")):]))
    return undo


def _skip(what: str) -> list[tuple[object, str, object]]:
    """Patches that leave ``what``'s launches out of the step (variant "skip:<what>"): the step's time without
    them bounds what fusing them away can gain. Its numbers are wrong by design; only its time is read.
    Returns (module, attribute, original) to undo."""
    def gemv_skipping(original, test):
        return lambda x, q, *args, **kwargs: None if test(q) else original(x, q, *args, **kwargs)

    targets = {
        "norm": (norm, "residual_rmsnorm", lambda f: lambda *a, **k: None),
        "attention": (attention, "_decode_attention_kernel", lambda f: _NoLaunch()),
        "combine": (attention, "_combine_kernel", lambda f: _NoLaunch()),
        "glu": (quant_linear, "quant_glu", lambda f: lambda *a, **k: None),
        "lm_head": (linear, "linear_partials", lambda f: lambda *a, **k: None),
        "qkv": (quant_linear, "quant_partials", lambda f: gemv_skipping(f, lambda q: q.n > q.k and q.n < 3 * q.k)),
        "dense": (quant_linear, "quant_partials", lambda f: gemv_skipping(f, lambda q: q.n == q.k)),
        "proj": (quant_linear, "quant_partials", lambda f: gemv_skipping(f, lambda q: q.k > 3 * q.n)),
        # the kernel on its grid, doing nothing
        "empty-attention": (attention, "_decode_attention_kernel", lambda f: _EmptyLaunch()),
        "empty-combine": (attention, "_combine_kernel", lambda f: _EmptyLaunch()),
        "empty-norm": (norm, "_residual_rmsnorm_kernel", lambda f: _EmptyLaunch()),
    }
    module, attr, make = targets[what]
    original = getattr(module, attr)
    setattr(module, attr, make(original))
    return [(module, attr, original)]


def variant_rows(graphs_for, ctx: int, steps: int, log=print, breakdown=None, reference=None) -> list[dict]:
    """Replay time of the INT4-AWQ batch-1 step under each of INT4_VARIANTS (``graphs_for(**step_options)``:
    fresh graphs over ``DecodeStep(engine, **step_options)``), a variant being one or more of these joined
    by "+": the GEMV loading its weights to registers (regs), Hopper's copy-engine GEMV without warp
    specialization (tma), the warp-specialized one copying its first weights after the PDL wait (late) or
    reading a tile-by-tile copy of its weights (tiled: quant_gemv_ws.tile_weights, the default; untiled: the
    checkpoint's layout) or the float32 copy of its scales (scales32: the same values), the kernel sweep's fastest
    GEMV configs (best; best-tma: of the copy-engine ones), per-linear configs ("<linear>:..."), the
    tensor-core kernels (dot),
    the driver's shared-memory carveout per kernel (nocarveout) or another one pinned (carveout:<percent>),
    the split-K partials handed to the next kernel instead of summed by the GEMV (partials) or summed by each row
    tile's last program instead of into int64 accumulators (sum:last), without PDL
    (nopdl), the first weights loaded (or fetched into L2) after the PDL wait (early:none; early:loops for
    programs of one K tile only), more warps for the residual + RMSNorm kernel (norm<warps>) and for the
    split combine (combine<warps>), or without one kind of launch (skip:<norm|attention|combine|qkv|dense|glu|
    proj|lm_head>: wrong numbers, the time that kernel adds to the step; skip:empty-<attention|combine|norm>: an
    empty kernel on its grid), attention's options (attn:nokvpre,
    attn:warps<n>, attn:stages<n>, attn:tile<n>, attn:splits<n>), the greedy token by torch.argmax (argmax:torch),
    the input RMSNorm by its own launch instead of folded into the QKV GEMV (nofold).
    The first variant also gets its kernels' times (``breakdown``), and
    with ``reference`` (token, position, the default step's logits there) each variant's logits of that
    step are compared with the default's: kernels that only sum in another order differ by rounding."""
    rows = []
    pick, warps, combine_warps = quant_linear.pick_config, norm.default_warps, attention.COMBINE_WARPS
    early, ws, ws_early = quant_gemv.EARLY_WEIGHTS, quant_gemv.WARP_SPECIALIZED, quant_gemv_ws.EARLY_WEIGHTS
    tiled, scales16 = quant_gemv_ws.TILED_WEIGHTS, quant_gemv_ws.SCALES_16BIT
    greedy_kernel, fold = decode_step.GREEDY_KERNEL, decode_step.FOLD_INPUT_NORM
    unknown = [p for name in INT4_VARIANTS for p in name.split("+") if not _known_part(p)]
    if unknown:  # (timed as the default, an unknown name would read as a measurement of something else)
        raise ValueError(f"unknown INT4_VARIANTS parts: {unknown}")
    for name in INT4_VARIANTS:
        options, overrides, undo = {}, {}, []
        for part in name.split("+"):
            if part.startswith("skip:"):
                undo += _skip(part[5:])
            elif part.startswith("attn:"):  # attention's launch: nokvpre, warps<n>, stages<n>, tile<n>, splits<n>
                undo += _attention_option(part[5:])
            elif part == "argmax:torch":
                decode_step.GREEDY_KERNEL = False
            elif part == "nofold":  # the input RMSNorm by its own launch, not folded into the QKV GEMV
                decode_step.FOLD_INPUT_NORM = False
            elif part.startswith("norm"):
                norm.default_warps = lambda hidden, w=int(part[4:]): w
            elif part.startswith("combine"):
                attention.COMBINE_WARPS = int(part[7:])
            elif part == "partials":  # every split's partials to the next kernel, as before run 34
                options["split_sum"] = "none"
            elif part == "sum:last":  # each row tile's last program sums the splits in order, as before run 95
                options["split_sum"] = "last"
            elif part == "nopdl":
                options["pdl"] = False
            elif part == "tma":  # Hopper's copy-engine GEMV of quant_gemv, not the warp-specialized one
                quant_gemv.WARP_SPECIALIZED = False
            elif part == "late":  # the warp-specialized GEMV copying its first weights after the PDL wait
                quant_gemv_ws.EARLY_WEIGHTS = False
            elif part in ("tiled", "untiled"):  # the warp-specialized GEMV reading a tile-by-tile copy of its weights
                quant_gemv_ws.TILED_WEIGHTS = part == "tiled"
            elif part == "scales32":  # ... or its scales' float32 copy (the same values, twice the bytes)
                quant_gemv_ws.SCALES_16BIT = False
            elif part.startswith("early:"):  # which GEMV programs load their first weights before the PDL wait
                quant_gemv.EARLY_WEIGHTS = part.split(":")[1]
            elif part.startswith("carveout:"):  # another carveout pinned on the layer kernels
                options["carveout"] = int(part.split(":")[1])
            elif part == "nocarveout":  # the driver's choice per kernel
                options["carveout"] = None
            elif part in SWEEP_BEST:
                quant_linear.pick_config = _with_configs(SWEEP_BEST[part], quant_linear.pick_config)
            elif part.split(":")[0] in LINEAR_KEYS:
                linear_name, spec = part.split(":")
                bn, bk, sp, w, st, *kind = spec.split("/")
                overrides[LINEAR_KEYS[linear_name]] = linear.LinearConfig(
                    1, int(bn), int(bk), int(sp), int(w), int(st), gemv=True, tma=kind != ["r"], ws=kind == ["w"])
            else:
                quant_linear.pick_config = _gemv_variant(part)
        if overrides:  # over the variant's other GEMV configs
            quant_linear.pick_config = _with_configs(overrides, quant_linear.pick_config)
        support.set_carveout(CARVEOUT_MODULES, -1)  # the last step's pinned carveout undone
        try:
            graphs = graphs_for(**options)
            wall, replay = time_step(graphs, ctx, steps)
            rows.append({"variant": name, "graph_replay_ms": replay, "ms_per_step": wall})
            if reference is not None:
                token, pos, ref = reference
                logits = graphs.decode([token], graphs.step.engine.slot_tables([0]), [pos])
                rows[-1]["logits_rel_vs_default"] = rel(logits, ref)
                rows[-1]["greedy_is_logits_argmax"] = int(graphs.greedy(1)[0]) == int(logits.argmax(-1))
            best = next((p for p in name.split("+") if p in SWEEP_BEST), None)
            if best:  # the configs it took, by (N, K, glu)
                rows[-1]["configs"] = {str(key): dataclasses.astuple(c) for key, c in SWEEP_BEST[best].items()}
            if breakdown and name == INT4_VARIANTS[0]:
                rows[-1]["kernels_without_pdl"] = breakdown()
            del graphs
        except Exception as exc:
            rows.append({"variant": name, "error": repr(exc)[:300]})
        finally:
            quant_linear.pick_config, norm.default_warps, attention.COMBINE_WARPS = pick, warps, combine_warps
            quant_gemv.EARLY_WEIGHTS, quant_gemv.WARP_SPECIALIZED, quant_gemv_ws.EARLY_WEIGHTS = early, ws, ws_early
            quant_gemv_ws.TILED_WEIGHTS, quant_gemv_ws.SCALES_16BIT = tiled, scales16
            decode_step.GREEDY_KERNEL, decode_step.FOLD_INPUT_NORM = greedy_kernel, fold
            for module, attr, original in reversed(undo):
                setattr(module, attr, original)
        log(f"quant step int4_awq variant {rows[-1]}")
    return rows


def step_rows(formats, bf16_tensors, device, *, ctx: int = 2048, steps: int = 64, bandwidth: float = 4.3e12,
              log=print) -> list[dict]:
    """The whole fast decode step at batch 1 per format, on a 7B-shaped engine quantized on the device:
    checked against the eager model first, then timed at context ``ctx`` (random cache contents).

    ``bf16_tensors``: () -> (config, tensors), fresh random BF16 checkpoint tensors on ``device``."""
    rows = []
    config, tensors = bf16_tensors()
    amax = input_amax(config, tensors, device)
    del tensors
    for fmt in formats:
        row = {"format": fmt, "batch": 1, "context": ctx}
        try:
            t0 = time.perf_counter()
            cfg, tensors = quantized_checkpoint(fmt, *bf16_tensors(), amax, device)
            engine = Qwen2Engine(cfg, tensors, device=device, max_slots=2, max_seq_len=ctx + steps + 80)
            del tensors
            step = DecodeStep(engine)
            graphs = DecodeGraphs(step, [1])
            graphs.prepare()
            row["setup_s"] = time.perf_counter() - t0
            row["fc_gate"] = "pair" if hasattr(engine.layers[0]["fc_gate"], "first") else "fused"
            row.update(check_step(graphs, engine))
            wbytes = step.weight_bytes()
            kv = engine.kv_bytes_per_token() * ctx
            row.update({"weight_bytes": wbytes, "kv_bytes": kv, "floor_ms": (wbytes + kv) / bandwidth * 1000,
                        "floor_bandwidth": bandwidth})
            if device.type == "cuda":
                engine.cache_k.normal_()
                engine.cache_v.normal_()
                wall, replay = time_step(graphs, ctx, steps)
                row.update({"ms_per_step": wall, "graph_replay_ms": replay, "tokens_per_s": 1000 / wall,
                            "achieved_gbps": (wbytes + kv) / replay / 1e6,
                            "fraction_of_floor": row["floor_ms"] / replay})
                try:
                    row["kernels_without_pdl"] = kernel_breakdown(engine)
                    log(f"quant step {fmt} without PDL: {row['kernels_without_pdl']}")
                except Exception as exc:  # the breakdown is a diagnostic; a profiler failure is not the step's
                    row["kernels_without_pdl"] = repr(exc)[:300]
                if fmt == "int4_awq":
                    def graphs_for(engine=engine, **options):
                        g = DecodeGraphs(DecodeStep(engine, **options), [1])
                        g.prepare()
                        return g
                    ref = graphs.decode([7], graphs.step.engine.slot_tables([0]), [ctx]).clone()
                    row["variants"] = variant_rows(graphs_for, ctx, steps, log, lambda: kernel_breakdown(engine),
                                                   (7, ctx, ref))
            log(f"quant step {fmt:8}: {row}")
            del graphs, step, engine
        except Exception as exc:
            import traceback

            row["error"] = traceback.format_exc()[-2000:]
            log(f"quant step {fmt} FAILED: {exc!r}")
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def table(result: dict) -> str:
    """The part's results as text: kernels (GB/s of weight bytes), then the decode steps against their floors."""
    lines = ["format   linear  m   MB      default us  GB/s   best us  GB/s   best config     max rel err"]
    for r in result.get("kernels", []):
        errs = [v[1] for v in r["sweep"].values() if isinstance(v[1], float)]
        lines.append(f"{r['format']:8} {r['linear']:6} {r['m']:<3} {r['weight_bytes'] / 1e6:7.1f} "
                     f"{r['default_us']:9.1f} {r['default_gbps'] or 0:6.0f} {r['best_us']:9.1f} "
                     f"{r['best_gbps'] or 0:6.0f}"
                     f"   {str(r['best_config']):15} {max(errs) if errs else '-'}")
    lines.append("")
    lines.append("format   GB/token  floor ms  replay ms  ms/step  of floor  fast vs eager  tokens equal")
    for r in result.get("steps", []):
        if "error" in r:
            lines.append(f"{r['format']:8} FAILED: {r['error'].splitlines()[-1]}")
            continue
        lines.append(f"{r['format']:8} {r['weight_bytes'] / 1e9:8.3f} {r['floor_ms']:9.3f} "
                     f"{r.get('graph_replay_ms', float('nan')):10.3f} {r.get('ms_per_step', float('nan')):8.3f} "
                     f"{r.get('fraction_of_floor', float('nan')):8.0%}  {r['step0_rel_err_fast_vs_eager']:13.2e}  "
                     f"{r['greedy_tokens_equal']}")
    return "\n".join(lines)
