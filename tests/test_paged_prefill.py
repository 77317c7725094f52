"""The paged prefill attention kernel (``cuda/paged_prefill``): through Triton's interpreter against float64 attention
and for chunk- and batch-invariance (``paged_prefill_check.py``), and compiled for sm_90 here, without a GPU."""

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


def test_paged_prefill_is_float64_attention_within_bfloat16_rounding_and_chunk_invariant():
    """Rows of lengths that fit no tile or block, after cached prefixes, over shuffled blocks whose unowned slots are
    NaN and whose tables hold far ids past each row's span: within the bound of the two bfloat16 roundings (the output
    and the softmax weights) of float64 attention over the pool's values as ``dequantize_fp8`` reads them, BF16 and
    E4M3 at scales 1 and 0.37, groups of 1, 2, 3, 4 and 7 heads, D 16 to 128. A prompt's queries are the same bits as
    one row, as two chunks cut off the tiles, packed between other rows at other blocks, as a packed later chunk, and
    through a map like a CUDA graph's (made beforehand, reordered, unused zero entries). (The interpreter's dots sum
    exact products in float64: the GPU's own invariance is the check's ``cuda`` mode's.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(TESTS / "paged_prefill_check.py")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    acc, inv = r["accuracy"], r["invariance"]
    assert len(acc) == 11 and {(a["pool"], a["scale"]) for a in acc} == {
        ("torch.bfloat16", None), ("torch.float8_e4m3fn", 1.0), ("torch.float8_e4m3fn", 0.37)}
    assert {a["heads"] // a["kv_heads"] for a in acc} == {1, 2, 3, 4, 7} and {a["d"] for a in acc} == {16, 32, 64, 128}
    assert all(a["finite"] and a["bound_ratio"] <= 1.0 and a["rel_err"] < 4e-3 for a in acc), acc
    assert len(inv) == 4 and all(i["finite"] for i in inv), inv
    for i in inv:
        assert i["chunked_equal"] == i["packed_equal"] == i["graph_map_equal"] == i["queries"], i
        assert i["second_chunk_packed_equal"] == i["second_chunk"] == i["queries"] - i["cut"], i


def _compile_for_hopper(d: int, group: int, kv_fp8: bool):
    """The kernel as ``prefill_attention`` launches it with its module's shape, compiled for sm_90 without a GPU
    (16-byte aligned pointers and strides, as the launch specializes them; the tables' row stride left free)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill

    cfg = paged_prefill.launch_config(d, group)
    fn = paged_prefill._prefill_kernel
    consts = dict(KVH=4, G=group, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BS=32,
                  COMPUTE=triton.language.bfloat16, KV_FP8=kv_fp8, KV_UNIT=False)
    cache = "*fp8e4nv" if kv_fp8 else "*bf16"
    types = {"q_ptr": "*bf16", "k_ptr": cache, "v_ptr": cache, "kv_scale_ptr": "*fp32", "tables_ptr": "*i32",
             "tiles_ptr": "*i32", "out_ptr": "*bf16", "qk_scale": "fp32"}
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n.startswith("stride")) and n != "stride_tw"}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.warps, "num_stages": cfg.stages, "enable_fp_fusion": False})


@pytest.mark.parametrize("d,group,kv_fp8", [(128, 7, False), (128, 7, True), (64, 3, False), (16, 4, True)])
def test_paged_prefill_compiles_for_hopper_without_contraction(d, group, kv_fp8):
    """The 7B's (7 heads a KV head, D 128), SmolLM2's (3, 64) and the tiny model's (4, 16) launches compile for sm_90:
    wgmma dots fed by cp.async, within an SM's shared memory; and no float32 operation left for ptxas to contract
    (every add, sub and mul rounded on its own, ``.rn``; no FMA), so a masked and an unmasked key tile score a query
    alike and its output does not depend on its chunking."""
    kernel = _compile_for_hopper(d, group, kv_fp8)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async" in ptx and kernel.metadata.shared <= 228 * 1024
    float_ops = re.findall(r"^\s*((?:add|sub|mul|fma)(?:\.\w+)*\.f32)\s", ptx, re.M)
    assert float_ops and all(".rn." in op and not op.startswith("fma") for op in float_ops), set(float_ops)
    assert ("cvt.rn.bf16x2.f32" in ptx) and (("e4m3" in ptx) == kv_fp8)


def test_paged_prefill_refuses_what_it_does_not_compute():
    """Shapes and dtypes outside the kernel's are refused with a ValueError before anything launches."""
    import torch

    from trtllm_pipeline.runtimes.torch_engine.cuda.paged_prefill import prefill_attention

    def call(q_dtype=torch.bfloat16, d=32, heads=4, kv_heads=2, bs=4, pool=torch.bfloat16, kv_scale=None):
        q = torch.zeros(3, heads, d, dtype=q_dtype)
        cache = torch.zeros(5, kv_heads, bs, d).to(pool)
        return prefill_attention(q, cache, cache, torch.ones(1, 2, dtype=torch.int32), [0], [3], scale=1.0,
                                 kv_scale=kv_scale)

    for kwargs, message in (({"d": 80}, "head_dim in"), ({"q_dtype": torch.float32}, "bfloat16 or float16"),
                            ({"bs": 6}, "power of two"), ({"heads": 5}, "query heads"),
                            ({"pool": torch.float16}, "a pool of"), ({"pool": torch.float8_e4m3fn}, "kv_scale")):
        with pytest.raises(ValueError, match=message):
            call(**kwargs)


def test_a_device_that_cannot_launch_the_kernel_is_said_once_and_cached():
    """``trial`` launches the kernel once per shape and device and returns why it could not (here: tensors without
    storage, and a head size it refuses), so an engine keeps SDPA instead of failing every later
    chunk (a GPU with less shared memory than Hopper's)."""
    import torch

    from trtllm_pipeline.runtimes.torch_engine.cuda import paged_prefill

    meta = torch.device("meta")  # (tensors without storage: no launch, compiled or interpreted, takes them)
    why = paged_prefill.trial(8, 2, 32, 16, torch.bfloat16, torch.bfloat16, meta)
    assert why and paged_prefill.trial(8, 2, 32, 16, torch.bfloat16, torch.bfloat16, meta) is why
    assert "head_dim in" in paged_prefill.trial(8, 2, 80, 16, torch.bfloat16, torch.float8_e4m3fn, meta)


def test_the_rows_switch_names_its_values(monkeypatch):
    """``TRTLLM_PIPELINE_PAGED_PREFILL``: later (default), all, none; anything else refused, naming them."""
    from trtllm_pipeline.errors import InputError
    from trtllm_pipeline.runtimes.torch_engine.switches import paged_prefill_rows

    monkeypatch.delenv("TRTLLM_PIPELINE_PAGED_PREFILL", raising=False)
    assert paged_prefill_rows() == "later"
    monkeypatch.setenv("TRTLLM_PIPELINE_PAGED_PREFILL", "all")
    assert paged_prefill_rows() == "all"
    monkeypatch.setenv("TRTLLM_PIPELINE_PAGED_PREFILL", "some")
    with pytest.raises(InputError) as err:
        paged_prefill_rows()
    assert "later, all, none" in err.value.fix
