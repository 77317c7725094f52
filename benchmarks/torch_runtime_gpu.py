"""The torch runtime on a CUDA GPU: correctness of the FP8 GEMM path, and decode latency at the 7B shape.

Run on a GPU machine (no ModelOpt or datasets needed there):

    python benchmarks/torch_runtime_gpu.py --checkpoint engines/tiny-qwen2-fp8-tp2/checkpoint --out results.json

1. Loads a real exported checkpoint (the tiny FP8 TP=2 build) on CUDA, where FP8 linears run on
   ``torch._scaled_mm`` (SM89+), and on CPU in float32 emulation; compares logits and greedy tokens.
2. Times batch-1 decode of a Qwen2 decoder with DeepSeek-R1-Distill-Qwen-7B's shape (random
   weights, the same tensors a TensorRT-LLM checkpoint holds) in bf16 and FP8, eager, after a
   prefill of --context tokens. These are torch-runtime numbers, not TensorRT-LLM's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from trtllm_pipeline.model.catalog import KNOWN_MODELS
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


def check_linears(rt: TorchRuntime) -> dict:
    """Each FP8 layer on torch._scaled_mm against the same layer emulated in float32."""
    worst = 0.0
    for layer in rt.engine.layers:
        for name in ("qkv", "dense", "fc_gate", "proj"):
            lin = layer[name]
            x = torch.randn(7, lin.weight.shape[1], device="cuda", dtype=torch.bfloat16)
            got = lin(x).float()
            xq = (x.float() * lin.a_inv).clamp(-448, 448).to(torch.float8_e4m3fn).float() * lin.a_scale
            want = xq @ (lin.weight.float() * lin.w_scale).t() + (lin.bias.float() if lin.bias is not None else 0)
            worst = max(worst, float((got - want).norm() / want.norm()))
    return {"fp8_linear_max_rel_err_scaled_mm_vs_fp32_emulation": worst}


def check_checkpoint(ckpt: Path) -> dict:
    prompt = list(range(100, 164))
    cuda = TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", max_batch_size=2, max_seq_len=1024)
    cpu = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", dtype="float32", max_batch_size=2, max_seq_len=1024)
    logits = [rt.engine.logits(rt.hidden_states(prompt)).float().cpu() for rt in (cuda, cpu)]
    params = SamplingParams(max_tokens=32, end_id=-1)
    tokens = [rt.generate([prompt], params)[0].token_ids for rt in (cuda, cpu)]
    agree = sum(a == b for a, b in zip(*tokens))
    cuda32 = TorchRuntime(ckpt, ckpt / "tokenizer", device="cuda", dtype="float32", max_batch_size=2, max_seq_len=1024)
    logits32 = cuda32.engine.logits(cuda32.hidden_states(prompt)).float().cpu()
    return {
        **check_linears(cuda),
        "logits_rel_err_cuda_fp32_vs_cpu_fp32": float((logits32 - logits[1]).norm() / logits[1].norm()),
        "describe": cuda.describe(),
        "logits_rel_err_cuda_bf16_vs_cpu_fp32": float((logits[0] - logits[1]).norm() / logits[1].norm()),
        "argmax_agreement": float((logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean()),
        "greedy_tokens_equal_prefix": next((i for i, (a, b) in enumerate(zip(*tokens)) if a != b), len(tokens[0])),
        "greedy_tokens_agree": f"{agree}/{len(tokens[0])}",
    }


def synthetic_tensors(shape, fp8: bool, device) -> tuple[dict, dict]:
    """Random tensors named and shaped as a TensorRT-LLM Qwen2 checkpoint (TP=1)."""
    h, i, hd = shape.hidden_size, shape.intermediate_size, shape.head_dim
    nq, nkv = shape.num_attention_heads, shape.num_key_value_heads
    config = {"architecture": "Qwen2ForCausalLM", "dtype": "bfloat16", "hidden_size": h, "intermediate_size": i,
              "num_hidden_layers": shape.num_hidden_layers,
              "num_attention_heads": nq, "num_key_value_heads": nkv, "head_size": hd, "vocab_size": shape.vocab_size,
              "norm_epsilon": shape.rms_norm_eps, "rotary_base": shape.rope_theta,
              "max_position_embeddings": shape.max_position_embeddings, "mapping": {"tp_size": 1, "pp_size": 1, "world_size": 1},
              "quantization": {"quant_algo": "FP8" if fp8 else None}}
    g = torch.Generator(device=device).manual_seed(0)
    bf = torch.bfloat16

    def rand(*s, scale=0.02):
        return (torch.randn(*s, generator=g, device=device, dtype=torch.float32) * scale).to(bf)

    t = {"transformer.vocab_embedding.weight": rand(shape.vocab_size, h, scale=1.0),
         "transformer.ln_f.weight": torch.ones(h, dtype=bf, device=device), "lm_head.weight": rand(shape.vocab_size, h)}
    qkv_rows = (nq + 2 * nkv) * hd
    for layer in range(shape.num_hidden_layers):
        p = f"transformer.layers.{layer}."
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=bf, device=device)
        t[p + "post_layernorm.weight"] = torch.ones(h, dtype=bf, device=device)
        t[p + "attention.qkv.bias"] = rand(qkv_rows)
        mlp_in_scale = None  # ModelOpt's export gives fc and gate one weight scale (TensorRT-LLM fuses them)
        for name, rows, cols in (("attention.qkv", qkv_rows, h), ("attention.dense", h, nq * hd), ("mlp.fc", i, h),
                                 ("mlp.gate", i, h), ("mlp.proj", h, i)):
            w = rand(rows, cols, scale=1 / cols**0.5)
            if fp8:
                scale = (w.float().abs().max() / 448).reshape(1) * 1.05
                if name in ("mlp.fc", "mlp.gate"):
                    mlp_in_scale = scale if mlp_in_scale is None else mlp_in_scale
                    scale = mlp_in_scale
                t[p + name + ".weight"] = (w.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
                t[p + name + ".weights_scaling_factor"] = scale
                t[p + name + ".activation_scaling_factor"] = torch.full((1,), 8.0 / 448, device=device)
            else:
                t[p + name + ".weight"] = w
    return config, t


def time_decode(fp8: bool, context: int, steps: int) -> dict:
    shape = KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"]
    device = torch.device("cuda")
    config, tensors = synthetic_tensors(shape, fp8, device)
    engine = Qwen2Engine(config, tensors, device=device, max_slots=1, max_seq_len=context + steps + 64)
    del tensors
    slot = torch.zeros(1, dtype=torch.long, device=device)
    prompt = torch.randint(0, shape.vocab_size, (1, context), device=device)
    engine.forward_slots(prompt, slot, torch.zeros(1, dtype=torch.long, device=device), context + steps + 64)
    token = torch.ones((1, 1), dtype=torch.long, device=device)
    key_len = context + steps + 64
    for warm in range(5):
        engine.logits(engine.forward_slots(token, slot, [context + warm], key_len)[:, -1])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(steps):
        logits = engine.logits(engine.forward_slots(token, slot, [context + step], key_len)[:, -1])
        token = logits.argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / steps * 1000
    weights = sum(x.numel() * x.element_size() for layer in engine.layers for m in layer.values()
                  if hasattr(m, "weight") for x in [m.weight])
    return {"precision": "fp8" if fp8 else "bf16", "ms_per_token": ms, "tokens_per_s": 1000 / ms,
            "linear_weight_bytes": weights, "fp8_gemm": engine.layers[0]["dense"].scaled_mm if fp8 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "checkpoint_check": check_checkpoint(args.checkpoint), "decode_7b_shape": []}
    for fp8 in (False, True):
        result["decode_7b_shape"].append(time_decode(fp8, args.context, args.steps))
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["checkpoint_check"], indent=2))
    print(f"\n{'precision':<10}{'ms/token':>10}{'tokens/s':>10}  (batch 1, context {args.context}, {args.steps} steps, eager)")
    for row in result["decode_7b_shape"]:
        print(f"{row['precision']:<10}{row['ms_per_token']:>10.2f}{row['tokens_per_s']:>10.1f}")


if __name__ == "__main__":
    main()
