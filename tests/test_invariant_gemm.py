"""The batch-invariant GEMM (``cuda/invariant_gemm``): through Triton's interpreter against float64 and for row
invariance (``invariant_gemm_check.py``), its launch specialized alike for every M, compiled for sm_90 here without
a GPU, and its refusals."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent


def test_invariant_gemm_is_float64_within_one_rounding_and_row_invariant():
    """BF16, FP16 and E4M3 weights (x quantized by ``quantize``, bit-identical to ``model.quantize_fp8``, or given in
    E4M3), bias and none, K and N tails, bfloat16 / float16 / float32 outputs: within the output's rounding plus the
    float32 sums' error of float64 over the same operands, at the module's launch shapes and a small many-tile one.
    Rows computed at M 1, 7, 64 and 130, placed at three offsets, as [2, 3, K] and as [K], bitwise equal to the same
    rows of one 207-row call; the same rows at half the BLOCK_K differ (the comparison sees an order change)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(TESTS / "invariant_gemm_check.py")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    quant, acc, inv = r["quantize"], r["accuracy"], r["invariance"]
    assert quant["equal"] == quant["total"] > 20000 and quant["nan_in_nan_out"], quant
    assert len(acc) == 10 and all(a["finite"] and a["bound_ratio"] <= 1.0 for a in acc), acc
    # (16-bit outputs correctly rounded but for the float32 sums of the tiles' exact sums: the interpreter's dots)
    assert all(a["max_ulp"] is None or a["max_ulp"] <= 0.51 for a in acc), acc
    assert {(a["weight"], a["x"], a["out"]) for a in acc} == {
        ("torch.bfloat16", "torch.bfloat16", "torch.bfloat16"), ("torch.float16", "torch.float16", "torch.float16"),
        ("torch.bfloat16", "torch.bfloat16", "torch.float32"),
        ("torch.float8_e4m3fn", "torch.bfloat16", "torch.bfloat16"),
        ("torch.float8_e4m3fn", "torch.float8_e4m3fn", "torch.bfloat16"),
        ("torch.float8_e4m3fn", "torch.float16", "torch.float16"),
        ("torch.float8_e4m3fn", "torch.bfloat16", "torch.float32")}
    fp8_from_compute = [a for a in acc if a["weight"] == "torch.float8_e4m3fn" and a["x"] != "torch.float8_e4m3fn"]
    assert fp8_from_compute and all(a["quantized_equal"] for a in fp8_from_compute), fp8_from_compute
    assert {a["k"] % a["config"]["block_k"] != 0 for a in acc} == {True, False}  # K tails and whole tiles
    assert len(inv) == 6 and all(i["finite"] and i["equal"] == i["total"] == 613 for i in inv), inv
    assert all(set(i["rows"]) == {"1", "7", "64", "130", "2x3", "[K]"} for i in inv)
    assert max(i["rows_differing_at_other_block_k"] for i in inv if i["out"] == "torch.float32") > 0, inv


def _args(m: int, fp8: bool, out_dtype):
    """A launch's arguments as ``gemm`` passes them: [4096, 256] x, [192, 256] weight (two column tiles)."""
    import torch
    import triton.language as tl

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    cfg = invariant_gemm.launch_config(dtype, dtype, out_dtype)
    x, w = torch.zeros(4096, 256, dtype=dtype), torch.zeros(192, 256, dtype=dtype)
    out, scale = torch.zeros(4096, 192, dtype=out_dtype), torch.ones(1)
    args = (x[:m], w, out[:m], out, scale, scale, m, 192, 256, 256, 256, 192)
    consts = dict(HAS_BIAS=False, FP8_DOT=fp8, PROMOTE=cfg.promote, EVEN_K=True,
                  OUT={torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[out_dtype], BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    return args, consts, dict(num_warps=cfg.warps, num_stages=cfg.stages, enable_fp_fusion=False)


@pytest.mark.parametrize("fp8", [False, True])
def test_invariant_gemm_launch_is_one_kernel_for_every_m(fp8):
    """The JIT's specialization of a launch (the compiled kernel's key) is the same at M 1, 7, 64, 130, 2049 and 4096:
    M is never made a constant (Triton's default for an int equal to 1) nor marked divisible by 16, so decode and
    prefill rows run the same machine code. (sm_90's backend; no GPU needed to bind.)"""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    fn = invariant_gemm._gemm_kernel
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))
    keys = []
    for m in (1, 7, 64, 130, 2049, 4096):
        args, consts, options = _args(m, fp8, torch.bfloat16)
        _, specialization, _ = binder(*args, **consts, **options)
        keys.append(specialization)
    m_index = list(inspect.signature(fn.fn).parameters).index("M")
    assert keys[0][m_index] == ("i32", None) and all(k == keys[0] for k in keys), keys


def _compile_for_hopper(fp8: bool, out_dtype, even_k: bool = True, bias: bool = True):
    """The kernel as ``gemm`` launches it with the module's launch shape, compiled for sm_90 without a GPU (16-byte
    aligned pointers, strides, N and K, as the launch specializes them; M left free, as ``do_not_specialize`` keeps
    it; the one-element scales unaligned)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    _, consts, options = _args(1, fp8, out_dtype)
    consts.update(HAS_BIAS=bias, EVEN_K=even_k)
    fn = invariant_gemm._gemm_kernel
    operand = "*fp8e4nv" if fp8 else "*bf16"
    types = {"x_ptr": operand, "w_ptr": operand, "out_ptr": "*fp32" if out_dtype == torch.float32 else "*bf16",
             "bias_ptr": "*bf16", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32"}
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr" and n not in ("M", "x_scale_ptr", "w_scale_ptr")}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


@pytest.mark.parametrize("fp8,out,even_k", [(True, "bfloat16", True), (True, "bfloat16", False),
                                            (False, "bfloat16", True), (False, "float32", True)])
def test_invariant_gemm_compiles_for_hopper(fp8, out, even_k):
    """The FP8 (128 x 128 x 128) and BF16 (128 x 128 x 64, bfloat16 and float32 logits) launches compile for sm_90:
    m64n128 wgmma dots of the expected operand type fed by cp.async, within an SM's 228 KB of shared memory, no float32
    operation left to contract (``enable_fp_fusion=False``: every add and mul ``.rn``, no FMA); FP8 with promotion (a
    K tile's first MMA starts a fresh sum: scale-d 0, the sum then added to the float32 accumulator)."""
    import torch

    kernel = _compile_for_hopper(fp8, getattr(torch, out), even_k)
    ptx = kernel.asm["ptx"]
    kind = "e4m3.e4m3" if fp8 else "bf16.bf16"
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.f32\.(\S+) \{[^}]*\}, %rd\d+, %rd\d+, (\S+),",
                      ptx)
    assert mmas and {(shape, operands) for shape, operands, _ in mmas} == {
        ("m64n128k32" if fp8 else "m64n128k16", kind)}, set(mmas)
    assert "cp.async" in ptx and kernel.metadata.shared <= 228 * 1024, kernel.metadata.shared
    float_ops = re.findall(r"^\s*((?:add|sub|mul|fma)(?:\.\w+)*\.f32)\s", ptx, re.M)
    assert float_ops and all(".rn." in op and not op.startswith("fma") for op in float_ops), set(float_ops)
    if fp8:
        assert "0" in {scale_d for _, _, scale_d in mmas}  # (each K tile's MMAs start from 0: promoted per tile)
    assert ("cvt.rn.bf16x2.f32" in ptx) == (out == "bfloat16")


def test_quantize_compiles_to_the_saturating_round_to_nearest_conversion():
    """``quantize``'s kernel for sm_90: the float32 product clamped with NaN kept (a ``.NaN`` min: the symmetric
    clamp becomes ``min.NaN.xorsign.abs``, |x| against 448 with x's sign) and converted by
    ``cvt.rn.satfinite.e4m3x2.f32`` (round to nearest even), as torch's conversion rounds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "inv_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    kernel = triton.compile(ASTSource(fn=invariant_gemm._quantize_kernel, signature=sig,
                                      constexprs={"BLOCK": invariant_gemm.QUANT_BLOCK}),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = kernel.asm["ptx"]
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and re.search(r"(min|max)\.NaN\.\S*f32", ptx), ptx[-2000:]


def test_invariant_gemm_refuses_what_it_does_not_compute(monkeypatch):
    """Dtypes, shapes and scales outside the kernel's are refused with a ValueError before anything launches; CPU
    tensors without Triton's interpreter too (the other cases as under the interpreter, which takes CPU tensors)."""
    import torch

    from trtllm_pipeline.runtimes.torch_engine.cuda.invariant_gemm import gemm, launch_config, quantize

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    w, wq = torch.zeros(32, 64, dtype=bf16), torch.zeros(32, 64, dtype=fp8)
    x, s = torch.zeros(3, 64, dtype=bf16), torch.ones(())
    cases = (
        (lambda: gemm(x, w.float(), out_dtype=bf16), "bfloat16, float16 or float8_e4m3fn weights"),
        (lambda: gemm(x.half(), w, out_dtype=bf16), "takes torch.bfloat16 input"),
        (lambda: gemm(x, w, out_dtype=torch.float64), "writes bfloat16, float16 or float32"),
        (lambda: gemm(x.float(), wq, x_scale=s, w_scale=s, out_dtype=bf16), "E4M3 weight takes"),
        (lambda: gemm(torch.zeros(3, 40, dtype=bf16), torch.zeros(32, 40, dtype=bf16), out_dtype=bf16),
         "multiple of 16"),
        (lambda: gemm(torch.zeros(3, 48, dtype=bf16), w, out_dtype=bf16), "not the weight's K"),
        (lambda: gemm(x, torch.zeros(64, 32, dtype=bf16).t(), out_dtype=bf16), "contiguous along K"),
        (lambda: gemm(x, wq, w_scale=s, out_dtype=bf16), "needs x_scale and w_scale"),
        (lambda: gemm(x, w, x_scale=s, out_dtype=bf16), "takes none"),
        (lambda: gemm(x.to(fp8), wq, x_scale=s, w_scale=s, x_inv=s, out_dtype=bf16), "E4M3 already"),
        (lambda: gemm(x, wq, x_scale=s.double(), w_scale=s, out_dtype=bf16), "one float32 element"),
        (lambda: gemm(x, wq, x_scale=torch.ones(2), w_scale=s, out_dtype=bf16), "one float32 element"),
        (lambda: gemm(x, w, bias=torch.zeros(31, dtype=bf16), out_dtype=bf16), "bias must be"),
        (lambda: gemm(x, w, out_dtype=bf16, out=torch.zeros(3, 32)), "out must be"),
        (lambda: quantize(torch.zeros(4, dtype=torch.int32), s), "quantize takes"),
        (lambda: launch_config(torch.int8, torch.int8, bf16), "weights"),
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (read per call: the kernels, compiled or not, never launch here)
    for fn, message in cases:
        with pytest.raises(ValueError, match=message):
            fn()
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="runs on CUDA"):
        gemm(x, w, out_dtype=bf16)


def test_a_device_that_cannot_launch_the_gemm_is_named_by_trial():
    """``trial`` returns why the GEMM did not launch (here: tensors without storage) instead of raising: the batch-
    invariant mode is then refused at load with that reason (a GPU with less shared memory than its tiles take)."""
    import torch

    from trtllm_pipeline.runtimes.torch_engine.cuda import invariant_gemm

    meta = torch.device("meta")
    assert invariant_gemm.trial(torch.float8_e4m3fn, torch.bfloat16, torch.bfloat16, meta)
    assert invariant_gemm.trial(torch.bfloat16, torch.bfloat16, torch.float32, meta)


def test_the_gpu_benchmark_runs_its_code_paths_on_the_cpu(tmp_path):
    """``benchmarks/invariant_gemm.py --dry-run`` (the interpreter, tiny shapes): every variant timed and compared, the
    invariant GEMM's rows the same at every M and from narrower tiles, so the GPU session's run is not its first."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "invariant_gemm.py"), "--dry-run", "-o",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["dry_run"] and not r["errors"] and r["rows"]
    ours = [e for e in r["invariance"] if e["variant"].startswith("ours")]
    assert ours and all(e["equal"] == e["total"] for e in ours)
    assert r["tile_widths"] and all(t["equal_rows"] == t["rows"] for t in r["tile_widths"])
