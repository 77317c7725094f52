"""The CUDA fast path's logic on the CPU: its kernels (through Triton's interpreter), batch buckets and
padding, the batched sampler, and chunked prefill in the scheduler. GPU speed and GPU numerics are
checked by benchmarks/gpu_fast_path.py on an H200."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.torch_engine import sampling
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

pytest.importorskip("triton")  # the test extra installs it; the kernels' module needs it to import

from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import batch_buckets, bucket_for, with_verify_buckets  # noqa: E402
from trtllm_pipeline.runtimes.torch_engine.plan import PagedBatch, decode_inputs  # noqa: E402

TESTS = Path(__file__).resolve().parent


def _checkpoint(built, name: str) -> Path:
    return built(name).engine_dir.parent / "checkpoint"


def _interpreted(ckpt: Path | None, script: str = "fast_decode_check.py", *args: str, library: bool = False,
                 parts: tuple[str, ...] = ("greedy", "ending"), env: dict[str, str] | None = None):
    """``script``'s JSON result. fast_decode_check.py: ``parts``, its optional fast-path runs (FAST_CHECK_PARTS),
    only those whose results the test asserts on (each is a few steps through the interpreter)."""
    # interpreter_site: worker processes (tensor parallel) load the interpreter's rounding fixes too
    path = [str(TESTS / "interpreter_site"), str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "FAST_CHECK_LIBRARY": "1" if library else "0",
           "FAST_CHECK_PARTS": ",".join(parts), **(env or {})}
    proc = subprocess.run([sys.executable, str(TESTS / script), *([str(ckpt)] if ckpt else []), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_fast_kernels_give_eager_greedy_tokens_bf16(built):
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), library=True)
    assert r["decode_path"].startswith("triton kernels")
    assert r["greedy_fast"] == r["greedy_eager"]
    # Large batches on cuBLAS's linears (decode_step.LIBRARY_MIN_BATCH, 2 here): eager's products exactly, the
    # attention and norm kernels around them; batch 1 keeps the kernels. Bucket 4 is past graphs.MAX_FAST_ROWS (2
    # here) and still a fast step: only the one-tile linears bound the rows (graphs.row_limit).
    assert r["library_configs"] == [True] and r["library_bucket1_kernels"] and r["library_buckets"] == [1, 2, 4]
    assert r["library_greedy"] == r["library_staggered"] == r["greedy_eager"]
    assert r["library_padding_wrote_scratch_only"]
    # The attention and norm kernels around eager's products round unlike eager's torch ops: the two paths part by
    # about as much as each is from float32 (seen: 0.0100 apart with eager 0.0087 from float32, on an AMD EPYC; under
    # 0.01 on earlier CPUs). A wrong kernel is ~1 off.
    assert r["library_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["library_vs_eager"] < 1.5 * r["eager_vs_fp32"]
    assert r["staggered_fast"] == r["staggered_eager"] == r["greedy_eager"]  # batches of changing size
    assert r["chained_steps"] > 0  # ... some of them chained on the previous step's argmax (runtime._chain)
    # A row ending on its end id mid-batch changes nothing for the others.
    assert r["ending_fast"] == r["ending_eager"] != r["greedy_eager"]
    assert r["padding_wrote_scratch_only"]
    assert r["weight_bytes_fast"] == r["weight_bytes_eager"]  # the same tensors, read once per step
    # Same rounding points as eager, other accumulation order: as close to float32 as eager is.
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.02


@pytest.mark.slow
@pytest.mark.parametrize("scale", [None, 0.02], ids=["modelopt-scales", "scale-0.02"])
def test_fast_kernels_read_and_write_an_fp8_kv_cache_as_eager_does(built, kv_scaled, scale):
    """An FP8 KV cache (quantization.kv_cache: fp8): the decode kernel stores E4M3 keys and values and attends over
    them as the eager model reads them back, in decode steps and in a prompt's rows of a fast step (written by a first
    attention pass, read by the second). ModelOpt's scales (all 1: converted without a multiply) and 0.02 (keys
    saturate, the scale is used)."""
    name = "tiny-qwen2-bf16-fp8kv-tp1"
    r = _interpreted(_checkpoint(built, name) if scale is None else kv_scaled(name, scale),
                     parts=("greedy", "prefill"))
    assert r["decode_path"].startswith("triton kernels") and r["argmax_equal"]
    assert r["greedy_fast"] == r["greedy_eager"] and r["staggered_fast"] == r["greedy_eager"]
    assert r["chained_steps"] > 0
    assert r["prefill_fast_rows"] >= 2 and r["prefill_parted_near_ties"]
    assert sum(f == e for f, e in zip(r["prefill_fast"], r["prefill_eager"])) >= 2
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwen2-bf16-fp8kv-tp1", "tiny-qwen2-fp8-tp1"], ids=["bf16", "fp8"])
def test_fp8_kv_cache_at_per_layer_scales_is_written_and_read_as_eager_does(kv_scaled, name):
    """An FP8 KV cache whose layers' scales differ from 1 and from each other (2.5, 0.005: keys and values saturate, 1,
    8: a tenth of them E4M3 subnormals): the fused prefill (cuda/prefill) writes the eager prefill's bytes, and the
    first decode step from that cache (benchmarks/model_check.py's order) stores each layer's new key and value at
    that layer's scale and reads the cache as kv_load does. What parts the two is the rounding upstream of the cache:
    with BF16 weights layer 0's new keys and values (the same projection of the same embedding) are eager's bytes;
    later layers' differ by their inputs' rounding (seen: 81-93% of bytes equal, 1.4-2.3% apart). A misapplied scale
    is far outside that: every layer given layer 0's scale put the new values 3.2 apart, cached tiles read without
    their scale 0.64. With FP8 weights each linear's input is re-quantized, so more bytes part (seen: 41-96% equal,
    up to 7%) and the step's logits sit 0.05 from eager's, as close to the float32 model as eager's are (SmolLM2's
    0.35 on an H100 is this rounding: docs/perf-notes.md, FP8 KV cache)."""
    fp8_weights = name == "tiny-qwen2-fp8-tp1"
    r = _interpreted(kv_scaled(name, [2.5, 0.005, 1.0, 8.0]), "fp8_kv_check.py")
    assert r["decode_path"].startswith("triton kernels") and not r["kv_unit_scale"]
    assert r["prefill_bytes_equal"] and r["prefill_hidden_rel"] < 1e-6 and r["prefill_saturated_keys"] > 0
    assert r["padding_wrote_scratch_only"]
    for part in ("cache_k", "cache_v"):
        new = r["new_kv"][part]
        assert max(new["rel"]) < (0.1 if fp8_weights else 0.04), new
        assert new["bytes_equal"][0] >= (0.9 if fp8_weights else 1.0), new
    assert r["argmax_equal"]
    assert r["fast_vs_eager"] < (0.08 if fp8_weights else 0.015)
    assert r["fast_vs_fp32"] < 1.25 * r["eager_vs_fp32"]
    assert sum(f == e for f, e in zip(r["greedy_fast"], r["greedy_eager"])) >= 2 and r["greedy_parted_near_ties"]


@pytest.mark.slow
def test_fast_kernels_run_the_llama_family(built):
    """No QKV bias, a tied lm_head, Llama 3.1's scaled rotary table (model/families.py): the same kernels give
    eager's tokens, as close to float32 as eager is. Short prompts prefill as rows of fast steps beside the running
    decodes (``runtime._split``), with eager's tokens too."""
    r = _interpreted(_checkpoint(built, "tiny-llama-bf16-tp1"), parts=("greedy", "prefill"))
    assert r["decode_path"].startswith("triton kernels")
    assert r["greedy_fast"] == r["greedy_eager"] and r["staggered_fast"] == r["greedy_eager"]
    assert r["prefill_fast_rows"] >= 2 and r["prefill_fast"] == r["prefill_eager"]
    assert r["weight_bytes_fast"] == r["weight_bytes_eager"]  # the tied head counted once by both
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.02


@pytest.mark.slow
def test_fast_kernels_match_eager_accuracy_fp8(built):
    # W8A8 FP8 re-quantizes every activation, so a bf16 rounding difference can move a value by one
    # FP8 step: greedy tokens may part after a few steps, but the error against the float32
    # emulation of the same checkpoint is eager's own.
    r = _interpreted(_checkpoint(built, "tiny-qwen2-fp8-tp1"), library=True, parts=())
    assert r["argmax_equal"] and r["library_argmax_equal"]
    assert r["library_configs"] == [True] and r["library_padding_wrote_scratch_only"]
    assert r["library_vs_fp32"] < 1.5 * r["eager_vs_fp32"]  # torch._scaled_mm, eager's own FP8 GEMM
    assert [len(t) for t in r["library_staggered"]] == [r["max_tokens"]] * 3
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.15
    assert r["padding_wrote_scratch_only"]
    assert [len(t) for t in r["staggered_fast"]] == [r["max_tokens"]] * 3


def test_quant_kernels_match_the_dequantized_reference():
    """Each 4/8-bit kernel (partials and GLU) against ``x @ W^T`` in float32, W dequantized as the format
    defines it and x quantized as its activation quantizer does, at M = 1, 3, 16, with N, K and split tails.
    Where the group scale multiplies a tile's dot result (group >= BLOCK_K: the 7B's) and for the FP8 / INT8
    activation formats, the kernels multiply the exact values: float32 accumulation order is the only
    difference (measured <= 1.3e-6). Where each weight is scaled first (groups smaller than a tile) the scaled
    weight is rounded to the compute dtype, as the eager model's dequantized copy is: about eager's error.
    The INT4 GEMV (M = 1) multiplies its input as int16 block floating point (gemv_input): exact against that
    input at any group size, and within 2^-15 of each 16-input block's largest value of the exact one."""
    rows = _interpreted(None, "quant_kernel_check.py")
    assert {r["fmt"] for r in rows} == {"int4_awq", "w4a8_awq", "int8_sq", "int8_wo"}
    assert {r["gemv"] for r in rows if r["fmt"] == "int4_awq" and r["m"] == 1} == {True, False}
    # The INT8 dp4a GEMV (M = 1, asked for): SmoothQuant's partials and GLU bit for bit the tensor-core kernel's;
    # weight-only exact against its input's int16 block floating point, as the INT4 GEMV is
    dp4a8 = [r for r in rows if r["dp4a8"]]
    assert sorted(r["fmt"] for r in dp4a8) == ["int8_sq"] * 3 + ["int8_wo"] * 2, dp4a8
    for r in dp4a8:
        if r["fmt"] == "int8_sq":
            assert r["equals_dot_kernel"], r
        else:
            assert r["kernel_vs_prepared"]["rel"] < 1e-6 and r["kernel"]["rel"] < 0.1 * r["eager_bf16"]["rel"], r
    for r in rows:
        exact = r["tile_scale"] or r["fmt"] in ("w4a8_awq", "int8_sq")
        bound = 5e-5 if r["dtype"] == "float16" else 1e-5
        if r["gemv"]:
            assert r["kernel_vs_prepared"]["rel"] < 1e-6, r
            assert r["reduced_equals_sum"] and r["counters_left_zero"] and r["fixed_equals_exact_sum"], r
            assert r["glu_split"]["rel"] < 1.2 * r["glu_eager_bf16"]["rel"] + 1e-5, r
            assert r["glu_split_counters_left_zero"], r
            # the input's rounding: measured 0.9-1.6e-5, a hundredth of eager's own error in bfloat16, a
            # twentieth in float16
            assert r["kernel"]["rel"] < 5e-5 and r["kernel"]["rel"] < 0.1 * r["eager_bf16"]["rel"], r
        else:
            assert r["kernel"]["rel"] < (bound if exact else 1.2 * r["eager_bf16"]["rel"]), r
        # silu(fc) * gate, rounded where eager rounds: within eager's own distance from float32
        assert r["glu"]["rel"] < 1.2 * r["glu_eager_bf16"]["rel"] + 1e-5, r


def test_quant_gemms_match_the_dequantized_reference():
    """quant_gemm's tensor-core GEMMs (decode batches and prefill) against float32 ``x @ W^T``, W dequantized as the
    format defines it, in both MMA orientations, with several row tiles, N / K tails and split K (the GLU's too).
    Tolerances by format: exact products (the INT4-AWQ group scale on a tile's dot result, W4A8's E4M3 weights x FP8
    input, SmoothQuant's int8 x int8, weight-only's per-channel scale on the sum) differ by float32 accumulation order
    only (measured <= 2.4e-7 in bfloat16; float16's 1032 + q offset cancels to 2.4e-5); where each weight is scaled
    first (groups smaller than a tile) the weight is rounded to the compute dtype as eager's copy is: within eager's own
    error. The compute-dtype outputs (``linear`` with its bias, the GLU) add one rounding: within eager's."""
    rows = _interpreted(None, "quant_gemm_check.py")
    library = [r for r in rows if "kernel" in r]  # quant_gemm.LINEAR_KERNELS: checked below
    rows = [r for r in rows if "kernel" not in r]
    assert {r["fmt"] for r in rows} == {"int4_awq", "w4a8_awq", "int8_sq", "int8_wo"}
    assert {r["swap"] for r in rows} == {True, False} and {r["exact"] for r in rows} == {True, False}
    _check_library_kernels(library)
    for r in rows:
        bound = 5e-5 if r["dtype"] == "float16" else 1e-6
        assert r["partials"]["rel"] < (bound if r["exact"] else 1.2 * r["eager_bf16"]["rel"]), r
        if "linear" in r:
            assert r["linear"]["rel"] < 1.2 * r["linear_eager_bf16"]["rel"] + 1e-5, r
        assert r["glu"]["rel"] < 1.2 * r["glu_eager_bf16"]["rel"] + 1e-5, r  # split K too: the workspace's sums
        assert r["glu_counters_left"] == 0, r  # every output tile's counter back at zero for the next launch
    assert {r["splits"] for r in rows} == {1, 2}


def _check_library_kernels(rows):
    """``linear`` through quant_gemm's library kernels (tests/quant_gemm_check.py, run above), on the CPU where
    torch._int_mm and torch._scaled_mm run too, the dequantize kernel through the interpreter. Every case within the
    GEMM tests' bound for ``linear`` (1.2 x eager's error against float32 ``x @ W^T + b``). ``int_mm``: the GEMM's
    output exactly (the same int32 sums, its epilogue). ``dequant``: INT4-AWQ and INT8 weight-only are eager's
    module exactly (its copy's values in the scratch buffer, the same F.linear), W4A8 the GEMM's E4M3 weight values
    and output; ONE scratch buffer, grown to the largest weight asked for. Where cuBLAS would refuse the shape
    (int_mm at M <= 16 or N not a multiple of 8, W4A8's torch._scaled_mm at N not a multiple of 16) the GEMM runs."""
    assert {(r["fmt"], r["ran"]) for r in rows} == {("int8_sq", "int_mm"), ("int4_awq", "dequant"), ("int8_sq", "gemm"),
                                                    ("w4a8_awq", "dequant"), ("int8_wo", "dequant"),
                                                    ("w4a8_awq", "gemm")}
    largest = 0
    for r in rows:
        assert r["linear"]["rel"] < 1.2 * r["linear_eager_bf16"]["rel"] + 1e-5, r
        assert r["dtype_out"] == f"torch.{r['dtype']}", r
        if r["ran"] == "gemm":  # the fallbacks: M 16, N 90 (int_mm), N 72 (W4A8)
            assert (r["m"] <= 16 or r["n"] % 8) if r["fmt"] == "int8_sq" else r["n"] % 16, r
            assert r["equal_gemm"], r
        elif r["ran"] == "int_mm":
            assert r["equal_gemm"], r
        else:
            assert r["weight_equal_eager_copy"] and r["weight"]["rel"] < (1e-6 if r["fmt"] == "w4a8_awq" else 5e-3), r
            if r["fmt"] == "w4a8_awq":
                assert r["vs_gemm"]["rel"] < 1e-3, r  # exact products both, float32 sums in another order
            else:
                assert r["equal_eager"], r
            largest = max(largest, r["n"] * r["k"] * (1 if r["fmt"] == "w4a8_awq" else 2))
            assert r["scratch_bytes"] == largest, r


@dataclasses.dataclass
class _TableQuant:
    """The fields of a quantized weight that the measured table's kernel choice reads (N 256, K 512)."""

    fmt: str
    group: int
    int4: bool
    n: int = 256
    k: int = 512

    @property
    def weight(self) -> torch.Tensor:  # as stored: INT4 packs two rows a byte
        return torch.zeros(self.n // 2 if self.int4 else self.n, self.k, dtype=torch.int8)

    @property
    def act(self) -> int:  # the activation quantizer: FP8 (W4A8), int8 (SmoothQuant), none
        return {"w4a8_awq": 1, "int8_sq": 2}.get(self.fmt, 0)


@pytest.mark.slow
def test_int4_gemv_for_several_rows_is_batch_ones_sums_row_by_row():
    """quant_gemv's several-row kernel (tests/gemv_rows_check.py, N 256 K 512 group 128 at M 1, 2, 3, 5, 8, 16, and
    tails): each weight tile unpacked once and applied to every row gives each row batch 1's partials bit for bit
    at the same tiles (the same integer sums, the same float32 operations in the same order), so its error is
    batch 1's: against float32 ``x @ W^T`` below 5e-5 relative (measured 2.3-5.0e-6, the input's int16 block
    floating point; eager bfloat16 ~2.2e-3), against the input as its planes hold it below 1e-6 (measured <=
    1.3e-7). The int64 accumulators hold the partials' exact sum, the last program's split sum is the split
    order's, and the GLU's act and mlp.proj's prepared rows equal batch 1's GLU kernel's row by row."""
    rows = _interpreted(None, "gemv_rows_check.py")
    assert [r["m"] for r in rows][:6] == [1, 2, 3, 5, 8, 16]
    assert {r["config"][0] for r in rows} == {1, 2, 4, 8, 16}  # BLOCK_M: M up to a power of two
    for r in rows:
        assert r["partials_equal_batch1"] and r["glu_equal_batch1"] and r.get("proj_input_equal_batch1", True), r
        assert r["kernel"]["rel"] < 5e-5 and r["kernel"]["rel"] < 0.1 * r["eager_bf16"]["rel"], r
        assert r["kernel_vs_prepared"]["rel"] < 1e-6, r
        assert r["fixed_equals_exact_sum"] and r["reduced_equals_sum"] and r["counters_left_zero"], r
        assert r["glu"]["rel"] < 1.2 * r["glu_eager_bf16"]["rel"] + 1e-5, r
        assert "proj_input" not in r or r["proj_input"]["max_abs"] == 0, r


def test_int4_gemv_takes_several_rows_only_where_the_table_or_the_switch_says(tmp_path, monkeypatch):
    """Batch 2-16 of INT4-AWQ runs the several-row GEMV only from a table row whose kernel is "gemv" for that M (at
    its measured tiles where the row has them) or under TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS; otherwise today's
    kernels. Batch 1 and M > 16 are unchanged by either."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv
    from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig

    def row(m, kernel, us, config=None):
        return {"format": "int4_awq", "n": 256, "k": 512, "glu": False, "m": m, "kernel": kernel, "us": us,
                "config": config}

    gemm = [16, 128, 128, 4, 4, 3, 1, 0]
    rows4 = [4, 128, 128, 2, 4, 1, 0, 0]
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": [row(1, "gemv", 5.0), row(2, "gemv", 6.0), row(4, "gemv", 6.5, rows4),
                                            row(8, "gemm", 9.0, gemm), row(32, "gemm", 11.0, gemm)]}))
    monkeypatch.setenv(quant_gemm.TABLE_ENV, str(path))
    monkeypatch.delenv(quant_gemv.ROWS_ENV, raising=False)
    q = _TableQuant("int4_awq", group=128, int4=True)
    two, three, eight = (quant_gemm.choose(q, m, 132) for m in (2, 3, 8))
    assert two.gemv and two.block_m == 2 and two == quant_gemv.rows_config(q, 2, 132)
    assert three == LinearConfig(4, 128, 128, 2, 4, 1, gemv=True)  # M 4's row and its measured tiles
    for m in (2, 3):  # the eager forward's GEMM at those M: its own tiles, never the GEMV's
        assert quant_gemm.pick_config(q, m, 132) == quant_gemm.default_config(q, m, 132)
    assert eight.gemm and not eight.gemv  # the table measured the GEMM faster at 8
    assert quant_gemm.choose(q, 1, 132).gemv and quant_gemm.choose(q, 1, 132).block_m == 1
    glu = quant_gemm.choose(q, 2, 132, glu=True)  # shape not measured: today's default
    assert glu == quant_gemm.default_config(q, 2, 132, glu=True)
    monkeypatch.setenv(quant_gemv.ROWS_ENV, "16")
    for m in (2, 5, 8, 16):
        for g in (False, True):
            cfg = quant_gemm.choose(q, m, 132, glu=g)
            assert cfg.gemv and cfg.block_m >= m and (cfg.splits == 1 or not g), (m, g, cfg)
    assert quant_gemm.choose(q, 32, 132).gemm and quant_gemm.choose(q, 1, 132).block_m == 1
    monkeypatch.setenv(quant_gemv.ROWS_ENV, "4")
    assert quant_gemm.choose(q, 4, 132, glu=True).gemv and not quant_gemm.choose(q, 8, 132).gemv
    monkeypatch.setenv(quant_gemv.ROWS_ENV, "32")
    with pytest.raises(InputError, match="INT4 GEMV"):  # exit 2 with the fix, not a traceback
        quant_gemm.choose(q, 2, 132)
    w8 = _TableQuant("w4a8_awq", group=128, int4=True)
    monkeypatch.setenv(quant_gemv.ROWS_ENV, "16")
    assert not quant_gemm.choose(w8, 8, 132).gemv  # INT4-AWQ (W4A16) only


def test_gemm_table_written_by_the_benchmark_picks_the_kernel_per_shape(tmp_path, monkeypatch):
    """benchmarks/quant_gemm.py's table (the fastest correct kernel per format, shape and M) as quant_gemm reads it:
    the measured M at or above the batch, the GEMV where batch 1 measured it, the dot kernel where it won, the
    defaults where the table has no shape (or no batch 1), and candidates above the error bound left out."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    from quant_gemm import table_entries

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm
    from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig

    def row(m, kernel, us, config=None, err=1e-6, glu=False):
        return {"format": "int4_awq", "n": 256, "k": 512, "glu": glu, "m": m, "kernel": kernel, "us": us,
                "error": err, "config": dataclasses.astuple(config) if config else None}

    fast = LinearConfig(16, 128, 128, 4, 4, 3, gemm=True, swap=True)
    wide = LinearConfig(128, 256, 64, 1, 8, 3, gemm=True, scale_weights=True)
    rows = [row(1, "gemv", 5.0), row(1, "gemm", 7.0, fast), row(8, "gemm", 9.0, fast), row(8, "dot", 12.0),
            row(8, "gemm", 1.0, wide, err=0.5),  # fastest but wrong: not taken
            row(32, "dot", 10.0), row(32, "gemm", 11.0, fast), row(2048, "gemm", 90.0, wide),
            row(8, "linear.py", 0.5)]  # another format's kernel: not a choice
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": table_entries(rows)}))
    monkeypatch.setenv(quant_gemm.TABLE_ENV, str(path))

    q = _TableQuant("int4_awq", group=128, int4=True)
    assert quant_gemm.measured("int4_awq", 1, 256, 512, False) == ("gemv", None)
    assert quant_gemm.choose(q, 1, 132).gemv
    assert quant_gemm.measured("int4_awq", 5, 256, 512, False) == ("gemm", fast)
    dot = quant_gemm.choose(q, 16, 132)  # M = 32's entry: the dot kernel, at its own tiles for 16 rows
    assert not dot.gemm and not dot.gemv and dot.block_m == 16
    assert quant_gemm.pick_config(q, 16, 132) == quant_gemm.default_config(q, 16, 132)  # the GEMM where dot won
    assert quant_gemm.pick_config(q, 4096, 132) == wide  # past the largest measured M
    assert quant_gemm.measured("int4_awq", 8, 256, 512, True) is None  # shape not measured: defaults
    assert quant_gemm.choose(q, 8, 132, glu=True) == quant_gemm.default_config(q, 8, 132, glu=True)
    monkeypatch.setenv(quant_gemm.TABLE_ENV, str(tmp_path / "absent.json"))
    assert quant_gemm.choose(q, 1, 132).gemv and quant_gemm.choose(q, 8, 132) == quant_gemm.default_config(q, 8, 132)


# SmolLM2-135M's linears (hidden 576, intermediate 1536, 9 + 2 x 3 heads of 64) at INT4-AWQ group 64: (name, N, K, GLU)
SMOLLM2_LINEARS = [("qkv", 960, 576, False), ("dense", 576, 576, False), ("fc+gate", 1536, 576, True),
                   ("proj", 576, 1536, False)]


def test_gemm_tiles_fit_the_h200s_shared_memory_at_smollm2_shapes():
    """The H200 refused SmolLM2's INT4-AWQ engine at load (307,200 bytes of shared memory for 232,448): the default
    decode tiles (K 128) under a scale group of 64 load a float32 scale per weight, and the GLU two of them. Every
    config the step and prefill pick now fits by ``smem_estimate``, and the measured 7B table is left as it was."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm

    limit = quant_gemm.SMEM_LIMIT_SM90
    fc = _TableQuant("int4_awq", group=64, int4=True, n=1536, k=576)
    too_big = quant_gemm.default_config(fc, 8, 132, glu=True)
    assert (too_big.block_k, too_big.num_stages) == (128, 3) and quant_gemm.smem_estimate(fc, too_big, glu=True) > limit
    fitted = quant_gemm.choose(fc, 8, 132, glu=True)
    assert fitted == dataclasses.replace(too_big, block_k=64)  # one scale group per K tile: scales per row
    for name, n, k, glu in SMOLLM2_LINEARS:
        q = _TableQuant("int4_awq", group=64, int4=True, n=n, k=k)
        for m in (2, 4, 8, 16, 40, 64, 128, 2048):
            cfg = quant_gemm.choose(q, m, 132, glu=glu) if m <= 64 else quant_gemm.pick_config(q, m, 132, glu=glu)
            assert cfg.gemm and quant_gemm.smem_estimate(q, cfg, glu=glu) <= limit, (name, m, cfg)
    group = {"int4_awq": 128, "w4a8_awq": 128}  # the 7B's; SmoothQuant and weight-only: per channel
    for (fmt, n, k, glu), rows in quant_gemm._table(str(quant_gemm.TABLE)).items():
        q = _TableQuant(fmt, group=group.get(fmt, k), int4=fmt in group, n=n, k=k)
        for cfg in [c for row in rows for c in (row[2], row[4]) if c is not None]:
            assert quant_gemm.fit(q, cfg, limit, glu=glu) == cfg, (fmt, n, k, glu, cfg)
    with pytest.raises(ValueError, match="shared memory"):
        quant_gemm.fit(fc, too_big, 1024, glu=True)
    # a launch that still asks too much names its tiles and shape (the runtime then decodes eagerly)
    import triton

    with pytest.raises(quant_gemm.SharedMemoryExceeded, match="int4_awq N 1536 K 576 group 64 at .*block_k=128"):
        with quant_gemm._tiles_named(fc, too_big):
            raise triton.runtime.errors.OutOfResources(307200, 232448, "shared memory")


def _w4_gemm_shared_bytes(cfg, group: int, glu: bool, k: int = 576, dot: bool = False) -> int:
    """Triton's shared memory for quant_gemm's INT4 GEMM (``dot``: quant_linear's dot kernel) compiled for sm_90 here,
    specialized as the launch at SmolLM2's (K ``k``) would be: 16-byte aligned pointers, N, K and strides multiples
    of 16."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_linear

    one_group = group % cfg.block_k == 0
    common = dict(GROUP=group, A8=False, HAS_PQS=True, GLU=glu, EVEN_N=True, EVEN_K=k % cfg.block_k == 0, EVEN_M=False,
                  MAGIC=0x4300, OFFSET=136.0, COMPUTE=triton.language.bfloat16, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=False)
    if dot:
        fn = quant_linear._int4_kernel
        consts = dict(common, MASKED_X=True, TILE_SCALE=one_group)
    else:
        fn = quant_gemm._w4_gemm_kernel
        consts = dict(common, HAS_BIAS=False, PARTIALS=not glu, GLU_SPLITS=cfg.splits if glu else 1,
                      ONE_GROUP=one_group, SWAP=cfg.swap, POST_SCALE=one_group and not cfg.scale_weights,
                      PTX=cfg.ptx_nibbles, X2=False)
    names = list(inspect.signature(fn.fn).parameters)
    types = {"x_ptr": "*bf16", "x2_ptr": "*bf16",
             "w_ptr": "*i8", "w2_ptr": "*i8", "pqs_ptr": "*bf16", "pqs2_ptr": "*bf16",
             "bias_ptr": "*bf16", "out_ptr": "*bf16" if glu else "*fp32", "count_ptr": "*i32"}
    sig = {n: "constexpr" if n in consts else types.get(n, "*fp32" if n.endswith("ptr") else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n.startswith("stride") or n in ("N", "K"))}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return kernel.metadata.shared


def test_gemm_shared_memory_estimate_bounds_tritons_count_for_hopper():
    """``smem_estimate`` against Triton's own count for sm_90 (compiled here, no GPU): the GLU config that failed on
    the H200 (307,200 bytes, the error's number), and the tiles chosen in its place, which fit; the same for
    quant_linear's dot kernel."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_linear

    fc = _TableQuant("int4_awq", group=64, int4=True, n=1536, k=576)
    old = quant_gemm.default_config(fc, 8, 132, glu=True)
    assert _w4_gemm_shared_bytes(old, 64, glu=True) == 307200
    new = quant_gemm.choose(fc, 8, 132, glu=True)
    shared = _w4_gemm_shared_bytes(new, 64, glu=True)
    assert shared <= quant_gemm.smem_estimate(fc, new, glu=True) <= quant_gemm.SMEM_LIMIT_SM90
    proj = _TableQuant("int4_awq", group=64, int4=True, n=576, k=1536)
    cfg = quant_gemm.choose(proj, 8, 132)
    assert _w4_gemm_shared_bytes(cfg, 64, glu=False, k=1536) <= quant_gemm.smem_estimate(proj, cfg)
    # quant_linear's dot kernel (a table's choice at some shapes) asks the same at its default tiles, and fits fitted
    dot = quant_linear.pick_config(fc, 8, 132, glu=True, gemv=False)
    assert _w4_gemm_shared_bytes(dot, 64, glu=True, dot=True) == 307200
    dot = quant_gemm.fit(fc, dot, quant_gemm.SMEM_LIMIT_SM90, glu=True)
    assert _w4_gemm_shared_bytes(dot, 64, glu=True, dot=True) <= quant_gemm.smem_estimate(fc, dot, glu=True)


def test_gemm_table_chooses_the_library_kernels_for_prefill_and_the_step_its_own(tmp_path, monkeypatch):
    """Where the benchmark measured torch._int_mm (SmoothQuant) or the dequantized weight into a library GEMM fastest,
    ``linear`` (prefill) takes it while its shape allows (else this GEMM, at the tiles the table measured for it),
    and the decode step, which launches only the project's kernels, takes the fastest of those the entry keeps."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    from quant_gemm import table_entries

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm
    from trtllm_pipeline.runtimes.torch_engine.cuda.linear import LinearConfig

    def row(fmt, m, kernel, us, config=None, n=256, k=512, err=1e-6):
        return {"format": fmt, "n": n, "k": k, "glu": False, "m": m, "kernel": kernel, "us": us, "error": err,
                "config": dataclasses.astuple(config) if config else None}

    tiles = LinearConfig(32, 64, 128, 2, 4, 3, gemm=True, swap=True)
    wide = LinearConfig(128, 128, 64, 1, 8, 4, gemm=True)
    rows = [row("int8_sq", 32, "int_mm", 3.0), row("int8_sq", 32, "gemm", 4.0, tiles), row("int8_sq", 32, "dot", 4.5),
            row("int8_sq", 64, "int_mm", 5.0), row("int8_sq", 64, "dot", 6.0), row("int8_sq", 64, "gemm", 7.0, tiles),
            row("int8_sq", 2048, "int_mm", 50.0), row("int8_sq", 2048, "gemm", 90.0, wide),
            row("int8_sq", 2048, "int_mm", 60.0, n=260), row("int8_sq", 2048, "gemm", 95.0, wide, n=260),
            row("int4_awq", 2048, "dequant", 40.0), row("int4_awq", 2048, "gemm", 80.0, wide),
            row("int4_awq", 8, "dequant", 1.0, err=0.5),  # fastest but wrong: not taken
            row("int4_awq", 8, "gemm", 9.0, tiles),
            row("w4a8_awq", 2048, "dequant", 30.0), row("w4a8_awq", 2048, "gemm", 70.0, wide)]
    entries = table_entries(rows)
    by = {(e["format"], e["n"], e["m"]): e for e in entries}
    assert by["int8_sq", 256, 32] == {"format": "int8_sq", "n": 256, "k": 512, "glu": False, "m": 32,
                                      "kernel": "int_mm", "us": 3.0, "step_kernel": "gemm", "step_us": 4.0,
                                      "step_config": [32, 64, 128, 2, 4, 3, 1, 0, 0]}
    assert by["int8_sq", 256, 64]["step_kernel"] == "dot" and "step_config" not in by["int8_sq", 256, 64]
    assert by["int4_awq", 256, 8]["kernel"] == "gemm"
    # a ninth field, PTX nibbles, since 2026-12-06; the tables before it have eight
    assert not quant_gemm._config([16, 128, 128, 1, 4, 3, 1, 1]).ptx_nibbles
    assert quant_gemm._config([16, 128, 128, 1, 4, 3, 1, 1, 1]) == LinearConfig(
        16, 128, 128, 1, 4, 3, gemm=True, swap=True, scale_weights=True, ptx_nibbles=True)
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": entries}))
    monkeypatch.setenv(quant_gemm.TABLE_ENV, str(path))

    sq = _TableQuant("int8_sq", group=512, int4=False)
    awq, w4a8 = _TableQuant("int4_awq", group=128, int4=True), _TableQuant("w4a8_awq", group=128, int4=True)
    bf16, cpu = torch.bfloat16, torch.device("cpu")
    assert quant_gemm.measured("int8_sq", 20, 256, 512, False) == ("int_mm", None)
    assert quant_gemm.measured("int8_sq", 20, 256, 512, False, step=True) == ("gemm", tiles)
    # prefill: the library kernel where it runs, else the GEMM at the tiles the table measured for it
    assert quant_gemm.linear_kernel(sq, 20, bf16, cpu) == "int_mm"
    assert quant_gemm.linear_kernel(sq, 16, bf16, cpu) == "gemm" and quant_gemm.pick_config(sq, 16, 132) == tiles
    assert quant_gemm.linear_kernel(dataclasses.replace(sq, n=260), 2048, bf16, cpu) == "gemm"  # N % 8
    assert quant_gemm.pick_config(dataclasses.replace(sq, n=260), 2048, 132) == wide
    assert quant_gemm.linear_kernel(awq, 300, bf16, cpu) == "dequant"  # M 2048's entry
    assert quant_gemm.linear_kernel(awq, 8, bf16, cpu) == "gemm"
    assert quant_gemm.linear_kernel(w4a8, 2048, bf16, cpu) == "dequant"
    assert quant_gemm.linear_kernel(w4a8, 2048, torch.float32, cpu) == "gemm"  # torch._scaled_mm: 16-bit outputs
    assert quant_gemm.linear_kernel(dataclasses.replace(w4a8, n=264), 2048, bf16, cpu) == "gemm"  # N % 16 (no entry)
    # fc and gate as one weight (their scales agree): twice the GLU matrix's rows take its entry
    assert quant_gemm.linear_kernel(dataclasses.replace(awq, n=512), 2048, bf16, cpu) == "dequant"
    assert quant_gemm.pick_config(dataclasses.replace(sq, n=520), 2048, 132) == wide
    assert quant_gemm.linear_kernel(awq, 8, bf16, cpu, "dequant") == "dequant"  # asked for: where it runs
    # the decode step: the GEMM at the entry's step tiles, or the dot kernel where that measured faster
    assert quant_gemm.choose(sq, 32, 132) == tiles and quant_gemm.choose(sq, 2048, 132) == wide
    dot = quant_gemm.choose(sq, 64, 132)
    assert not dot.gemm and not dot.gemv
    # linear() dispatches on the choice
    calls = []
    monkeypatch.setattr(quant_gemm, "int_mm_linear", lambda x, q, b, dt: calls.append(("int_mm", x.shape)) or
                        torch.zeros(x.shape[0], q.n, dtype=dt))
    monkeypatch.setattr(quant_gemm, "launch", lambda x, q, q2, out, cfg, dt, **kw: calls.append(("gemm", cfg)))
    assert quant_gemm.linear(torch.zeros(2, 20, 512, dtype=bf16), sq, None, bf16).shape == (2, 20, 256)
    quant_gemm.linear(torch.zeros(3, 512, dtype=bf16), sq, None, bf16)
    assert calls == [("int_mm", (40, 512)), ("gemm", tiles)]


def test_gemv_input_planes_are_the_block_floating_point_values():
    """The INT4 GEMV's prepared input (gemv_input, written by the standalone kernel through the interpreter):
    the byte planes and block sums rebuild ``x_int * 2^E`` exactly as ``gemv_input.reference`` defines it;
    a block whose values span less than 2^7 (bfloat16) is exact, and the others are off by at most 2^-15
    of their block's largest magnitude, zeros included."""
    r = _interpreted(None, "gemv_input_check.py")
    for case in r:
        assert case["planes_equal_reference"] and case["block_sums_equal"], case
        assert case["max_error_over_block_max"] <= 2 ** -15, case
        if case["dtype"] == "bfloat16":
            assert case["narrow_blocks_exact"], case
        assert case["wide_block_inexact"] and case["zero_block_zero"], case


def test_decode_attention_scores_the_new_token_apart_from_the_cached_tiles():
    """attention's kernel and combine through the interpreter, against float64 attention: the new token (scored
    from registers by the split that holds it) alone, opening a tile, closing one, alone in its split's last
    tile, and among two tiles per split; within the bfloat16 output's rounding, its key written to the cache. An
    E4M3 cache too, against attention over its stored values: float16 dots (attention.FP8_DOTS_F16) no further from
    float64 than bfloat16 dots (seen: 1.7e-3 against 2.2e-3; its probabilities round finer)."""
    cases = _interpreted(None, "attention_check.py")
    for case in cases:
        assert case["finite"] and case["cache_written"] and case["rel_err"] < 4e-3, case
    fp8 = {c["dots"]: c["rel_err"] for c in cases if c.get("kv") == "fp8"}
    assert fp8["f16"] <= fp8["bf16"], fp8
    single = next(c for c in cases if c.get("single_split"))  # the kernel's own store: the combine's bits
    assert single["direct_equal"] and single["quantized_nonzero"], single


def test_residual_norm_reads_the_exact_sums_and_can_write_the_residual_elsewhere():
    """The residual add + RMSNorm through the interpreter, reading a linear's int64 accumulators: the new residual
    (the sum rounded as eager rounds it) written to a second buffer, the first left as it was (the decode step's
    two residual buffers when its norms are folded into the GEMVs), the normed output the eager roundings'."""
    r = _interpreted(None, "norm_check.py")
    assert r["x_out_is_the_sum"] and r["residual_untouched"], r
    assert r["normed_max_diff"] <= r["normed_max"] * 2**-8, r


def test_greedy_token_kernel_takes_the_first_of_equal_maxima():
    """The step's argmax over the logits (greedy.py, one launch after lm_head): torch.argmax's index on every row,
    the first of two equal maxima that lie in different parts of the row, index 0 on a row of equal logits, and
    on widths whose last part is short; the counters left at zero for the next step. With a token banned on a row
    (``ban``), the argmax of the others."""
    for case in _interpreted(None, "greedy_check.py"):
        assert case["tokens"] == case["torch"] and case["counters_left_zero"], case
        assert case["tokens"][3] == 3 and case["tokens"][4] == 0, case
        # a banned token (the end id before min_tokens) skipped: the argmax of the rest, on the rows that ban one
        assert case["banned"] == case["banned_torch"] == case["argmax_torch"], case
        assert case["banned"][3] == case["width"] // 2 and case["banned"][4] == 1, case
        assert [case["banned"][i] for i in (0, 2)] == [case["tokens"][i] for i in (0, 2)], case


@pytest.mark.parametrize("kv,tree", [("bf16", False), ("fp8", False), ("fp8-scaled", False), ("bf16", True)])
def test_decode_attention_compiles_for_hopper_with_the_cache_fetched_before_the_wait(kv, tree):
    """attention's kernel compiled for sm_90 here as the decode step launches it under PDL: each program's
    cached keys and values are fetched into L2 before the PDL wait, and the tiles go from memory to shared
    memory by cp.async, in under 40 KB (patching the new key into them took 55 KB). An FP8 cache too (ModelOpt's
    unit scale, and another): the new key and value stored as E4M3; at unit scale the dots in float16. A tree
    verify step's (``tree``: each row's ancestors' keys read through its slot shifts) likewise."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trtllm_pipeline.runtimes.torch_engine.cuda import attention

    fn = attention._decode_attention_kernel
    consts = dict(H=28, KVH=4, D=128, GROUP=7, QKV_SPLITS=1, HAS_BIAS=True, SPLITS=1 if kv == "fp8" else 32,
                  BLOCK_H=16, BLOCK_T=attention.BLOCK_T, BS=32, COMPUTE=triton.language.bfloat16, PDL=True,
                  PREFETCH=True,
                  NORM_PARTS=10, NORM_BLOCK=16, FIXED=True, KV_FP8=kv != "bf16", KV_UNIT=kv == "fp8",
                  LINE=64 if kv == "bf16" else 128, LINES=2 if kv == "bf16" else 1,
                  DOT=triton.language.float16 if kv == "fp8" else triton.language.bfloat16, TREE=tree,
                  DIRECT=kv == "fp8", QUANT_OUT=True)  # (a loaded FP8 step's: one split stores its output itself)
    cache = "*bf16" if kv == "bf16" else "*fp8e4nv"
    types = {"qkv_ptr": "*i64", "bias_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "o_ptr": "*fp32",
             "lse_ptr": "*fp32", "k_cache_ptr": cache, "v_cache_ptr": cache, "kv_scale_ptr": "*fp32",
             "kv_inv_ptr": "*fp32", "pos_ptr": "*i64",
             "slot_ptr": "*i64", "bt_ptr": "*i64", "qk_scale": "fp32", "sq_ptr": "*fp32", "eps": "fp32",
             "rot_ptr": "*i64", "shift_ptr": "*i64", "out_ptr": "*fp8e4nv", "out_inv_ptr": "*fp32"}
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    # as the launch specializes them: 16-byte aligned pointers, strides multiples of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr" and (n.endswith("ptr") or n.startswith("stride")) and n != "stride_btj"}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": attention.ATTENTION_WARPS, "num_stages": attention.ATTENTION_STAGES})
    ptx = kernel.asm["ptx"]
    assert 0 <= ptx.index("prefetch.global.L2") < ptx.index("griddepcontrol.wait")
    assert "cp.async" in ptx and kernel.metadata.shared <= 40 * 1024
    assert ("cvt.rn.satfinite.e4m3x2" in ptx) == (kv != "bf16")  # the new key and value stored as E4M3
    # at unit scale the tiles go E4M3 -> float16 pairs straight into float16 dots (attention.FP8_DOTS_F16)
    assert ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx) == (kv == "fp8")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwen2-bf16-tp2", "tiny-qwen2-fp8-tp4"])
def test_fast_kernels_run_tensor_parallel_with_the_merged_models_tokens(built, name):
    """2 or 4 ranks (processes, gloo), each replaying its shard's fast step with the all-reduces after
    attention.dense and mlp.proj and the lm_head slices' gather inside it, against the merged eager model.
    BF16: the same greedy tokens, also under continuous batching (issue 15: tokens identical across TP).
    FP8 at tp 4 (the tiny model's 2 KV heads replicated over 4 ranks): every activation is re-quantized,
    so as at tp 1 tokens may part after a few steps; the first step's argmax and the error are eager's."""
    # greedy_fast is asserted on for BF16 only (FP8's tokens may part, as at tp 1)
    r = _interpreted(_checkpoint(built, name), "fast_decode_check.py", "distributed",
                     parts=("greedy",) if "bf16" in name else ())
    ranks = int(name[-1])
    assert r["world_size"] == ranks and r["decode_path"].startswith("triton kernels")
    assert f"{ranks} ranks" in r["decode_path"]
    assert r["argmax_equal"] and r["padding_wrote_scratch_only"]  # rank 0's cache: padding went to scratch
    if "bf16" in name:
        assert r["greedy_fast"] == r["greedy_eager"]
        assert r["staggered_fast"] == r["staggered_eager"] == r["greedy_eager"]
        assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.03
    else:
        assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.15
        assert [len(t) for t in r["staggered_fast"]] == [r["max_tokens"]] * 3


def _gemv_sass(args: list[str], name: str = "gemv_sass") -> dict:
    """tools/``name``.py's JSON for ``args`` (gemv_sass, attention_sass), its main run in this process (compiled
    kernels here, as the sm_90 compile test above does) rather than in a Python of its own, which spent ~3 s
    importing torch per case."""
    import contextlib
    import importlib.util
    import io

    assert os.environ.get("TRITON_INTERPRET") != "1", "the kernels must compile, not run in the interpreter"
    spec = importlib.util.spec_from_file_location(name, TESTS.parent / "tools" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out, argv = io.StringIO(), sys.argv
    sys.argv = [f"{name}.py", *args, "--json"]
    try:
        with contextlib.redirect_stdout(out):
            tool.main()
    finally:
        sys.argv = argv
    return json.loads(out.getvalue())


def test_fp8_kv_attention_tile_costs_less_issue_with_float16_dots_and_register_loads():
    """The decode attention's key loop over an E4M3 cache, compiled for sm_90 here (tools/attention_sass.py): float16
    dots convert without float32 (no F2F), and a tile loaded straight to registers comes under its bytes' cycles
    (~496 at 16.5 bytes an SM-cycle), where today's pipelined tile with bfloat16 dots is over them (issue-bound, as the
    H200's FP8 KV runs showed)."""
    today = _gemv_sass(["--kv", "fp8"], "attention_sass")
    f16 = _gemv_sass(["--kv", "fp8", "--dots", "f16"], "attention_sass")
    f16_regs = _gemv_sass(["--kv", "fp8", "--dots", "f16", "--stages", "1"], "attention_sass")
    assert today["mix"].get("F2F", 0) > 0 and f16["mix"].get("F2F", 0) == 0, (today["mix"], f16["mix"])
    assert today["loop_per_thread"] > today["byte_cycles_per_sm"] > f16_regs["loop_per_thread"], (today, f16_regs)
    assert f16["loop_per_thread"] < today["loop_per_thread"]


def test_int4_gemm_unpacks_by_ptx_and_scales_two_weights_an_instruction_for_hopper():
    """quant_gemm's INT4-AWQ GEMM at a decode batch (M 8, the 7B's GLU and proj tiles, the group scale on each weight),
    compiled for sm_90 here (tools/gemm_sass.py): with ``ptx_nibbles`` ptxas takes the unpacking PTX, the scale goes
    on two weights an instruction in the compute dtype (HADD2, HMUL2) instead of float32 FADD / FMUL a weight, and
    the K loop is at most 0.65 of the other's instructions (7.6 -> 3.5 a weight for the GLU). The GLU split K keeps
    that K loop."""
    glu = None
    for args in (["--glu", "--block-n", "128"], ["--block-n", "128"]):
        rows = _gemv_sass([*args], "gemm_sass")
        ops, ptx = (next(r for r in rows if r["ptx"] is p) for p in (False, True))
        glu = glu or ptx
        weights = ops["weights_per_thread"]
        assert ops["mix"].get("FMUL", 0) >= weights and ptx["mix"].get("FMUL", 0) == ptx["mix"].get("FADD", 0) == 0
        assert ptx["mix"].get("HMUL2", 0) >= weights / 2 and ptx["mix"].get("HADD2", 0) >= weights / 2, ptx
        assert ptx["loop_per_thread"] <= 0.65 * ops["loop_per_thread"], (ops, ptx)
        assert ptx["registers"] <= ops["registers"] + 8, (ops, ptx)
    # W4A8: nibbles straight to float32 and saturating E4M3 conversions: no clamp a weight (8.6 -> 6.0 for the GLU)
    ops, ptx = (next(r for r in _gemv_sass(["--w4a8", "--glu", "--block-n", "128"], "gemm_sass") if r["ptx"] is p)
                for p in (False, True))
    weights = ops["weights_per_thread"]
    assert ops["mix"].get("FMNMX", 0) >= weights and ptx["mix"].get("FMNMX", 0) <= weights / 8, (ops, ptx)
    assert ptx["loop_per_thread"] <= 0.75 * ops["loop_per_thread"], (ops, ptx)
    # the GLU split K: the same K loop (its partials' workspace and the last program's sum are in the epilogue)
    split = next(r for r in _gemv_sass(["--glu", "--block-n", "128", "--glu-splits", "3"], "gemm_sass") if r["ptx"])
    assert split["atomics"] == 1 and glu["atomics"] == 0, (split, glu)
    assert abs(split["loop_per_thread"] - glu["loop_per_thread"]) <= 4 and split["registers"] <= glu["registers"] + 4
    # as the decode step launches it (--scaled: the input already times its pre-quant scale, mlp.gate's read apart):
    # no scales through shared memory nor their product in the loop, fewer registers, at most 8% more instructions
    # for the second input tile (958 against 897)
    scaled = next(r for r in _gemv_sass(["--glu", "--block-n", "128", "--glu-splits", "3", "--scaled"], "gemm_sass")
                  if r["ptx"])
    assert scaled["mix"]["LDS"] < split["mix"]["LDS"], (scaled, split)
    assert scaled["mix"]["HMUL2"] < split["mix"]["HMUL2"], (scaled, split)
    assert scaled["registers"] < split["registers"] and scaled["loop_per_thread"] <= 1.08 * split["loop_per_thread"]


def test_the_ptx_nibble_unpacking_gives_each_byte_its_own_two_values():
    """The PTX of ``quant_gemm._unpack_ptx`` and ``UNPACK_PTX_F32``, executed here instruction by instruction (PRMT,
    LOP3 with its truth table, SHR: PTX ISA semantics) on every byte in every position of its register: output element
    i holds byte i's low nibble's value and then its high nibble's, as the int16 path computes them."""
    import re

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm

    def prmt(a, b, sel):
        pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
        return sum(pool[(sel >> 4 * i) & 0x7] << 8 * i for i in range(4))

    def lop3(a, b, c, lut):
        return sum(((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i
                   for i in range(32))

    def run(asm, word, outputs=4):
        regs = {f"${outputs}": word, "z": 0}
        for ins in asm.strip("{} ").split(";"):
            parts = ins.replace(",", " ").split()
            if not parts or parts[0].startswith("."):
                continue
            op, dst, *src = parts
            val = [regs[x] if x in regs else int(x, 0) for x in src]
            regs[dst] = {"mov.b32": lambda v: v[0], "prmt.b32": lambda v: prmt(*v), "shr.u32": lambda v: v[0] >> v[1],
                         "lop3.b32": lambda v: lop3(*v)}[op](val) & 0xFFFFFFFF
        return [regs[f"${i}"] for i in range(outputs)]

    for byte in range(256):  # W4A8's: the float32 bits of 2^23 + (nibble ^ 8), low nibbles $0-$3, high $4-$7
        for pos in range(4):
            word = byte << 8 * pos | 0x5A << 8 * ((pos + 1) % 4)
            out = run(quant_gemm.UNPACK_PTX_F32.value, word, outputs=8)
            assert out[pos] == 0x4B000000 | (byte & 0xF) ^ 8 and out[4 + pos] == 0x4B000000 | (byte >> 4) ^ 8
    for magic in (0x4308, 0x6408):  # INT4-AWQ's: two bytes in a register's low half (its upper half not read)
        asm = quant_gemm._unpack_ptx(magic)
        assert len(re.findall(r"prmt|lop3|shr", asm)) == 4  # 4 instructions for 4 weights
        for byte in range(256):
            for pos in range(2):
                word = byte << 8 * pos | (0xA5 if pos else 0x5A) << 8 * (1 - pos) | 0xC3E1 << 16  # a neighbour too
                halves = [(r >> 16 * h) & 0xFFFF for r in run(asm, word, outputs=2) for h in (0, 1)]
                lo, hi = halves[:2], halves[2:]
                assert lo[pos] == (byte & 0xF) ^ magic and hi[pos] == (byte >> 4) ^ magic, (magic, byte, pos)


def test_int8_gemv_compiles_for_hopper_at_a_quarter_dp4a_per_weight():
    """INT8's batch-1 GEMV (quant_gemv_int8) compiled for sm_90 on this CPU machine at the 7B's divisibility:
    SmoothQuant's K loop spends a quarter of a dp4a per weight (IDP.4A: a word of 4 weights against 4 inputs) and
    under one instruction in all; weight-only half a dp4a (its input's two byte planes) and under 2 in all; both
    load 16 bytes at a time, no spills; the GLUs (fc and gate) the same per weight, within 192 registers."""
    for fmt, idp, most in (("int8_sq", 0.25, 1.0), ("int8_wo", 0.5, 2.0)):
        for args, registers in (([], 128), (["--glu"], 192)):
            r = _gemv_sass(["--int8", fmt, "--block-n", "64", "--block-k", "256", "--stages", "3", *args])
            assert r["mix"]["IDP"] * r["threads"] / r["weights"] == idp, (fmt, r)
            assert r["mix"]["LDG"] * r["threads"] * 16 >= r["weights"], (fmt, r)  # 16-byte weight loads
            assert r["loop_per_thread"] * r["threads"] / r["weights"] < most, (fmt, r)
            assert r["local_memory_ops"] == 0 and r["registers"] <= registers, (fmt, r)


def test_int4_gemv_compiles_for_hopper_at_half_a_dp4a_per_weight():
    """The batch-1 INT4 GEMV's register-load kernels (the default below Hopper) compile for sm_90 on this CPU
    machine (Triton's own ptxas), and per weight the K loop spends half an integer dot-product instruction
    (IDP.4A: a word of 4 weights against the input's high and low byte planes) and about a quarter of a LOP3
    (mask and XOR fused: a word's 4 nibbles of one row), under 2.5 instructions per weight in all (the float32
    kernel it replaced: 5.2-8.3), loads straight to registers: the GLU's loop and its 40 registers (H200:
    40-48), and proj's prefetching loop."""
    cases = {"glu": (["--glu", "--block-n", "16", "--block-k", "256", "--no-tile-scale", "--splits", "1"], 0.3, 48),
             "proj": (["--block-n", "128", "--block-k", "128", "--stages", "2"], 0.35, 128)}
    for name, (args, lop3, registers) in cases.items():
        r = _gemv_sass(args)
        per_weight = {op: r["mix"].get(op, 0) * r["threads"] / r["weights"] for op in ("IDP", "LOP3", "FFMA", "FADD")}
        assert per_weight["IDP"] == 0.5, (name, r)
        assert 0.25 <= per_weight["LOP3"] <= lop3 and per_weight["FADD"] == 0, (name, r)
        assert r["loop_per_thread"] * r["threads"] / r["weights"] < 2.5, (name, r)
        assert "LDGSTS" not in r["mix"], (name, r)  # no cp.async through shared memory
        assert r["registers"] <= registers, (name, r)


def test_int4_gemv_for_several_rows_compiles_for_hopper_unpacking_each_weight_once():
    """quant_gemv's several-row kernel (batch 2-16) compiled for sm_90 here: per weight its K loop spends half an
    integer dot-product instruction per input row (the unpacked word against each row's two byte planes) but only
    batch 1's ~0.3 LOP3 (each word unpacked once for every row), with no register spills (8 rows: ~230 registers)."""
    for rows in (2, 8):
        r = _gemv_sass(["--rows", str(rows), "--block-n", "64"])
        per_weight = {op: r["mix"].get(op, 0) * r["threads"] / r["weights"] for op in ("IDP", "LOP3")}
        assert per_weight["IDP"] == 0.5 * rows, (rows, r)
        assert per_weight["LOP3"] <= 0.35 and r["local_memory_ops"] == 0, (rows, r)


def test_int4_mma_for_several_rows_compiles_for_hopper_to_int8_tensor_core_ops():
    """quant_mma_int4 (batch 2-16 on the INT8 tensor cores) compiled for sm_90 here at its default 128 x 128 tiles: the
    K loop's dots are IMMA (mma.sync s8: 48 a thread and tile at 8 rows, 3 planes x 2 row sets x 4 chunks x 2), no
    dp4a, no byte repacking (PRMT: the int8 ops are PTX on four bytes a register), no spills, and fewer instructions
    per weight than the several-row GEMV's 8.5 at 8 rows (measured 4.85, 105 registers)."""
    r = _gemv_sass(["--mma", "8", "--block-n", "128"])
    per_weight = r["loop_per_thread"] * r["threads"] / r["weights"]
    assert r["mix"].get("IMMA") == 48 and not r["mix"].get("IDP") and not r["mix"].get("PRMT"), r
    assert per_weight < 5.5 and r["local_memory_ops"] == 0 and r["registers"] <= 128, (per_weight, r)


def test_int4_gemv_on_hopper_takes_its_tiles_from_the_copy_engine():
    """Hopper's GEMV configs at the 7B shapes, the copy-engine kernel of quant_gemv (without the warp
    specialization that is the default): weight tiles and the input's two byte planes (one box)
    by the bulk tensor copy engine (UTMALDG in the K loop, three stages: a K-tile loop of the compiler's
    pipeline), no weight load through registers (LDG) in the loop, the same half IDP.4A per weight, the odd
    rows' nibbles used in place (no shift per word: SHF <= 1 per thread and tile), and the pipeline's per-tile
    bookkeeping kept under 2.8 instructions per weight (GLU: 64 x 128 tiles of two matrices, 3.0 before the
    planes shared a box and the shift went; proj: 128 x 128) in <= 80 registers."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv

    q = _hopper_shape(18944, 3584)
    glu = quant_gemv.pick_config(q, 132, glu=True, tma=True)
    proj = quant_gemv.pick_config(_hopper_shape(3584, 18944), 132, tma=True)
    assert (glu.block_n, glu.block_k, glu.splits, glu.num_stages, glu.tma) == (64, 128, 1, 3, True)
    assert (proj.block_n, proj.block_k, proj.splits, proj.num_stages, proj.tma) == (128, 128, 14, 3, True)
    assert not quant_gemv.pick_config(q, 132, glu=True).tma  # a CPU tensor: no copy engine
    for name, cfg, extra in (("glu", glu, ["--glu"]), ("proj", proj, [])):
        r = _gemv_sass([*extra, "--tma", "--block-n", str(cfg.block_n), "--block-k", str(cfg.block_k),
                        "--splits", str(cfg.splits), "--stages", str(cfg.num_stages)])
        per_weight = {op: r["mix"].get(op, 0) * r["threads"] / r["weights"] for op in ("IDP", "LOP3", "FADD")}
        assert r["mix"].get("UTMALDG", 0) == (4 if name == "glu" else 2) and "LDG" not in r["mix"], (name, r)
        assert per_weight["IDP"] == 0.5 and per_weight["LOP3"] <= 0.3 and per_weight["FADD"] == 0, (name, r)
        assert r["mix"].get("SHF", 0) <= 1, (name, r)
        assert r["loop_per_thread"] * r["threads"] / r["weights"] < 2.8, (name, r)
        assert r["registers"] <= 80, (name, r)

def _hopper_shape(n, k):  # pick_config reads the shape, the group and the weight's device
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_linear

    return quant_linear.QuantWeight("int4_awq", torch.empty(0, dtype=torch.int8), None, 128, None, None, None, n, k)


def test_int4_gemv_on_hopper_is_warp_specialized():
    """Hopper's default INT4 GEMV (quant_gemv_ws, Gluon), compiled for sm_90 here: the same tiles and stages as
    the copy-engine kernel, one producer warp issuing every copy, so the consumers' K loop has no copy issue
    (UTMALDG), no cp.async (LDGSTS) and no global load, only shared-memory reads and the dp4a work: half an
    IDP.4A and about a quarter LOP3 per weight, under 1.6 instructions per weight in all (the copy-engine
    kernel: 2.4-2.6), in <= 80 registers and <= 32 KB of shared memory (three programs per SM in the 100 KB of
    the carveout the decode step pins for it, CARVEOUT_WS), nothing spilled; QKV's with the input norm folded in
    (its consumers making their input tiles before the loop) the same."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv

    glu = quant_gemv.pick_config(_hopper_shape(18944, 3584), 132, glu=True, tma=True)
    proj = quant_gemv.pick_config(_hopper_shape(3584, 18944), 132, tma=True)
    assert (glu.block_n, glu.splits, glu.num_stages, glu.ws) == (64, 1, 3, True)
    assert (proj.block_n, proj.splits, proj.num_stages, proj.ws) == (128, 14, 3, True)
    assert quant_gemv.carveout([glu, proj]) == quant_gemv.CARVEOUT_WS
    assert quant_gemv.carveout([dataclasses.replace(proj, ws=False)]) == quant_gemv.CARVEOUT
    qkv = quant_gemv.pick_config(_hopper_shape(4608, 3584), 132, tma=True)
    assert (qkv.block_n, qkv.splits, qkv.ws) == (128, 10, True)
    folded = ["--fold", str(-(-28 // qkv.splits))]  # the input norm folded in (gemv_input.NormFold): 3 K tiles
    for name, cfg, extra in (("glu", glu, ["--glu"]), ("proj", proj, []), ("proj, tiled weights", proj, ["--tiled"]),
                             ("qkv, the norm folded in", qkv, folded)):
        r = _gemv_sass([*extra, "--ws", "--block-n", str(cfg.block_n), "--splits", str(cfg.splits),
                        "--stages", str(cfg.num_stages)])
        assert r["local_memory_ops"] == 0, (name, r)  # nothing spilled under the 80-register cap
        per_weight = {op: r["mix"].get(op, 0) * r["threads"] / r["weights"] for op in ("IDP", "LOP3", "FADD")}
        assert not {"UTMALDG", "LDGSTS", "LDG"} & set(r["mix"]), (name, r)
        assert per_weight["IDP"] == 0.5 and per_weight["LOP3"] <= 0.26 and per_weight["FADD"] == 0, (name, r)
        assert r["loop_per_thread"] * r["threads"] / r["weights"] < 1.6, (name, r)
        assert r["registers"] <= 80 and r["shared_bytes"] <= 32 * 1024, (name, r)


def test_int4_awq_scales_are_the_checkpoints_in_the_compute_dtype():
    """INT4-AWQ's weight is its INT4 values times the checkpoint's float32 group scales rounded to the compute
    dtype, as TensorRT-LLM holds them: in the eager layer's dequantized copy and in every kernel's view
    (QuantWeight: the float32 ``scales`` and the 16-bit ``scales16`` the warp-specialized GEMV reads hold the
    same values); W4A8 keeps ModelOpt's float32 step."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_linear
    from trtllm_pipeline.runtimes.torch_engine.model import Linear, unpack_int4_rows

    gen = torch.Generator().manual_seed(0)
    n, k, group = 8, 256, 128
    t = {"p.weight": torch.randint(-128, 128, (n // 2, k), dtype=torch.int8, generator=gen),
         "p.weights_scaling_factor": (0.5 + torch.rand(n, k // group, generator=gen)) * 0.01,
         "p.prequant_scaling_factor": torch.ones(k, dtype=torch.bfloat16)}
    lin = Linear(t, "p", torch.bfloat16, torch.device("cpu"), "int4_awq", group)
    s16 = t["p.weights_scaling_factor"].to(torch.bfloat16)
    assert not torch.equal(s16.float(), t["p.weights_scaling_factor"])  # the rounding is real at these values
    want = unpack_int4_rows(t["p.weight"]).float() * s16.float().repeat_interleave(group, dim=1)
    assert torch.equal(lin.dequantized, want.to(torch.bfloat16))
    q = quant_linear.QuantWeight.of(lin)
    assert q.scales16.dtype == torch.bfloat16 and torch.equal(q.scales16.float(), q.scales)
    assert torch.equal(q.scales[0, 0], s16[0::2, 0].float()) and torch.equal(q.scales[1, 1], s16[1::2, 1].float())
    t8 = {**t, "p.weights_scaling_factor_2": torch.tensor([0.02]), "p.activation_scaling_factor": torch.tensor([0.1])}
    w4a8 = quant_linear.QuantWeight.of(Linear(t8, "p", torch.bfloat16, torch.device("cpu"), "w4a8_awq", group))
    assert w4a8.scales16 is None


def test_int4_weights_tiled_for_the_warp_specialized_gemv_are_the_same_words():
    """quant_gemv_ws.tile_weights (the decode step's layout on Hopper, TILED_WEIGHTS): row tile r's K tile t is box
    r * K/128 + t of the copy, word for word; N/2 padded with zero rows to whole tiles; the checkpoint's layout
    comes back."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_ws

    n, k, half = 200, 384, 32  # 100 packed rows: 4 row tiles, the last one 4 rows full
    gen = torch.Generator().manual_seed(0)
    q = _hopper_shape(n, k)
    q = dataclasses.replace(q, weight=torch.randint(-128, 128, (n // 2, k), dtype=torch.int8, generator=gen),
                            scales=torch.ones(k // 128, 2, n // 2))
    t = quant_gemv_ws.tile_weights(q, half)
    assert t.tile_rows == half and t.tiled.shape == (4 * 3 * half, 32) and t.weight is q.weight
    words = q.weight.view(torch.int32)
    for r, kt in ((0, 0), (2, 1), (3, 2)):
        box = t.tiled[(r * 3 + kt) * half:(r * 3 + kt + 1) * half]
        rows = words[r * half:(r + 1) * half, kt * 32:(kt + 1) * 32]
        assert torch.equal(box[: rows.shape[0]], rows) and not box[rows.shape[0]:].any()
    assert torch.equal(quant_gemv_ws.untile_weights(t.tiled, n, k, half), q.weight)
    assert t.rows(0, 100).tiled is None  # a row slice reads the checkpoint's layout again
    assert quant_gemv_ws.tile_weights(t, half) is t


@pytest.mark.slow
def test_fast_kernels_give_eager_greedy_tokens_int4_awq(built, monkeypatch, tmp_path):
    """INT4-AWQ's fast path four ways in one interpreted run (the eager and float32 references made once): today's
    kernels, then the several-row GEMV and then the INT8 MMA switched on for batch 2-4, then a table whose GLU at
    batch 2-4 splits K, each its own runtime."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv, quant_mma_int4

    monkeypatch.delenv(quant_gemv.ROWS_ENV, raising=False)
    monkeypatch.delenv(quant_mma_int4.ROWS_ENV, raising=False)
    # the tiny model's mlp.fc + mlp.gate (352 x 128, groups of 8): the GEMM's GLU at 2 K splits of 2 K tiles each
    table = tmp_path / "split_glu_table.json"
    table.write_text(json.dumps({"entries": [{"format": "int4_awq", "n": 352, "k": 128, "glu": True, "m": 4,
                                              "kernel": "gemm", "us": 1.0, "config": [16, 32, 32, 2, 4, 2, 1, 1]}]}))
    variants = {"gemv": {quant_gemv.ROWS_ENV: "16"}, "mma": {quant_gemv.ROWS_ENV: "16", quant_mma_int4.ROWS_ENV: "16"},
                "split_glu": {quant_gemm.TABLE_ENV: str(table)},
                "split_glu_folded": {quant_gemm.TABLE_ENV: str(table), "TRTLLM_PIPELINE_FOLD_PQS": "1"}}
    r = _interpreted(_checkpoint(built, "tiny-qwen2-int4-awq-tp1"), parts=("greedy",),
                     env={"FAST_CHECK_VARIANTS": json.dumps(variants)})
    # W4A16: no activation quantizer, so the kernels are as close to eager as the BF16 ones are
    assert r["decode_path"].startswith("triton kernels")
    assert r["argmax_equal"] and r["greedy_fast"] == r["greedy_eager"]
    assert r["staggered_fast"] == r["staggered_eager"] == r["greedy_eager"]
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.03
    assert r["padding_wrote_scratch_only"]
    # a step reads the packed INT4 weights (and their scales), not eager's BF16 dequantized copy
    assert r["weight_bytes_fast"] < r["weight_bytes_eager"]
    _int4_awq_steps_of_several_rows_take_the_gemv_when_switched_on(r["variants"]["gemv"])
    _int4_awq_steps_of_several_rows_take_the_int8_mma_when_switched_on(r["variants"]["mma"])
    # quant_gemm's GLU split K in whole steps (the workspace and counters of the step's buffers): eager's tokens
    split = r["variants"]["split_glu"]
    assert split["split_glu_buckets"] == [2, 4] and r["split_glu_buckets"] == [], split["split_glu_buckets"]
    assert split["argmax_equal"] and split["staggered_fast"] == split["staggered_eager"] == r["greedy_eager"]
    assert split["fast_vs_fp32"] < 1.5 * split["eager_vs_fp32"] and split["fast_vs_fp32"] < 0.03
    # TRTLLM_PIPELINE_FOLD_PQS=1 (switches.fold_pqs_enabled): the GEMMs' inputs times their pre-quant scales, made by
    # the norm before them, not in their K loops (mlp.gate's apart: its scale is not mlp.fc's in these checkpoints):
    # the same products and roundings, so the same logits to the bit as with the scales in the loops (the default)
    folded = r["variants"]["split_glu_folded"]
    assert folded["scaled_inputs"] == {"2": ["glu", "qkv"], "4": ["glu", "qkv"]}, folded["scaled_inputs"]
    assert folded["gate_input_buckets"] == [2, 4]
    for fast in (r, split):
        assert fast["scaled_inputs"] == {} and fast["gate_input_buckets"] == [], fast["scaled_inputs"]
    assert split["fast_logits_sha"] == folded["fast_logits_sha"]
    assert folded["staggered_fast"] == split["staggered_fast"]


def _int4_awq_steps_of_several_rows_take_the_gemv_when_switched_on(r: dict) -> None:
    """TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS=16: every INT4 linear of the steps at batch 2-4 runs quant_gemv's several-row
    kernel (the continuous batching part's buckets 2 and 4; its producers write each row's prepared input, its
    splits go into the int64 accumulators), through the interpreter: eager's greedy tokens, as at batch 1."""
    assert r["gemv_rows_buckets"] == [2, 4], r["gemv_rows_buckets"]
    assert r["argmax_equal"] and r["staggered_fast"] == r["staggered_eager"] == r["greedy_eager"]
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.03


def _int4_awq_steps_of_several_rows_take_the_int8_mma_when_switched_on(r: dict) -> None:
    """TRTLLM_PIPELINE_INT4_MMA_ROWS=16: the INT4 linears other than the GLU at batch 2-4 run quant_mma_int4's INT8
    tensor-core kernel on the producers' prepared rows (the GLU keeps the several-row GEMV under
    TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS), through the interpreter: eager's greedy tokens, as at batch 1."""
    assert r["mma_rows_buckets"] == [2, 4], r["mma_rows_buckets"]
    assert r["argmax_equal"] and r["staggered_fast"] == r["staggered_eager"] == r["greedy_eager"], {
        k: r.get(k) for k in ("fast_vs_fp32", "eager_vs_fp32", "greedy_eager", "staggered_fast")}
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.03


@pytest.mark.slow
def test_int4_mma_for_several_rows_is_exact_per_block(tmp_path):
    """quant_mma_int4's INT8 tensor-core linear (tests/mma_rows_check.py: N 256 K 512 group 128 at M 2, 3, 8, 16;
    K off the tiles with groups of 32 and splits; the tiny model's group of 8 at 6 and 2 rows; every block's largest
    at x_int = +-32640): the block-diagonal int8 dots' sums are exact, so the result is the several-row dp4a GEMV's
    up to float32 summation order (measured <= 1.7e-7 max relative; the bound 1e-6), against the input as its planes
    hold it as the GEMV is (<= 1e-6), against float32 ``x @ W^T`` below 5e-5 (the input's int16 rounding); the
    int64 accumulators and the last program's split sum as the GEMV's."""
    rows = _interpreted(None, "mma_rows_check.py")
    assert [r["m"] for r in rows][:4] == [2, 3, 8, 16]
    assert [r["config"][4] for r in rows][:4] == [128, 64, 32, 32]  # KC: 16 x NBC blocks a dot
    assert rows[-1]["inputs_at_32640"] > 0
    for r in rows:
        assert r["kernel_vs_gemv"]["max_rel"] < 1e-6 and r["kernel_vs_prepared"]["rel"] < 1e-6, r
        assert r["kernel"]["rel"] < 5e-5, r
        assert "eager_bf16" not in r or r["kernel"]["rel"] < 0.1 * r["eager_bf16"]["rel"], r
        assert r["fixed_equals_exact_sum"] and r["reduced_equals_sum"] and r["counters_left_zero"], r


def test_int4_mma_rows_switch_picks_it_for_2_to_n_rows_and_never_the_glu(monkeypatch):
    """quant_gemm.choose takes quant_mma_int4 only under TRTLLM_PIPELINE_INT4_MMA_ROWS=N, at batch 2..N and not for
    the GLU; unset, nothing changes (off by default); a bad value is an InputError."""
    from trtllm_pipeline.errors import InputError
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv, quant_mma_int4

    monkeypatch.delenv(quant_gemv.ROWS_ENV, raising=False)
    monkeypatch.delenv(quant_mma_int4.ROWS_ENV, raising=False)
    q = _TableQuant("int4_awq", group=128, int4=True)
    assert not any(quant_gemm.choose(q, m, 132).mma for m in (1, 2, 8, 16))
    monkeypatch.setenv(quant_mma_int4.ROWS_ENV, "8")
    picked = {m: quant_gemm.choose(q, m, 132) for m in (1, 2, 3, 8, 9, 16)}
    assert [m for m, c in picked.items() if c.mma] == [2, 3, 8]
    assert picked[3].gemv and picked[3].block_m == 4 and picked[8].block_k == 128
    assert not quant_gemm.choose(q, 8, 132, glu=True).mma
    monkeypatch.setenv(quant_mma_int4.ROWS_ENV, "17")
    with pytest.raises(InputError):
        quant_gemm.choose(q, 2, 132)


@pytest.mark.slow
def test_fast_kernels_match_eager_accuracy_int8_sq(built, monkeypatch):
    # W8A8 re-quantizes every activation to INT8 (as FP8 does to E4M3): tokens may part after a few steps. The run is
    # at the INT8 GEMV's default switch, as test_int8_batch_1_takes_the_dp4a_gemv_unless_switched_off's SmoothQuant
    # case would run it (the same checkpoint and parts): that test's checks of it are made here, on this one run.
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_int8

    monkeypatch.delenv(quant_gemv_int8.ENV, raising=False)
    r = _interpreted(_checkpoint(built, "tiny-qwen2-int8-sq-tp1"), parts=("greedy",))
    assert r["decode_path"].startswith("triton kernels")
    assert r["argmax_equal"]
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.1
    same = sum(a == b for fa, ea in zip(r["greedy_fast"], r["greedy_eager"]) for a, b in zip(fa, ea))
    # 12 of 12 before the paged cache and the M > 1 GEMMs (session 14), 9 of 12 after: one row parts at its second
    # token on this random model's near-tie (to investigate); the first token of every row and the logits' bounds hold
    assert same >= 9 and all(f[:1] == e[:1] for f, e in zip(r["greedy_fast"], r["greedy_eager"])), r
    assert r["staggered_fast"] == r["greedy_fast"] and [len(t) for t in r["staggered_fast"]] == [r["max_tokens"]] * 3
    assert r["padding_wrote_scratch_only"]
    _int8_batch_1_takes_the_dp4a_gemv(r, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8-wo"])  # (int8-sq: its run is test_fast_kernels_match_eager_accuracy_int8_sq's)
def test_int8_batch_1_takes_the_dp4a_gemv_unless_switched_off(built, monkeypatch, fmt):
    """By default (TRTLLM_PIPELINE_INT8_GEMV unset or 1) INT8 linears at batch 1 (every bucket-1 step of the continuous batching part) run
    quant_gemv_int8's dp4a GEMV: SmoothQuant's int32 sums are the tensor-core kernel's (its splits' float partials
    summed in another grouping), weight-only's input is int16 block floating point (2^-15 of a block's largest):
    the tokens of the steps without it, within the bounds above."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_int8

    monkeypatch.delenv(quant_gemv_int8.ENV, raising=False)
    r = _interpreted(_checkpoint(built, f"tiny-qwen2-{fmt}-tp1"), parts=("greedy",))
    _int8_batch_1_takes_the_dp4a_gemv(r, monkeypatch)


def _int8_batch_1_takes_the_dp4a_gemv(r: dict, monkeypatch) -> None:
    """test_int8_batch_1_takes_the_dp4a_gemv_unless_switched_off's checks of a run at the default switch."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_int8

    assert r["int8_gemv_buckets"] == [1], r["int8_gemv_buckets"]
    assert r["staggered_fast"] == r["greedy_fast"] and r["argmax_equal"]
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.1
    monkeypatch.setenv(quant_gemv_int8.ENV, "yes")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_INT8_GEMV='yes'"):
        quant_gemv_int8.enabled()
    monkeypatch.setenv(quant_gemv_int8.ENV, "0")
    assert not quant_gemv_int8.enabled()


def test_w4a8_gemv_integer_form_is_exact():
    """quant_gemv_w4a8's claim (docs/perf-notes.md, "W4A8-AWQ at batch 1"): per scale group and row, the 16 E4M3
    weights E4M3(q t), q = -8..7, are ``c_q x u`` exactly, c_q integers of at most 127 in magnitude (120: E4M3's
    largest significand x 8) and u = 2^(e - 6) for e the binade of the largest; checked over 200,000 random steps t
    from e^-14 to e^4 (subnormal to saturated) and the edges: zero, subnormals, the clamp at 448, powers of two."""
    import math

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8

    gen = torch.Generator().manual_seed(0)
    t = torch.exp(torch.rand(200_000, generator=gen, dtype=torch.float64) * 18 - 14).float()
    edges = torch.tensor([0.0, 2.0**-12, 2.0**-10, 2.0**-9, 3 * 2.0**-10, 2.0**-7, 1.0, 56.0, 57.0, 60.0, 64.0,
                          448.0, 1e4, 7 * 2.0**-9, 0.9999, 1.0001])
    t = torch.cat([t, edges])
    c, u = quant_gemv_w4a8.integer_form(t)  # (raises where the claim fails)
    v = quant_gemv_w4a8.values(t)
    assert torch.equal(c * u[:, None], v) and torch.equal(c, c.round())
    assert c.abs().max() <= 120 and torch.equal(c[:, 8], torch.zeros_like(c[:, 8]))
    powers = torch.frexp(u)[0]
    assert torch.all(powers == 0.5), "u is a power of two"
    nonzero = v.abs().amax(1) > 0
    assert torch.all(c[nonzero].abs().amax(1) >= 64) and math.isclose(float(u[-16 + 11]), 2.0**(8 - 6))  # 448: 2^8
    # the tables hold c_8 = |c_-8|, c_1 .. c_7 as bytes, byte 0 first; rows decode back to c
    lut, units = quant_gemv_w4a8.tables(t[:1024].reshape(4, 2, 128))
    b = torch.stack([(lut[:, :, w] >> (8 * i)) & 0xFF for w in range(2) for i in range(4)], -1).float()
    cc = c[:1024].reshape(4, 2, 128, 16)
    assert torch.equal(b[..., 0], -cc[..., 0]) and torch.equal(b[..., 1:], cc[..., 9:])
    assert torch.equal(units, u[:1024].reshape(4, 2, 128))


def test_w4a8_gemv_matches_the_dequantized_reference():
    """W4A8's batch-1 table-lookup GEMV (quant_gemv_w4a8) through the interpreter, for each decode linear's kind
    (qkv and dense and proj: float32 split-K partials; the GLU: silu(fc) * gate in the compute dtype), at the 7B's
    group (a table per row and K tile) and the tiny model's (8: a table per row and block), with N and K tails. The
    tables' weights are eager's dequantized W4A8 weights bit for bit. Against float32 ``x @ W^T`` (x as the FP8
    activation quantizer leaves it) the products are exact: float32 sums (<= 2e-7 here) and the int16 block floating
    point of inputs below 2^-11 of their 16-input block's largest (rounded at 2^-15 of it: 2.9e-6 in one case) are the
    only differences, so 1e-5 is the bound, ~100x under eager's own bfloat16 error (2.4-3.0e-3); against the input's
    block floating point itself, 1e-6; against quant_linear's FP8 tensor-core kernel, 1e-5. The GLU rounds fc, gate
    and silu(fc) to the compute dtype where eager does: within eager's own distance from float32."""
    rows = _interpreted(None, "w4a8_gemv_check.py")
    assert {r["kind"] for r in rows} == {"qkv", "dense", "glu", "proj"} and {r["group"] for r in rows} == {8, 128}
    for r in rows:
        assert r["tables_equal_eager_weight"], r
        if r["kind"] == "glu":
            assert r["kernel"]["rel"] < 1.2 * r["eager_bf16"]["rel"] + 1e-5, r
            assert r["vs_dot_kernel"]["rel"] < 0.5 * r["eager_bf16"]["rel"], r
        else:
            assert r["input_exact"] and r["kernel_vs_prepared"]["rel"] < 1e-6, r
            assert r["kernel"]["rel"] < 1e-5 and r["kernel"]["rel"] < 0.01 * r["eager_bf16"]["rel"], r
            assert r["vs_dot_kernel"]["rel"] < 1e-5, r


@pytest.mark.slow
def test_w4a8_batch_1_takes_the_table_gemv_unless_switched_off(built, monkeypatch):
    """TRTLLM_PIPELINE_W4A8_GEMV=1 (and unset): W4A8-AWQ linears at batch 1 (every bucket-1 step of the continuous
    batching part) run quant_gemv_w4a8's table-lookup GEMV, through the interpreter: the tokens of eager within the
    FP8-activation bounds (as SmoothQuant's: the activations are re-quantized to E4M3). 0 leaves quant_gemm's choice;
    a bad value is an InputError naming the fix."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8

    monkeypatch.setenv(quant_gemv_w4a8.ENV, "1")
    r = _interpreted(_checkpoint(built, "tiny-qwen2-w4a8-awq-tp1"), parts=("greedy",))
    assert r["decode_path"].startswith("triton kernels")
    print({k: r[k] for k in ("greedy_fast", "greedy_eager", "fast_vs_fp32", "eager_vs_fp32")})
    assert r["w4a8_gemv_buckets"] == [1], r["w4a8_gemv_buckets"]
    assert r["staggered_fast"] == r["greedy_fast"] and r["argmax_equal"]
    assert r["fast_vs_fp32"] < 1.5 * r["eager_vs_fp32"] and r["fast_vs_fp32"] < 0.1
    assert all(f[:1] == e[:1] for f, e in zip(r["greedy_fast"], r["greedy_eager"])), r
    monkeypatch.setenv(quant_gemv_w4a8.ENV, "yes")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_W4A8_GEMV='yes'"):
        quant_gemv_w4a8.enabled()
    monkeypatch.setenv(quant_gemv_w4a8.ENV, "0")
    assert not quant_gemv_w4a8.enabled()
    monkeypatch.delenv(quant_gemv_w4a8.ENV)
    assert quant_gemv_w4a8.enabled()  # on by default since an H100 timed it (5.26 -> 3.27 ms a 7B step)


def test_w4a8_gemv_compiles_for_hopper():
    """W4A8's batch-1 GEMV (quant_gemv_w4a8) compiled for sm_90 on this CPU machine at the 7B's group and
    divisibility, at pick_config's launches: qkv/dense 256 x 128 one tile a program (no prefetch), proj 128 x 128 and the GLU 64 x
    128 with the next tile prefetched into registers (``--stages 2``). Per 8 weights (a word: 4 inputs of two rows)
    4 PRMT (two tables a row), 4 dp4a (two input planes a row): half an IDP.4A a weight; the selectors 1 shift a word
    (``_selectors``: 101 -> 69 SHF a thread and tile at 256 rows); 16-byte weight loads, no spills, registers for 3
    (256 rows) or 4 (prefetched) programs an SM. Under 3 instructions a weight at 256 x 128 (the input's per-tile
    preparation, done by every program, is most of what is over the ~2 of the word work)."""
    for args, per_weight_max, regs_max in ((["--block-n", "256", "--stages", "1"], 2.9, 168),
                                           (["--block-n", "128", "--stages", "2"], 3.6, 128),
                                           (["--block-n", "64", "--glu", "--stages", "2"], 4.5, 128)):
        r = _gemv_sass(["--w4a8", "--block-k", "128", *args])
        per_weight = r["threads"] / r["weights"]
        assert r["mix"]["IDP"] * per_weight == 0.5, (args, r)
        assert r["mix"]["PRMT"] * per_weight >= 0.5, (args, r)
        assert r["mix"]["LDG"] * r["threads"] * 16 >= r["weights"] // 2, (args, r)  # 16-byte loads of the weight
        assert r["loop_per_thread"] * per_weight < per_weight_max, (args, r)
        assert r["local_memory_ops"] == 0 and r["registers"] <= regs_max, (args, r)
    r = _gemv_sass(["--w4a8", "--block-n", "256", "--block-k", "128", "--stages", "1"])
    assert r["mix"]["SHF"] * r["threads"] / r["weights"] <= 70 / 256, r  # one shift a word (+ the input's few)


def test_w4a8_gemv_on_hopper_warp_specialized_compiles_at_half_the_instructions(monkeypatch):
    """W4A8's warp-specialized batch-1 GEMV (quant_gemv_w4a8_ws, Gluon) compiled for sm_90 here at pick_config's
    launches for the 7B (qkv, proj, the GLU): the consumers' K loop reads shared memory only (no copy issue, cp.async
    or global load: the producer warp copies, and the input is made once before the loop), and per word of 8 weights
    does the table GEMV's work: 4 dp4a (half an IDP.4A a weight), 4 PRMT (plus the rows' tables), under 3.1
    instructions a weight in all (the register-load kernel's loop: 3.6 at 128 rows, 5.9 for the GLU, which prepares
    its input every tile); nothing spilled under its 128 registers; shared memory for three programs an SM (the GLU,
    128 rows: two) in the 132 KB of the carveout the decode step pins for it (CARVEOUT_WS_MADE). On unless switched
    off (``TRTLLM_PIPELINE_W4A8_WS=0``); never on a CPU."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv, quant_gemv_w4a8_ws, quant_linear

    def shape(n, k):
        return dataclasses.replace(_hopper_shape(n, k), fmt="w4a8_awq")

    qkv = quant_gemv_w4a8_ws.pick_config(shape(4608, 3584), 132)
    proj = quant_gemv_w4a8_ws.pick_config(shape(3584, 18944), 132)
    glu = quant_gemv_w4a8_ws.pick_config(shape(18944, 3584), 132, glu=True)
    assert (qkv.block_n, qkv.splits, qkv.num_stages) == (128, 6, 3) and (proj.block_n, proj.splits) == (128, 14)
    assert (glu.block_n, glu.splits, glu.num_stages) == (128, 1, 2) and all(c.ws and c.w4a8 for c in (qkv, proj, glu))
    assert quant_gemv.carveout([qkv, glu]) == quant_gemv.CARVEOUT_WS_MADE
    for name, cfg, k, extra in (("qkv", qkv, 3584, []), ("proj", proj, 18944, []), ("glu", glu, 3584, ["--glu"])):
        tiles = -(-(k // 128) // cfg.splits)
        r = _gemv_sass([*extra, "--w4a8-ws", str(tiles), "--block-n", str(cfg.block_n), "--stages",
                        str(cfg.num_stages)])
        per_weight = {op: r["mix"].get(op, 0) * r["threads"] / r["weights"] for op in ("IDP", "PRMT")}
        assert not {"UTMALDG", "LDGSTS", "LDG"} & set(r["mix"]), (name, r)
        assert per_weight["IDP"] == 0.5 and 0.5 <= per_weight["PRMT"] <= 0.7, (name, r)
        assert r["loop_per_thread"] * r["threads"] / r["weights"] < 3.1, (name, r)
        assert r["local_memory_ops"] == 0 and r["registers"] <= quant_gemv_w4a8_ws.MAX_REGISTERS, (name, r)
        assert r["shared_bytes"] <= (60 if name == "glu" else 43) * 1024, (name, r)  # 2 (3) programs in 132 KB
    monkeypatch.delenv(quant_gemv_w4a8_ws.ENV, raising=False)
    assert quant_gemv_w4a8_ws.enabled()  # on by default since an H100 timed it (3.417 -> 2.772 ms a 7B step)
    assert not quant_linear.pick_config(shape(4608, 3584), 1, 132, gemv=True).ws  # a CPU weight: the Triton kernel
    monkeypatch.setenv(quant_gemv_w4a8_ws.ENV, "on")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_W4A8_WS='on'"):
        quant_gemv_w4a8_ws.enabled()
    monkeypatch.setenv(quant_gemv_w4a8_ws.ENV, "0")
    assert not quant_gemv_w4a8_ws.enabled()


def _sass_tool():
    """tools/gemv_sass.py as a module: its sm_90 compile functions and disassembly."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gemv_sass", TESTS.parent / "tools" / "gemv_sass.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _wgmma_loop(tool, kernel, cfg, glu: bool, mma: str, registers: int, shared_kb: int) -> tuple[dict, float]:
    """A compiled wgmma kernel's K loop: its opcodes and instructions a weight (``cfg``'s tile, two matrices for the
    GLU), after checking that it issues the native ``mma``, spills nothing and fits ``registers`` and ``shared_kb``."""
    sass, regs = tool.disassemble(kernel)
    ops = tool.loop_mix(sass)  # the K loop: its conditional back branch's range with the most tensor-core ops
    assert ops[mma] > 0 and not {"HMMA", "LDL", "STL"} & set(ops), ops
    assert regs <= registers and kernel.metadata.shared <= shared_kb * 1024, (regs, kernel.metadata.shared)
    return ops, sum(ops.values()) * 128 / (cfg.block_n * 128 * (2 if glu else 1))


def _prefetched(tool, kernel) -> None:
    """A staged row kernel compiled with ``PREFETCH``: its K loop's global loads (the next tile's input rows and
    scales) come after the stage is handed back to the producer and before any fence (a fence waits for loads in
    flight), so that they are in flight during the tile's lookups and MMAs."""
    body = tool.k_loop(tool.disassemble(kernel)[0])
    loads = [i for i, line in enumerate(body) if "LDG" in line]
    handed_back = next(i for i, line in enumerate(body) if "SYNCS.ARRIVE" in line)
    fences = [i for i, line in enumerate(body) if "MEMBAR" in line or "FENCE" in line]
    assert loads and min(loads) > handed_back and not [i for i in fences if i > min(loads)], body


def test_w4a8_e4m3_lookup_tables_give_each_weight_with_the_sign_on_the_input():
    """quant_gemv_w4a8_mma's tables hold each group's E4M3 magnitudes as bytes; the kernel's two lookups (PRMT on P =
    [0, E(t) .. E(7t)] where q >= 0, on N = [E(8t), E(7t) .. E(t)] at q + 8 where q < 0, each 0 elsewhere, as
    quant_gemv_w4a8's P and N are made from the 8 stored bytes) times the input and the sign-flipped input give
    ``E4M3(q t) x`` for every nibble q: here on random steps, every q, through float32."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8, quant_gemv_w4a8_mma

    gen = torch.Generator().manual_seed(5)
    t = torch.rand(3, 2, 40, generator=gen) * 60 + 1e-3  # [G, 2, N/2] steps, from subnormal to near 448
    words = quant_gemv_w4a8_mma.tables(t)  # [G, 2, 2, N/2]
    raw = torch.stack([(words >> s) & 0xFF for s in (0, 8, 16, 24)], -1)  # [G, 2, 2, N/2, 4]
    tb = raw.permute(0, 1, 3, 2, 4).reshape(3, 2, 40, 8).to(torch.uint8)  # T = [E(8t), E(t) .. E(7t)]
    mag = tb.view(torch.float8_e4m3fn).float()
    p_tab = torch.cat([torch.zeros_like(mag[..., :1]), mag[..., 1:]], -1)  # P: T with byte 0 cleared
    n_tab = torch.cat([mag[..., :1], mag[..., 1:].flip(-1)], -1)  # N = [T0, T7 .. T1] (the kernel's two PRMT)
    want = quant_gemv_w4a8.values(t)  # E4M3(q t), q = -8..7
    x = 0.75
    for q in range(-8, 8):
        pos = p_tab[..., q] if q >= 0 else torch.zeros_like(p_tab[..., 0])  # sign bit set: replicated zero
        neg = n_tab[..., q + 8] if q < 0 else torch.zeros_like(n_tab[..., 0])
        assert torch.equal(pos * x + neg * -x, want[..., q + 8] * x), q


def test_w4a8_gemv_on_fp8_tensor_cores_compiles_for_hopper():
    """quant_gemv_w4a8_mma (each nibble looked up as its E4M3 byte, then wgmma) compiled for sm_90 here at its 7B
    launches: the tensor cores' own FP8 MMA (QGMMA; no HMMA, no F2FP: sm_90 emulates FP8 mma.sync, wgmma is the
    native one), the looked-up words reaching the operand's registers without shuffles or shared memory (the layout
    conversion asserted trivial when it compiles), a loop under 2.1 instructions a weight (the warp-specialized dp4a
    kernel's: 2.8-3.0), nothing spilled in 128 registers, shared memory for three programs an SM in 132 KB. Off unless
    ``TRTLLM_PIPELINE_W4A8_MMA=1``."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv_w4a8_mma

    def shape(n, k):
        return dataclasses.replace(_hopper_shape(n, k), fmt="w4a8_awq")

    proj = quant_gemv_w4a8_mma.pick_config(shape(3584, 18944), 132)
    glu = quant_gemv_w4a8_mma.pick_config(shape(18944, 3584), 132, glu=True)
    assert proj.lut_mma and proj.w4a8 and proj.ws and (proj.block_n, glu.block_n, glu.splits) == (128, 64, 1)
    tool = _sass_tool()
    for cfg, glu_, k in ((proj, False, 18944), (glu, True, 3584)):
        kernel = tool.compile_w4a8_mma(cfg.block_n, glu_, cfg.num_stages, -(-(k // 128) // cfg.splits))
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "QGMMA", quant_gemv_w4a8_mma.MAX_REGISTERS, 43)
        assert not {"F2FP", "STS", "SHFL"} & set(ops) and per_weight < 2.1, ops
        assert ops["PRMT"] * 128 / (cfg.block_n * 128 * (2 if glu_ else 1)) <= 0.6, ops  # 4 a word, the tables


def test_int4_rows_on_wgmma_dequantize_and_order_inputs_alike():
    """quant_rows_int4_mma's arithmetic, emulated with torch: the LOP3 of a nibble with its two constants is bfloat16
    136 + q for every q (its truth table 0x6A: mask ? a ^ c : c), less bfloat16 136 is q exactly and times a bfloat16
    scale is eager's weight (the wide form's ``_SCALED``), and the MMA input each A element multiplies (the word's pairs
    0, 2 | 1, 3 rearranged by ``_operand``) is the input ``_stage_input`` writes to B at that position."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_rows_int4_mma as m

    def lop3(a, b, c, lut):
        return sum(((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i
                   for i in range(32))

    gen = torch.Generator().manual_seed(3)
    scales = (torch.rand(64, generator=gen) * 0.3 + 1e-3).to(torch.bfloat16)
    assert "lop3.b32 t, $1, $3, $4, 0x6A" in m._SCALED.value and "mov.b32 c, 0x43084308" in m._SCALED.value
    for q in range(-8, 8):
        word = (q & 0xF) | ((q & 0xF) << 16) | 0x7A507A50  # the nibbles and unrelated bits around them
        half = lop3(word, m.NIBBLES.value, m.MAGIC.value, 0x6A) & 0xFFFF
        value = torch.tensor([half], dtype=torch.int16).view(torch.bfloat16)
        assert value.item() == 136 + q
        # the scaled form: (136 + q) - 136 in bfloat16 is q exactly, times s rounded once: eager's weight
        exact = value - torch.tensor([0x4308], dtype=torch.int16).view(torch.bfloat16)
        assert exact.item() == q and torch.equal(exact * scales, (q * scales.float()).to(torch.bfloat16))
    inputs = torch.arange(128)
    for h in range(2):  # each 64-input half of a K tile
        words = inputs[64 * h: 64 * h + 64].view(16, 4)  # word r holds inputs 4 r .. 4 r + 3
        pairs = [torch.stack([words[:, 0], words[:, 2]], -1), torch.stack([words[:, 1], words[:, 3]], -1)]  # j
        a = torch.stack(pairs, 1).view(4, 4, 2, 2)  # (c, t, j, i)
        a = a.permute(0, 2, 1, 3).reshape(64)  # MMA input 16 c + 8 j + 2 t + i (``_operand``)
        b = inputs.view(8, 4, 2, 2).permute(0, 3, 1, 2).reshape(128)  # ``_stage_input``: (c, t, i, j) -> (c, j, t, i)
        assert torch.equal(a, b[64 * h: 64 * h + 64]), h


def test_int4_rows_on_wgmma_compile_for_hopper(monkeypatch):
    """quant_rows_int4_mma (INT4-AWQ at 2-64 rows: the packed words dequantized in registers straight into bfloat16
    wgmma's A operand) compiled for sm_90 here at its 7B launches for 8 and 16 rows: native HGMMA, the words reaching
    the operand's registers without shared memory (the conversion asserted trivial when it compiles), a LOP3 and 3/4 of
    a shift a weight pair, under 2.4 (linears) and 3.2 (the GLU, two matrices and inputs) instructions a weight in the
    K loop at 8 rows (quant_gemm's GLU GEMM at M 8: 3.74, tools/gemm_sass.py), no spills in 128 registers, shared
    memory for three programs an SM in 132 KB; the wide form at 32 and 64 rows no global access in its loop, 168
    registers. Off unless ``TRTLLM_PIPELINE_INT4_WGMMA_ROWS=N``; never on a CPU."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv, quant_rows_int4_mma

    proj = quant_rows_int4_mma.pick_config(_hopper_shape(3584, 18944), 8, 132)
    glu = quant_rows_int4_mma.pick_config(_hopper_shape(18944, 3584), 16, 132, glu=True)
    assert (proj.block_m, proj.block_n, glu.block_m, glu.block_n, glu.num_stages, glu.splits) == (8, 128, 16, 128, 2, 1)
    assert proj.gemm and proj.lut_mma and not quant_gemv.int4_ws(proj)
    assert quant_gemv.carveout([proj]) == quant_gemv.CARVEOUT_WS_MADE
    assert not quant_rows_int4_mma.supported(_hopper_shape(3584, 18944), 8)  # a CPU weight
    tool = _sass_tool()
    for cfg, glu_, rows, most in ((proj, False, 8, 2.4), (glu, True, 8, 3.2), (proj, False, 16, 3.0)):
        kernel = tool.compile_int4_mma(cfg.block_n, glu_, cfg.num_stages, rows)
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "HGMMA", quant_rows_int4_mma.MAX_REGISTERS, 43)
        assert ops["LOP3"] * 128 / (cfg.block_n * 128 * (2 if glu_ else 1)) <= 0.55 and per_weight < most, ops
        assert not tool.rewritten_operands(tool.disassemble(kernel)[0]), (rows, glu_)  # (asynchronous MMAs)
    # the input one K tile ahead (TRTLLM_PIPELINE_WGMMA_PREFETCH=1; off by default, untimed)
    kernel = tool.compile_int4_mma(proj.block_n, False, proj.num_stages, 8, prefetch=True)
    assert _wgmma_loop(tool, kernel, proj, False, "HGMMA", quant_rows_int4_mma.MAX_REGISTERS, 43)[1] < 2.4
    _prefetched(tool, kernel)
    # from 17 rows the wide kernel: its input made once (``prepare``) and copied beside the weights; the consumers'
    # loop reads shared memory only. Each weight bfloat16(q s) in registers (a LOP3, a subtraction and a multiply a
    # pair), the MMAs chained on the accumulators across K: 128 output rows a program in 168 registers. The offset
    # form (``scale_weights`` False: each tile's offset, scale and sum into float32, 1.0 of the instructions a weight at
    # 64 columns) at 64 rows a program
    wide = quant_rows_int4_mma.pick_config(_hopper_shape(3584, 18944), 64, 132)
    wide_glu = quant_rows_int4_mma.pick_config(_hopper_shape(18944, 3584), 40, 132, glu=True)
    assert (wide.block_m, wide.block_n, wide.num_stages, wide_glu.block_m, wide_glu.num_stages) == (64, 128, 3, 64, 2)
    assert wide.scale_weights and wide_glu.scale_weights and not proj.scale_weights
    offset = dataclasses.replace(wide, block_n=64, scale_weights=False)
    for cfg, glu_, rows, most, shared in ((wide, False, 64, 2.7, 76), (wide_glu, True, 64, 2.5, 100),
                                          (wide, False, 32, 2.7, 52), (offset, False, 64, 3.3, 64),
                                          (dataclasses.replace(wide_glu, block_m=8, block_n=64, scale_weights=False),
                                           True, 8, 2.0, 28)):
        kernel = tool.compile_int4_mma(cfg.block_n, glu_, cfg.num_stages, rows, made=True, scaled=cfg.scale_weights)
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "HGMMA", quant_rows_int4_mma.WIDE_REGISTERS, shared)
        # (the offset form: one STS a tile, the group scales' reorder into the MMA rows' order)
        assert not {"LDG", "STSM"} & set(ops) and ops["STS"] <= 2 and per_weight < most, (rows, glu_, ops)
        # the scaled form's MMAs chain across K: no float32 per-tile sum, a subtraction and a multiply a pair
        assert not cfg.scale_weights or not {"FADD", "FFMA", "STS"} & set(ops) and ops["HMUL2"] == ops["HADD2"], ops
        # a tile's two MMA groups are issued before one wait: none of their A registers written before it
        assert ops["WARPGROUP"] <= 3 * (2 if glu_ else 1) and not tool.rewritten_operands(tool.disassemble(kernel)[0]), (rows, glu_)
    monkeypatch.setenv(quant_rows_int4_mma.ENV, "8")
    assert quant_rows_int4_mma.enabled(8) and not quant_rows_int4_mma.enabled(9) and not quant_rows_int4_mma.enabled(1)
    monkeypatch.delenv(quant_rows_int4_mma.ENV)
    assert not quant_rows_int4_mma.enabled(8)


def test_w4a8_rows_on_wgmma_stage_inputs_in_the_lookups_byte_order():
    """quant_rows_w4a8_mma's input staging, emulated with torch: the two splits of a word's four inputs and the two
    ``cvt.e4m3x2`` (the first source to the upper byte, PTX's order) give bytes (0, 2, 1, 3), the order of the
    lookups' bytes (quant_gemv_w4a8_mma's ``_operand``: MMA input 4 k + j is byte j of word k); and the sign-flipped
    buffer's XOR 0x80 of each byte is the negated E4M3 value for every code (NaN aside)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_rows_w4a8_mma

    assert "lo, $3, $1" in quant_rows_w4a8_mma._E4M3_WORD.value and "hi, $4, $2" in quant_rows_w4a8_mma._E4M3_WORD.value
    inputs = torch.arange(128).view(32, 2, 2)  # (word, a, b) = input 4 word + 2 a + b
    even, odd = inputs[..., 0], inputs[..., 1]  # gl.split: the last dimension's halves
    x0, x2 = even[..., 0], even[..., 1]
    x1, x3 = odd[..., 0], odd[..., 1]
    lo = torch.stack([x0, x2], -1)  # cvt lo, $3 (x2), $1 (x0): x0 in the low byte
    hi = torch.stack([x1, x3], -1)
    staged = torch.cat([lo, hi], -1).reshape(128)  # the word's bytes 0..3
    lookup_order = torch.tensor([0, 2, 1, 3])
    assert torch.equal(staged, (torch.arange(32)[:, None] * 4 + lookup_order).reshape(128))
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    value = codes.view(torch.float8_e4m3fn).float()
    flipped = (codes.to(torch.int32) ^ 0x80).to(torch.uint8).view(torch.float8_e4m3fn).float()
    finite = ~value.isnan()
    assert torch.equal(flipped[finite], -value[finite])


def test_wide_row_kernels_make_their_input_once_as_the_staged_ones_do():
    """The input the wide wgmma row kernels copy, made once by cuda/made_input.py through the interpreter, against
    torch: W4A8's E4M3 bytes of each matrix's input at eager's rounding points, each word in the lookup's byte order,
    and the same with every sign flipped (exactly); INT4's input times the pre-quant scale in the compute dtype in the
    MMA's input order (exactly) and 136 x each row's sum per K tile (float32 sums, zero past M); SmoothQuant's int8
    (exactly); INT8 weight-only's float16 over each row's power of two (exactly: times r it is the input, outliers past
    float16's range included); one matrix and the GLU's two (each its own scales), M a tail of the MMA's N."""
    rows = _interpreted(None, "rows_input_check.py")
    assert [(r["format"], r["glu"]) for r in rows] == [("w4a8_awq", False), ("w4a8_awq", True), ("int4_awq", False),
                                                       ("int4_awq", True), ("int8_sq", False), ("int8_sq", True),
                                                       ("int8_wo", False)], rows
    for r in rows:
        assert r["equal"] and r.get("exact", True) and r.get("below", True), r
        if r["format"] == "int4_awq":
            assert r["sums_rel"] < 1e-6 and r["sums_past_m"] == 0.0, r


def test_w4a8_rows_on_wgmma_compile_for_hopper(monkeypatch):
    """quant_rows_w4a8_mma (W4A8-AWQ at 2-64 rows: quant_gemv_w4a8_mma's lookup into FP8 wgmma, the batch as the MMA's
    N) compiled for sm_90 here at its 7B launches: native QGMMA, no spill in 128 registers, shared memory for three
    programs an SM in the carveout, and a K loop under 2.4 instructions a weight at 8 rows (2.8 at 16 and for the GLU)
    where quant_gemm's W4A8 GEMM at M 8 spends 6-9 (tools/gemm_sass.py --w4a8): the lookups cost what they cost at
    batch 1, each row only its input's staging. From 17 rows the wide kernel: no global access in its loop, 168
    registers. The decode step's at batch 2-8 by default (``TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=N``); never on a CPU."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv, quant_rows_w4a8_mma, support

    def shape(n, k):
        return dataclasses.replace(_hopper_shape(n, k), fmt="w4a8_awq")

    proj = quant_rows_w4a8_mma.pick_config(shape(3584, 18944), 8, 132)
    glu = quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 16, 132, glu=True)
    # (the GLU at 128 rows and two stages: the H100's pick at 8 rows, 2026-12-08)
    assert (proj.block_m, proj.block_n, glu.block_m, glu.block_n, glu.num_stages, glu.splits) == (8, 128, 16, 128, 2, 1)
    assert proj.gemm and proj.lut_mma and proj.w4a8 and not quant_gemv.int4_ws(proj)
    assert quant_gemv.carveout([proj]) == quant_gemv.CARVEOUT_WS_MADE
    assert not quant_rows_w4a8_mma.supported(shape(3584, 18944), 8)  # a CPU weight
    tool = _sass_tool()
    # (the GLU at 16 rows: 45 KB, two programs an SM in the carveout)
    for cfg, glu_, rows, most, shared in ((proj, False, 8, 2.4, 43), (glu, True, 8, 2.8, 43), (glu, True, 16, 2.8, 46),
                                          (proj, False, 16, 2.8, 43)):
        kernel = tool.compile_w4a8_rows(cfg.block_n, glu_, cfg.num_stages, rows)
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "QGMMA", quant_rows_w4a8_mma.MAX_REGISTERS, shared)
        assert per_weight < most, (rows, glu_, ops)
    # the input one K tile ahead: on where $TRTLLM_PIPELINE_WGMMA_PREFETCH=1 asks, for the staged form only
    monkeypatch.setenv(support.STAGED_PREFETCH_ENV, "1")
    assert quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 8, 132, glu=True).prefetch
    assert not quant_rows_w4a8_mma.pick_config(shape(3584, 18944), 64, 132).prefetch
    monkeypatch.setenv(support.STAGED_PREFETCH_ENV, "yes")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_WGMMA_PREFETCH='yes'"):
        quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 8, 132)
    monkeypatch.delenv(support.STAGED_PREFETCH_ENV)
    assert not glu.prefetch
    kernel = tool.compile_w4a8_rows(glu.block_n, True, glu.num_stages, 8, prefetch=True)
    ops, per_weight = _wgmma_loop(tool, kernel, glu, True, "QGMMA", quant_rows_w4a8_mma.MAX_REGISTERS, 43)
    _prefetched(tool, kernel)
    # (and each matrix's two chains before one wait, their operands' registers untouched until it)
    assert per_weight < 2.8 and ops["WARPGROUP"] <= 6 and not tool.rewritten_operands(tool.disassemble(kernel)[0])
    # from 17 rows: the input made once (``prepare``) and copied beside the weights; the consumers' loop only reads
    # shared memory, looks up and multiplies (the per-tile float32 promotion of 64 columns is most of the rest)
    wide = quant_rows_w4a8_mma.pick_config(shape(3584, 18944), 64, 132)
    wide_glu = quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 33, 132, glu=True)
    assert (wide.block_m, wide.block_n, wide.num_stages, wide_glu.block_m, wide_glu.num_stages) == (64, 64, 3, 64, 2)
    assert wide.made and not proj.made
    # the wide form at 8 rows too ($TRTLLM_PIPELINE_WGMMA_STAGED_ROWS=0: the A/B of the two forms there)
    monkeypatch.setenv(support.STAGED_ROWS_ENV, "0")
    made8 = quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 8, 132, glu=True)
    assert made8.made and (made8.block_m, made8.block_n, made8.num_stages) == (8, 64, 2)
    monkeypatch.setenv(support.STAGED_ROWS_ENV, "17")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_WGMMA_STAGED_ROWS='17'"):
        quant_rows_w4a8_mma.pick_config(shape(18944, 3584), 8, 132)
    monkeypatch.delenv(support.STAGED_ROWS_ENV)
    for cfg, glu_, rows, most, shared in ((wide, False, 64, 3.1, 64), (wide_glu, True, 64, 2.7, 86),
                                          (wide, False, 32, 2.7, 40), (made8, True, 8, 2.3, 28)):
        kernel = tool.compile_w4a8_rows(cfg.block_n, glu_, cfg.num_stages, rows, made=True)
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "QGMMA", quant_rows_w4a8_mma.WIDE_REGISTERS, shared)
        assert not {"LDG", "STS", "STSM"} & set(ops) and per_weight < most, (rows, glu_, ops)
        # both chains of a tile issued before one wait, their operands' registers untouched until it
        assert ops["WARPGROUP"] <= 3 * (2 if glu_ else 1) and not tool.rewritten_operands(tool.disassemble(kernel)[0])
    monkeypatch.setenv(quant_rows_w4a8_mma.ENV, "8")
    assert quant_rows_w4a8_mma.enabled(8) and not quant_rows_w4a8_mma.enabled(9) and not quant_rows_w4a8_mma.enabled(1)
    q = _TableQuant("w4a8_awq", group=128, int4=True)
    assert not quant_gemm.choose(q, 8, 132).lut_mma  # not a Hopper weight: the table's kernel
    monkeypatch.setenv(quant_rows_w4a8_mma.ENV, "0")
    assert not quant_rows_w4a8_mma.enabled(8)
    monkeypatch.delenv(quant_rows_w4a8_mma.ENV)  # the default since h100-2026-12-08: the batches it ran at
    assert quant_rows_w4a8_mma.enabled(8) and not quant_rows_w4a8_mma.enabled(9)
    assert not quant_rows_w4a8_mma.enabled(1)


def test_int8_rows_on_wgmma_compile_for_hopper(monkeypatch):
    """quant_rows_int8_mma (SmoothQuant at 1-64 rows: the int8 weights straight from shared memory into wgmma, the
    rows as the MMA's N) compiled for sm_90 here at its 7B launches: native IGMMA from shared-memory operands and
    nothing per weight (under 80 instructions a thread and K tile, mostly uniform-datapath addresses, where the dp4a
    GEMV spends ~0.7 an int8 weight), no global access in the loop, no spill, shared memory for two programs an SM (the
    GLU at 64 rows one). The decode step's at batch 2-64 by default (``TRTLLM_PIPELINE_INT8_WGMMA_ROWS=N``)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv, quant_rows_int8_mma

    def shape(n, k):
        return dataclasses.replace(_hopper_shape(n, k), fmt="int8_sq")

    one = quant_rows_int8_mma.pick_config(shape(3584, 18944), 1, 132)
    wide = quant_rows_int8_mma.pick_config(shape(3584, 18944), 64, 132)
    glu = quant_rows_int8_mma.pick_config(shape(18944, 3584), 8, 132, glu=True)
    assert (one.block_m, one.num_stages, wide.block_m, wide.num_stages, glu.splits) == (8, 4, 64, 3, 1)
    assert one.gemm and one.lut_mma and not quant_gemv.int4_ws(one)
    assert quant_gemv.carveout([one]) == quant_gemv.CARVEOUT_WS_MADE
    assert not quant_rows_int8_mma.supported(shape(3584, 18944), 1)  # a CPU weight
    tool = _sass_tool()
    for cfg, glu_, rows, shared in ((one, False, 1, 43), (wide, False, 64, 66), (glu, True, 8, 66),
                                    (dataclasses.replace(glu, block_m=64), True, 64, 100)):
        kernel = tool.compile_int8_rows(glu_, cfg.num_stages, rows)
        ops, _ = _wgmma_loop(tool, kernel, cfg, glu_, "IGMMA", quant_rows_int8_mma.MAX_REGISTERS, shared)
        # (a stage's barriers, MMAs and addresses: a count per K tile, none per weight)
        assert not {"LDG", "LDS", "STS", "IDP", "I2F"} & set(ops) and sum(ops.values()) < 80, (rows, glu_, ops)
    monkeypatch.setenv(quant_rows_int8_mma.ENV, "8")
    assert quant_rows_int8_mma.enabled(2) and quant_rows_int8_mma.enabled(8) and not quant_rows_int8_mma.enabled(9)
    monkeypatch.delenv(quant_rows_int8_mma.ENV)  # the default since h100-2026-12-08: batch 2-64 (1: the ws GEMV)
    assert quant_rows_int8_mma.enabled(64) and not quant_rows_int8_mma.enabled(1)
    monkeypatch.setenv(quant_rows_int8_mma.ENV, "8")
    q = _TableQuant("int8_sq", group=512, int4=False)
    assert not quant_gemm.choose(q, 1, 132).lut_mma  # not a Hopper weight: the dp4a GEMV
    monkeypatch.setenv(quant_rows_int8_mma.ENV, "65")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_INT8_WGMMA_ROWS='65'"):
        quant_rows_int8_mma.enabled(1)


def test_int8wo_rows_on_wgmma_make_each_weight_exactly_in_the_mma_order():
    """quant_rows_int8wo_mma's arithmetic and operand, emulated with torch on a tile of random int8 weights: the XOR,
    the two PRMT against 0x64646464 and ``sub.f16x2`` of 1152 give every byte's float16 exactly; ``_operand``'s
    reshapes, splits and joins (as torch's, with the kernel's shapes) place each weight at the MMA row and input whose
    B element ``made_input.w8a16``'s order holds the input it multiplies: the emulated A x B is W x^T (float64)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_rows_int8wo_mma as m

    def prmt(a, b, sel):
        pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
        return sum(pool[(sel >> 4 * i) & 0x7] << 8 * i for i in range(4))

    def half_pairs(u, sel):  # float16 (a - b) of each 16-bit half: the sub.f16x2 of the offset
        word = torch.tensor([prmt(v, m.ABOVE.value, sel) for v in u.flatten().tolist()], dtype=torch.int64)
        halves = torch.stack([word & 0xFFFF, word >> 16], -1).to(torch.int16).view(torch.float16).float()
        return (halves - 1152).view(*u.shape, 2)

    def split(t):  # gl.split: the last dimension's two halves
        return t[..., 0], t[..., 1]

    gen = torch.Generator().manual_seed(7)
    w8 = torch.randint(-128, 128, (64, 128), generator=gen, dtype=torch.int8)
    w8[0, :4] = torch.tensor([-128, 127, 0, -1], dtype=torch.int8)
    words = w8.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [64, 32]: byte b of word r is input 4 r + b
    x = torch.randn(5, 128, generator=gen, dtype=torch.float64)
    cols = torch.arange(128)
    order = (cols & ~15) | (((cols >> 1) & 1) << 3) | (((cols >> 2) & 3) << 1) | (cols & 1)  # made_input.w8a16
    b = torch.empty_like(x)
    b[:, order] = x
    product = torch.zeros(64, 5, dtype=torch.float64)
    for h in range(2):
        lo, hi = split(words.reshape(64, 2, 16).permute(0, 2, 1))
        half = (lo, hi)[h]
        even, odd = split(half.reshape(4, 2, 8, 16).permute(0, 2, 3, 1))

        def rows_pairs(v):  # _rows_pairs: the pair (bytes 2 j, 2 j + 1) of word 4 c + t at 8 c + 4 j + t
            u = v ^ (m.SIGNS.value & 0xFFFFFFFF)
            p = torch.stack([half_pairs(u, 0x5140), half_pairs(u, 0x5342)], 3)  # (warp, g, word, j, i)
            return p.reshape(4, 8, 4, 4, 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(4, 8, 32, 2)

        pairs = torch.stack([rows_pairs(even), rows_pairs(odd)], 3)  # (warp, g, pair, p, i)
        a = pairs.permute(0, 3, 1, 2, 4).reshape(64, 64)  # join(x, x) then the pack: (pair, i) -> input 2 pair + i
        product += a.double() @ b[:, 64 * h: 64 * h + 64].t()
    assert torch.allclose(product, w8.double() @ x.t(), rtol=0, atol=1e-9)


def test_int8wo_rows_on_wgmma_compile_for_hopper(monkeypatch):
    """quant_rows_int8wo_mma (INT8 weight-only at 1-64 rows: each int8 word made two float16 pairs in registers into
    wgmma's A operand, the rows as the MMA's N) compiled for sm_90 here at its 7B launches: native HGMMA, the words
    from shared memory (LDSM) straight into the operand's registers (asserted trivial when it compiles), a LOP3, two
    PRMT and two HADD2 a word (1.25 a weight), under 2.3 instructions a weight in all, no global access in the loop,
    no spill in 128 registers, shared memory for three programs an SM at 64 rows (the GLU two). The decode step's at
    batch 2-64 by default (``TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=N``)."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm, quant_gemv, quant_rows_int8wo_mma as m

    def shape(n, k):
        return dataclasses.replace(_hopper_shape(n, k), fmt="int8_wo", group=k)

    one = m.pick_config(shape(3584, 18944), 1, 132)
    wide = m.pick_config(shape(3584, 18944), 64, 132)
    glu = m.pick_config(shape(18944, 3584), 8, 132, glu=True)
    assert (one.block_m, one.num_stages, wide.block_m, wide.num_stages, glu.splits) == (8, 4, 64, 3, 1)
    assert one.gemm and one.lut_mma and one.made and quant_gemv.carveout([one]) == quant_gemv.CARVEOUT_WS_MADE
    assert not m.supported(shape(3584, 18944), 1)  # a CPU weight
    tool = _sass_tool()
    for cfg, glu_, rows, shared in ((one, False, 1, 49), (wide, False, 64, 73), (glu, True, 8, 55),
                                    (dataclasses.replace(glu, block_m=64), True, 64, 97)):
        kernel = tool.compile_int8wo_rows(glu_, cfg.num_stages, rows)
        ops, per_weight = _wgmma_loop(tool, kernel, cfg, glu_, "HGMMA", m.MAX_REGISTERS, shared)
        mats = 2 if glu_ else 1
        assert (ops["LOP3"], ops["PRMT"], ops["HADD2"]) == (16 * mats, 32 * mats, 32 * mats), (rows, ops)
        assert not {"LDG", "STS", "I2F", "F2FP"} & set(ops) and per_weight < 2.3, (rows, glu_, ops)
    monkeypatch.setenv(m.ENV, "8")
    assert m.enabled(2) and m.enabled(8) and not m.enabled(9) and not m.enabled(1)
    monkeypatch.setenv(m.ENV, "0")
    assert not m.enabled(8)
    monkeypatch.delenv(m.ENV)  # the default since h100-2026-12-08: batch 2-64 (batch 1 on the dp4a GEMV)
    assert m.enabled(2) and m.enabled(64) and not m.enabled(1)
    monkeypatch.setenv(m.ENV, "8")
    q = _TableQuant("int8_wo", group=512, int4=False)
    assert not quant_gemm.choose(q, 8, 132).lut_mma  # not a Hopper weight: the table's kernel
    monkeypatch.setenv(m.ENV, "65")
    with pytest.raises(InputError, match="TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS='65'"):
        m.enabled(1)


def test_int8_gemv_on_hopper_warp_specialized_compiles(monkeypatch):
    """INT8's warp-specialized batch-1 GEMV (quant_gemv_int8_ws, Gluon) compiled for sm_90 here at pick_config's
    launches for the 7B (qkv and the GLU): the consumers' loop reads shared memory only and does the register kernel's
    dp4a work, a quarter IDP.4A a weight for SmoothQuant (int8 x int8) and half for weight-only (two input planes),
    under 0.8 and 1.3 instructions a weight in all; nothing spilled, shared memory for three programs an SM in the
    carveout the decode step pins (CARVEOUT_WS_MADE). SmoothQuant's by default, weight-only's under
    ``TRTLLM_PIPELINE_INT8_WS=1``."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemv, quant_gemv_int8_ws

    qkv = quant_gemv_int8_ws.pick_config(dataclasses.replace(_hopper_shape(4608, 3584), fmt="int8_sq", group=3584), 132)
    glu = quant_gemv_int8_ws.pick_config(dataclasses.replace(_hopper_shape(18944, 3584), fmt="int8_sq", group=3584),
                                         132, glu=True)
    assert (qkv.block_n, qkv.splits, glu.block_n, glu.splits) == (64, 6, 32, 1) and qkv.ws and qkv.dp4a8
    assert quant_gemv.carveout([qkv]) == quant_gemv.CARVEOUT_WS_MADE and not quant_gemv.int4_ws(qkv)
    for fmt, idp, most in (("int8_sq", 0.25, 0.8), ("int8_wo", 0.5, 1.3)):
        for cfg, extra in ((qkv, []), (glu, ["--glu"])):
            tiles = -(-28 // cfg.splits)
            r = _gemv_sass([*extra, "--int8-ws", fmt, "--block-n", str(cfg.block_n), "--tiles", str(tiles),
                            "--stages", str(cfg.num_stages), "--block-k", "128"])
            assert not {"UTMALDG", "LDGSTS", "LDG"} & set(r["mix"]), (fmt, r)
            assert r["mix"]["IDP"] * r["threads"] / r["weights"] == idp, (fmt, r)
            assert r["loop_per_thread"] * r["threads"] / r["weights"] < most, (fmt, r)
            assert r["local_memory_ops"] == 0 and r["shared_bytes"] <= 43 * 1024, (fmt, r)
    monkeypatch.setenv(quant_gemv_int8_ws.ENV, "1")
    assert quant_gemv_int8_ws.enabled("int8_wo") and quant_gemv_int8_ws.enabled("int8_sq")
    monkeypatch.setenv(quant_gemv_int8_ws.ENV, "0")
    assert not quant_gemv_int8_ws.enabled("int8_sq")
    monkeypatch.delenv(quant_gemv_int8_ws.ENV)  # SmoothQuant's default since h100-2026-12-08
    assert quant_gemv_int8_ws.enabled("int8_sq") and not quant_gemv_int8_ws.enabled("int8_wo")


def test_w4a8_gemv_benchmark_dry_run(tmp_path):
    """benchmarks/w4a8_gemv.py --dry-run (the next GPU call's W4A8 GEMV A/B at the 7B's launches): every variant
    (legacy_config, pick_config, the sweep) at tiny shapes through the interpreter, each equal to quant_linear's FP8
    tensor-core kernel up to float32 summation order."""
    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "w4a8_gemv.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "w4a8_gemv.json").read_text())["rows"]
    assert {r["linear"] for r in rows} == {"qkv", "dense", "glu", "proj"}
    assert {"legacy", "new", "glu-16", "glu-64"} <= {r["variant"] for r in rows}
    assert {r["prefetch"] for r in rows} == {True, False}
    assert all("failed" not in r and r["vs_dot"] < 1e-4 for r in rows), rows
    # --rows: W4A8 at 3 input rows through quant_gemm.launch (the lookup wgmma kernel is Hopper's: the GEMM here)
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "w4a8_gemv.py"), "--dry-run", "--rows",
                           "3", "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "w4a8_rows3.json").read_text())
    assert result["input_rows"] == 3 and {r["variant"] for r in result["rows"]} == {"gemm"}
    assert all("failed" not in r and r["vs_dot"] < 1e-4 for r in result["rows"]), result["rows"]
    # INT8 weight-only the same (its wgmma kernel is Hopper's too), under its own file name
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "w4a8_gemv.py"), "--dry-run", "--rows",
                           "3", "--format", "int8_wo", "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "int8_wo_rows3.json").read_text())
    assert all("failed" not in r and r["vs_dot"] < 1e-4 for r in result["rows"]) and len(result["rows"]) == 4


def test_w4a8_gemv_benchmark_builds_the_row_kernels_variants(monkeypatch):
    """The wgmma row kernels' variants that ``benchmarks/w4a8_gemv.py --rows`` times on a GPU, built here with the
    kernels taken as supported (their configs only; a bad one would cost a GPU part): INT4 at 64 rows the scaled wide
    form at 128 rows a program, at 64, and the offset form timed before; W4A8's wide linears at 128 rows too but not its
    GLU (it spills there); each staged form with its input one K tile ahead as the other way from the default."""
    monkeypatch.syspath_prepend(str(TESTS.parent / "benchmarks"))
    import w4a8_gemv

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_rows_int4_mma, quant_rows_w4a8_mma

    for module in (quant_rows_int4_mma, quant_rows_w4a8_mma):
        monkeypatch.setattr(module, "supported", lambda q, m: True)
    int4, w4a8 = _hopper_shape(3584, 18944), dataclasses.replace(_hopper_shape(3584, 18944), fmt="w4a8_awq")
    wide = dict(w4a8_gemv.rows_variants(int4, 64, 132, False, ["rows"]))
    assert (wide["rows"].block_n, wide["rows"].scale_weights, wide["rows-64-rows"].block_n) == (128, True, 64)
    assert wide["rows-offset"].block_n == 64 and not wide["rows-offset"].scale_weights and wide["rows-offset"].made
    assert "rows-128-rows" in dict(w4a8_gemv.rows_variants(w4a8, 64, 132, False, ["rows"]))
    assert "rows-128-rows" not in dict(w4a8_gemv.rows_variants(w4a8, 64, 132, True, ["rows"]))
    for q in (int4, w4a8):
        staged = dict(w4a8_gemv.rows_variants(q, 8, 132, False, ["rows"]))
        assert staged["rows-prefetch"].prefetch and not staged["rows"].prefetch and staged["rows-made"].made
        assert staged["rows-made"].scale_weights == (q is int4)


def test_ncu_quant_script_dry_run():
    """benchmarks/ncu_quant.py --dry-run (what Nsight Compute reads on the GPU: INT4-AWQ's and W4A8-AWQ's decode GLU
    and proj at M 1 and 8, the kernels the decode step takes): every launch at tiny shapes through the interpreter,
    each within bf16's error of float32 ``x @ W^T``."""
    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "ncu_quant.py"), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = {line.split(":")[0]: float(line.rsplit(" ", 1)[1])
              for line in proc.stdout.splitlines() if " error " in line}
    table = {k: v for k, v in errors.items() if "without" not in k}
    assert len(table) == 8 and max(table.values()) < 5e-3, proc.stdout
    # the input scaled beforehand, no pre-quant scales in the GEMM: mlp.proj's (one matrix) result the same
    for fmt in ("int4_awq", "w4a8_awq"):
        alone = errors[f"{fmt} proj m=8 without pre-quant scales in the GEMM"]
        assert alone == pytest.approx(table[f"{fmt} proj m=8"], rel=1e-3), proc.stdout


def test_gpu_benchmark_quantizes_synthetic_engines_the_fast_path_takes():
    """benchmarks/gpu_fast_path.py --parts quant builds its 7B engines from random BF16 tensors quantized on the
    GPU; here the same code at a tiny shape on the CPU: the packing is the checkpoint's, each format loads, the
    fast path's view of it is the format's, and eager decoding stays finite."""
    import dataclasses

    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    import quant_fast_path as qf
    from torch_runtime_gpu import synthetic_tensors

    from trtllm_pipeline.model.catalog import KNOWN_MODELS
    from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import _linear
    from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine, unpack_int4_rows

    v = torch.randint(-8, 8, (6, 32))
    assert torch.equal(unpack_int4_rows(qf.pack_int4_rows(v)).long(), v)
    shape = dataclasses.replace(KNOWN_MODELS["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"], hidden_size=128,
                                intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=256)
    cpu = torch.device("cpu")
    amax = qf.input_amax(*synthetic_tensors(shape, False, cpu), cpu, prompt_len=16)
    for fmt in qf.QUANT_FORMATS:
        config, tensors = qf.quantized_checkpoint(fmt, *synthetic_tensors(shape, False, cpu), amax, cpu)
        engine = Qwen2Engine(config, tensors, device=cpu, max_slots=1, max_seq_len=32)
        layer = engine.layers[0]
        assert layer["qkv"].format == fmt and _linear(layer["qkv"]).quant.fmt == fmt
        # fc and gate apart (their own input scales) where ModelOpt's exports have them apart
        assert hasattr(layer["fc_gate"], "first") == (fmt != "int8_wo"), fmt
        h = engine(PagedBatch.of([(list(range(8)), 0, engine.slot_tables([0])[0])]))
        assert torch.isfinite(engine.logits(h[-1])).all(), fmt


def test_quant_gemm_benchmark_dry_run_reaches_every_call(tmp_path):
    """benchmarks/quant_gemm.py --dry-run: both parts on the CPU at a tiny shape, Triton's kernels through the
    interpreter, so that every engine, decode-graph and kernel call the H200 run makes is made here (its first run
    lost the steps part to a call of the engine's old slot API). Kernels: every kind of candidate runs, correct, and
    the table they make loads; steps: prefill before and after the copies, the batch check and decode steps of every
    format, no failure."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    from quant_gemm import MAX_ERR

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm

    formats = ["int4_awq", "int8_sq"]  # the GEMV / dot / GEMM / dequant, int_mm (FP8's and BF16's: the tests above)
    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "quant_gemm.py"), "--dry-run", "--out",
                           str(tmp_path), "--formats", ",".join(formats)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quant_gemm.json").read_text())
    rows = result["kernels"]
    assert isinstance(rows, list), rows  # a failed part is {"error": traceback}
    assert not [r for r in rows if "failed" in r or not r["error"] < MAX_ERR[r["format"]]]
    assert {"gemm", "gemv", "dot", "int_mm", "dequant", "int4pack"} <= {r["kernel"] for r in rows}
    table = quant_gemm._load_table(tmp_path / "quant_gemm_table.json")
    assert {key[0] for key in table} == {"int4_awq", "int8_sq"}
    steps = result["steps"]
    assert isinstance(steps, list) and [r["format"] for r in steps] == formats, steps
    for r in steps:
        assert "error" not in r, r["error"]
        assert [s["batch"] for s in r["steps"]] == [1, 2] and all(s["ms_per_step"] > 0 for s in r["steps"]), r
        assert r["prefill_logits_rel_vs_copy"] == 0.0, r  # on the CPU both prefills are eager's (copies kept)
        assert r["format"] == "bf16" or r["check_batch"]["argmax_equal"].endswith("/2"), r
    assert "FAILED" not in (tmp_path / "quant_gemm.txt").read_text()


def test_quant_gemm_benchmark_gemv_rows_parts_dry_run(tmp_path):
    """benchmarks/quant_gemm.py --parts gemv_rows,rows_steps --dry-run (the next H200 run's INT4-AWQ GEMV for several
    rows): the several-row GEMV timed beside today's kernels, correct, its tiles in the merged table, which keeps the
    package's other entries; then steps under each kernel choice, the switch's taking the GEMV at every batch, and
    torch's INT4 kernel's (TRTLLM_PIPELINE_INT4PACK_ROWS) giving eager's logits."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    from quant_gemm import DRY_ROWS_MS, MAX_ERR

    from trtllm_pipeline.runtimes.torch_engine.cuda import quant_gemm

    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    env.pop(quant_gemm.TABLE_ENV, None)
    proc = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "quant_gemm.py"), "--dry-run", "--out",
                           str(tmp_path), "--formats", "int4_awq", "--parts", "gemv_rows,rows_steps"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quant_gemm.json").read_text())
    rows = result["gemv_rows"]
    assert isinstance(rows, list), rows
    assert not [r for r in rows if "failed" in r or not r["error"] < MAX_ERR[r["format"]]]
    several = [r for r in rows if r["kernel"] == "gemv" and r["m"] > 1]
    assert {r["m"] for r in several} == set(DRY_ROWS_MS) - {1} and all(r["config"][0] > 1 for r in several)
    mma = [r for r in rows if r["kernel"] == "mma"]  # quant_mma_int4 beside them (correct: no failure above)
    assert {r["m"] for r in mma} == set(DRY_ROWS_MS) - {1} and {r["glu"] for r in mma} == {False, True}
    entries = json.loads((tmp_path / "quant_gemm_table.json").read_text())["entries"]
    assert {e["m"] for e in entries if e["n"] == 3584 and e["k"] == 18944} >= {1, 8, 2048}  # the package's 7B rows
    assert all(e.get("config") for e in entries if e["kernel"] == "gemv" and e["m"] > 1)
    quant_gemm._load_table(tmp_path / "quant_gemm_table.json")
    steps = result["rows_steps"]
    assert [(s["choice"], s["batch"]) for s in steps] == [(c, b) for c in ("table", "gemv", "measured", "mma",
                                                                           "int4pack", "wgmma") for b in (1, 3)], steps
    # quant_rows_int4_mma runs on Hopper only: here its choice is the table's kernels, checked against eager as well
    wgmma = [s for s in steps if s["choice"] == "wgmma"]
    assert "wgmma" not in set(wgmma[1]["kernels"].values()) and wgmma[1]["check_batch"]["argmax_equal"] == "3/3"
    # torch's INT4 kernel (its CPU twin here) for every linear at 3 rows, batch 1 on the GEMV; eager's tokens
    packed = [s for s in steps if s["choice"] == "int4pack"]
    assert set(packed[0]["kernels"].values()) == {"gemv"} and set(packed[1]["kernels"].values()) == {"int4pack"}
    check = packed[1]["check_batch"]
    assert check["argmax_equal"] == "3/3" and check["logits_rel_fast_vs_eager"] < 0.02, check
    mma_steps = [s["kernels"] for s in steps if s["choice"] == "mma"]
    assert mma_steps[0]["qkv"] == "gemv" and {mma_steps[1][k] for k in ("qkv", "dense", "proj")} == {"mma"}, mma_steps
    assert mma_steps[1]["glu"] == "gemv", mma_steps
    assert all(set(s["kernels"].values()) == {"gemv"} for s in steps if s["choice"] == "gemv")
    assert "gemv" not in {k for s in steps if s["choice"] == "table" and s["batch"] > 1 for k in s["kernels"].values()}


def test_batch_buckets_and_padding():
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets(64, [1, 3, 100]) == [1, 3, 64]  # out-of-range sizes dropped, the maximum kept
    assert batch_buckets(512)[-1] == 256 and batch_buckets(512, [1, 300]) == [1, 256]  # MAX_FAST_ROWS
    assert batch_buckets(512, limit=1024)[-1] == 512  # where cuBLAS takes every linear of a large step: row_limit
    # speculation's verify steps: b requests of 1 + k rows for each bucket b, the full batch's, at most the limit
    assert with_verify_buckets([1, 2, 4, 8], 8, 8, 256) == [1, 2, 4, 8, 9, 18, 36, 72]
    assert with_verify_buckets([1, 2, 4, 8, 16, 32, 64], 64, 8, 256) == [1, 2, 4, 8, 9, 16, 18, 32, 36, 64, 72, 144, 256]
    assert bucket_for(1 + 8, with_verify_buckets([1, 2, 4, 8], 8, 8, 256)) == 9  # a lone request's verify step


def test_steps_past_256_rows_only_where_cublas_takes_every_linear(monkeypatch):
    """graphs.row_limit: BF16 and FP8 engines on one GPU run steps of up to MAX_LIBRARY_ROWS rows (their linears
    from LIBRARY_MIN_BATCH rows are cuBLAS's, tiled over the rows); the 4/8-bit formats, whose kernels hold a step's
    rows in one tile, and tensor-parallel ranks stay at MAX_FAST_ROWS."""
    from trtllm_pipeline.runtimes.torch_engine.cuda import decode_step, graphs

    class Engine:
        def __init__(self, fmt):
            self.format = fmt

    assert graphs.row_limit(Engine("fp8"), 1) == graphs.row_limit(Engine("none"), 1) == graphs.MAX_LIBRARY_ROWS
    assert graphs.row_limit(Engine("fp8"), 2) == graphs.MAX_FAST_ROWS
    assert all(graphs.row_limit(Engine(f), 1) == graphs.MAX_FAST_ROWS for f in ("int4_awq", "int8_sq", "nvfp4"))
    monkeypatch.setattr(decode_step, "LIBRARY_MIN_BATCH", 512)  # cuBLAS only past the one-tile limit: no gain
    assert graphs.row_limit(Engine("fp8"), 1) == graphs.MAX_FAST_ROWS
    assert [bucket_for(n, [1, 2, 4, 8]) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="exceed"):
        bucket_for(9, [1, 2, 4, 8])
    # tokens, positions, then each row's block table down its column (null block 0 after it, and for padding)
    rows = decode_inputs([11, 12, 13], [[4], [5, 6], [2, 3, 7]], [7, 9, 30], 4, width=3)
    assert rows.tolist() == [[11, 12, 13, 0], [7, 9, 30, 0], [4, 5, 2, 0], [0, 6, 3, 0], [0, 0, 7, 0]]


def test_sampler_greedy_bans_and_filters():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    greedy = SamplingParams(max_tokens=1)
    top = logits.argmax(-1)
    assert sampling.sample(logits, [sampling.Row(greedy)] * 4) == top.tolist()
    # A banned argmax (min_tokens' end id, a bad word) gives the runner-up.
    banned = sampling.sample(logits, [sampling.Row(greedy, banned=[int(top[0])])] + [sampling.Row(greedy)] * 3)
    assert banned[0] == int(logits[0].topk(2).indices[1]) and banned[1:] == top[1:].tolist()
    # With the step's argmax given, a ban that misses it changes nothing, one that hits it is recomputed on that row
    # alone; the logits stay as they were.
    before = logits.clone()
    rows = [sampling.Row(greedy, banned=[int(logits[0].argmin())]), sampling.Row(greedy, banned=[int(top[1])])]
    assert sampling.sample(logits[:2], rows, greedy=top[:2]) == [int(top[0]), int(logits[1].topk(2).indices[1])]
    assert torch.equal(logits, before)
    # top_k 1 and a tiny top_p keep only the argmax, whatever the temperature and seed.
    for params in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)):
        rows = [sampling.Row(params, generator=torch.Generator().manual_seed(i)) for i in range(4)]
        assert sampling.sample(logits, rows) == top.tolist()
    # top_k 5: every draw is among the row's five best.
    hot = SamplingParams(temperature=5.0, top_k=5)
    draws = [sampling.sample(logits, [sampling.Row(hot, generator=torch.Generator().manual_seed(s))] * 4)
             for s in range(20)]
    best5 = logits.topk(5).indices
    assert all(d[r] in best5[r].tolist() for d in draws for r in range(4))


def test_sampler_seeded_rows_do_not_depend_on_their_batch():
    torch.manual_seed(1)
    logits = torch.randn(3, 200)
    params = SamplingParams(temperature=1.0, top_p=0.9)

    def draw(rows_logits, seeds):
        return sampling.sample(rows_logits, [sampling.Row(params, generator=torch.Generator().manual_seed(s))
                                             for s in seeds])

    alone = draw(logits[1:2], [42])
    together = draw(logits, [7, 42, 9])
    assert together[1] == alone[0]
    assert draw(logits, [7, 42, 9]) == together


def test_long_prompts_are_prefilled_in_chunks_without_stalling_decodes(built):
    ckpt = _checkpoint(built, "tiny-qwen2-fp8-tp1")
    whole = TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=512)
    chunked = TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=512, prefill_chunk_tokens=16)
    long_prompt, short_prompt = list(range(100, 300)), list(range(50, 60))
    params = SamplingParams(max_tokens=8, end_id=-1)
    expected = [c.token_ids for c in whole.generate([short_prompt, long_prompt], params)]
    assert [c.token_ids for c in chunked.generate([short_prompt, long_prompt], params)] == expected

    # The short request decodes a token in every step while the long prompt is prefilled 16 at a time.
    chunked.submit("short", short_prompt, params)
    chunked.step()
    chunked.submit("long", long_prompt, params)
    per_step = []
    while chunked.has_work():
        per_step.append({e.request_id for e in chunked.step()})
    short_steps = [s for s in per_step if "short" in s]
    assert len(short_steps) == 7 and all("short" in s for s in per_step[:7])
    first_long = next(i for i, s in enumerate(per_step) if "long" in s)
    assert first_long == len(long_prompt) // 16  # 200 tokens: 12 full chunks and a last one of 8


@pytest.mark.slow
def test_verify_rows_are_bit_for_bit_the_one_token_steps_of_their_decode_batch(built):
    """A verify step's rows (issue 35: greedy speculation keeps plain decoding's tokens) through Triton's interpreter:
    after a 400-token prompt, one request's 1 + 3 tokens in one step, and two requests' together, give exactly the
    logits of the same tokens fed one a step at batch 1 and 2. The verify bucket's own key split differs (it is
    chosen for its rows); the step attends with its requests' decode batch's (``DecodeStep.verify_buffers``)."""
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), "verify_rows_check.py")
    assert r["decode_path"].startswith("triton kernels")
    assert r["logits_buffers"] == 1 and len(r["verify_buckets"]) > 1  # one buffer for every bucket's logits
    for case in (r["one"], r["two"]):
        assert case["bucket_splits"] != case["decode_splits"] == case["verify_splits"], case
        assert case["equal"] and case["max_diff"] == 0.0, case


@pytest.mark.slow
def test_speculative_verify_step_on_the_fast_path_gives_eager_greedy_tokens(built):
    """Rows of 1 + k tokens as rows of one fast step (attention twice: the second pass reads the drafts' K/V the
    first wrote), through Triton's interpreter: the same tokens as eager decoding without speculation, with tokens
    banned at verified positions too; every bucket's verify step set up when the runtime loads (on CUDA: its graph
    captured then, not on first use inside generation)."""
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), "spec_fast_check.py")
    assert r["decode_path"].startswith("triton kernels") and r["verify_ready"]  # every verify bucket set up at load
    assert r["fast"] == r["expected"]
    assert r["verify_steps"] > 0 and 0 < r["accepted"] < r["drafted"] and r["blocks_back"]
    # With bans: the drafts propose the end id before min_tokens and a bad word whose second token follows its first
    # in the same row; the in-step argmax knows no bans, so those rows take their masked logits' argmax, as eager
    expected, banned = r["expected"], r["banned_expected"]
    assert r["word_ids"] == expected[1][3:5] and expected[0][1] not in banned[0]
    assert banned[1][:4] == expected[1][:4] and banned[1][4] != expected[1][4]  # the bans changed the output
    assert r["banned_fast"] == banned and r["banned_verify_steps"] > 0 and r["banned_accepted"] > 0


@pytest.mark.slow
def test_prompt_lookup_on_the_device_chains_verify_steps_and_gives_plain_greedy(built, tmp_path):
    """Device drafting (``cuda.drafted``, issue 35): greedy requests' drafts accepted and the next ones looked up on the
    device, their verify steps launched on the running step before its tokens are read, through Triton's
    interpreter: the tokens of the same fast path without speculation on the random model (its drafts rejected),
    and of eager decoding on a copy of it that repeats its context (drafts kept, whole runs of them), batched and
    alone, with a request ending on its end id inside a kept run; steps chained on the device's tokens, verify steps
    among them; every block back at the end."""
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), "spec_device_check.py", str(tmp_path))
    assert r["device_drafting"] and "draft on the device" in r["describe"]
    assert r["random"] == r["random_plain"] and r["random_pending"]["verify"] > 0
    assert r["copy"] == r["expected"] and r["alone"] == [r["expected"][0][:10]]
    assert r["ended"] == r["ended_eager"] and len(r["ended"][0]) < len(r["expected"][0])
    assert r["copy_pending"]["verify"] > 0 and r["copy_pending"]["decode"] > 0 and r["chained"] > 0
    assert 0 < r["accepted"] < r["drafted"] and r["blocks_back"]


@pytest.mark.slow
def test_tree_verify_rows_on_the_fast_path_match_the_eager_tree_row_and_give_plain_greedy(built):
    """Tree rows (issue 35) through the fast verify step, Triton's interpreter: each node rotated at its depth and
    masked to the context and its ancestors (``attention.decode_attention``'s ``tree``), within the fast path's usual
    distance of float32 eager, as the eager tree row is; a chain given as parents exactly today's linear verify step
    (logits, argmax, K/V); greedy decoding with decoy trees (the kept path never the first nodes: its K/V moved in the
    pool the fast step reads) the tokens of eager decoding without speculation, every tree row on the fast path."""
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), "spec_tree_fast_check.py")
    assert r["decode_path"].startswith("triton kernels")
    for kind in ("tree", "linear"):  # (the linear row beside the tree row in the same step)
        fast, eager = r[f"{kind}_fast_vs_fp32"], r[f"{kind}_eager_vs_fp32"]
        assert fast < 1.5 * eager + 1e-3 and fast < 0.02, r
    assert r["tree_argmax_equal"], r
    assert r["chain_logits_equal"] and r["chain_greedy_equal"] and r["chain_kv_equal"], r
    assert r["fast_trees"] == r["expected"], r
    assert r["tree_steps"] > 0 and r["eager_tree_rows"] == 0 and r["moves"] > 0, r
    assert 0 < r["accepted"] < r["drafted"] and r["blocks_back"], r
    assert "trees of up to 8 nodes verified on the fast path" in r["describe"], r
    # TRTLLM_PIPELINE_FAST_TREES=0: the same trees verified eagerly keep the same drafts
    assert r["off_tree_steps"] == 0 and r["off_eager_tree_rows"] > 0 and r["off_fast_trees"] == r["expected"], r
    assert (r["off_accepted"], r["off_drafted"]) == (r["accepted"], r["drafted"]), r


@pytest.mark.slow
def test_tree_nodes_on_the_fast_path_compute_their_chains_logits_bit_for_bit_across_a_tile_edge(built):
    """A tree node attends as a 1-token step at its context length + depth (``attention.decode_attention``'s
    ``tree``): its ancestors' keys read from their slots at their depths' positions, in a bucket that splits the keys
    as its requests' decode batch (``graphs._tree_bucket``). Two requests' tree rows, each a decoy first and nodes
    whose slots cross a 64-key tile (and a block) edge where their positions do not: the path's logits, argmax and,
    once moved into place, K/V those of the same paths verified as chains, bit for bit. By slot (and in one request's
    bucket) they were 0.1 of a logit apart here, and on the H100 the FP8 SmolLM2's tree outputs parted from plain
    greedy's on 10 of 18 grounded prompts (issue 35)."""
    r = _interpreted(_checkpoint(built, "tiny-qwen2-bf16-tp1"), "spec_tree_exact_check.py")
    assert r["decode_path"].startswith("triton kernels") and r["buckets"] == [1, 2, 9, 18], r
    assert r["logits_equal"] and r["greedy_equal"] and r["kv_equal"], r
