"""Run by tests/test_fast_decode.py in a subprocess: the CUDA fast path's kernels through Triton's
interpreter on the CPU, against the eager model, on a tiny pipeline checkpoint. Prints JSON.

A subprocess because the interpreter is chosen when kernels are defined (TRITON_INTERPRET at import)
and must not leak into the other tests' runtimes.

    python tests/fast_decode_check.py CHECKPOINT_DIR [TP_MODE]

TP_MODE ``distributed`` (a tp>1 checkpoint): the fast runtime is the tensor-parallel group, one process
per rank (gloo), each replaying its shard's step; the eager references stay merged in this process.

FAST_CHECK_PARTS (comma-separated; unset: greedy and ending) picks the optional fast-path runs, each a few interpreted
steps: ``greedy`` (greedy_fast; with the library check, library_greedy), ``ending`` (ending_fast and ending_eager) and
``prefill`` (prefill_fast and prefill_eager: three-token prompts prefilled as rows of fast steps);
a test asks for those it asserts on. The first step's logits, the padding check and staggered_fast always run.

FAST_CHECK_VARIANTS (JSON, {name: {variable: value}}): after the fast runtime above, one more per variant, made under
those environment variables (kernel switches) and checked as it was, against the same references (eager's and float32's
made once); each variant's result, shaped as the main one less the lockstep greedy run, under ``variants``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from unittest import mock
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
import torch
from continuous_batching import staggered
from near_ties import near_greedy

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.plan import PlanRow
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


def runtime(ckpt: Path, dtype: str, fast: bool, tp_mode: str = "merged") -> TorchRuntime:
    return TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", dtype=dtype, max_batch_size=4, max_seq_len=256,
                        fast_decode=fast, tp_mode=tp_mode)


def first_step_logits(rt: TorchRuntime, prompts, tokens) -> tuple[torch.Tensor, bool]:
    """Logits of one decode step after prefilling ``prompts`` into blocks of the pool; and whether the step left
    every block no row owns as it was (the padding row of the bucket wrote the null block only)."""
    rows = []
    for i, prompt in enumerate(prompts):
        rt.kv.admit(("check", i), prompt, len(prompt) + 1, use_cache=False, watermark=False)
        rows.append(PlanRow(("check", i), prompt, 0, rt.kv.tables[("check", i)], False))
    rt._forward(rows)
    tables, positions = [r.block_table for r in rows], [len(p) for p in prompts]
    if rt.decoder is not None:
        logits = rt.decoder.decode(tokens, tables, positions).float().clone()
    else:
        hidden = rt._forward([PlanRow(r.request_id, [t], p, r.block_table, True)
                              for r, t, p in zip(rows, tokens, positions)])
        logits = rt.engine.logits(hidden).float()
    owned = {b for t in tables for b in t}
    unowned = [b for b in range(1, rt.kv.num_blocks) if b not in owned]
    cache = rt.engine.cache_k.float()  # (an FP8 cache's too)
    padding_ok = bool(cache[:, unowned].abs().sum() == 0)
    for i in range(len(prompts)):
        rt.kv.free(("check", i))
    return logits, padding_ok


def kernel_buckets(fast: TorchRuntime) -> dict:
    """The buckets whose steps run each optional kernel (its configs chosen at load: the table's or a switch's)."""
    local = getattr(fast.decoder, "local", fast.decoder)  # (tensor parallel: rank 0's DecodeGraphs)

    def buckets(takes) -> list[int]:
        return sorted(b for b, buf in local.buffers.items() if any(takes(c) for c in buf.configs.values()))

    # the INT4 GEMV for several rows (quant_gemv.rows_config), quant_mma_int4's INT8 tensor-core linear (under
    # TRTLLM_PIPELINE_INT4_MMA_ROWS), INT8 SmoothQuant's dp4a GEMV (quant_gemv_int8) and W4A8's table-lookup GEMV
    # (quant_gemv_w4a8), each under its switch; quant_gemm's GLU split K (a table's choice)
    glu = {b: buf.configs["glu"] for b, buf in local.buffers.items()}
    return {"gemv_rows_buckets": buckets(lambda c: c.gemv and c.block_m > 1),
            "mma_rows_buckets": buckets(lambda c: c.mma), "int8_gemv_buckets": buckets(lambda c: c.dp4a8),
            "w4a8_gemv_buckets": buckets(lambda c: c.w4a8),
            "split_glu_buckets": sorted(b for b, c in glu.items() if c.gemm and c.splits > 1),
            # the consumers whose GEMM takes its input already times its pre-quant scale (the norm's), by bucket
            "scaled_inputs": {b: sorted(buf.scaled_inputs) for b, buf in local.buffers.items() if buf.scaled_inputs},
            "gate_input_buckets": sorted(b for b, buf in local.buffers.items() if buf.normed2 is not None)}


def main() -> None:
    ckpt = Path(sys.argv[1])
    tp_mode = sys.argv[2] if len(sys.argv) > 2 else "merged"
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 2000, (n,), generator=gen).tolist() for n in (5, 40, 23)]
    fast = runtime(ckpt, "bfloat16", True, tp_mode)
    eager, fp32 = runtime(ckpt, "bfloat16", False), runtime(ckpt, "float32", False)
    checked = {name: first_step_logits(rt, prompts, [7, 8, 9]) for name, rt in
               (("fast", fast), ("eager", eager), ("fp32", fp32))}
    logits = {name: c[0] for name, c in checked.items()}

    def rel(a, b):
        return float((logits[a] - logits[b]).norm() / logits[b].norm())

    greedy = SamplingParams(max_tokens=4, end_id=-1)  # 4: the suite's time; batches still change size
    greedy_eager = [c.token_ids for c in eager.generate(prompts, greedy)]
    # The first row ends on its end id after two tokens, the others go on.
    ending = SamplingParams(max_tokens=4, end_id=greedy_eager[0][1])
    parts = set(os.environ.get("FAST_CHECK_PARTS", "greedy,ending").split(","))
    references = {"weight_bytes_eager": eager.describe()["weight_bytes"], "eager_vs_fp32": rel("eager", "fp32"),
                  "greedy_eager": greedy_eager, "max_tokens": greedy.max_tokens}

    def fast_results(fast, checked, parts) -> dict:
        """The fast runtime's results, after its first step (``checked``: its logits and padding check)."""
        logits["fast"] = checked[0]
        # Three rows ran in the bucket of four: the padding row wrote the null block, no block of the pool's others
        # (rank 0's cache under tensor parallel).
        padding_ok = checked[1] and bool(fast.engine.cache_k[:, 0, :, 0].float().abs().sum() > 0)
        result = {
            "padding_wrote_scratch_only": padding_ok,
            "decode_path": fast.describe()["decode_path"], "weight_bytes_fast": fast.describe()["weight_bytes"],
            "fast_vs_fp32": rel("fast", "fp32"),
            "fast_logits_sha": hashlib.sha256(logits["fast"].numpy().tobytes()).hexdigest()[:16],
            "argmax_equal": logits["fast"].argmax(-1).tolist() == logits["eager"].argmax(-1).tolist(),
            "world_size": fast.describe()["world_size"], **references,
        }
        if "greedy" in parts:
            result["greedy_fast"] = [c.token_ids for c in fast.generate(prompts, greedy)]
        if "ending" in parts:
            result["ending_fast"] = [c.token_ids for c in fast.generate(prompts, ending)]
        # continuous batching: with three requests of four tokens, fast steps of 1, 2, 3 (the bucket of 4, one
        # padding row), 2 and 1 rows: every bucket, two steps of the costliest under the interpreter, batch 1's
        result["staggered_fast"] = staggered(fast, prompts, greedy)
        result["chained_steps"] = fast.phase_rows["chained_steps"]  # decode steps fed the previous one's argmax
        return result

    result = fast_results(fast, checked["fast"], parts)
    if "ending" in parts:
        result["ending_eager"] = [c.token_ids for c in eager.generate(prompts, ending)]
    result["staggered_eager"] = references["staggered_eager"] = staggered(eager, prompts, greedy)
    if "prefill" in parts:  # prompts short enough to be rows of a fast step beside the decodes (runtime._split)
        short = [p[:3] for p in prompts]
        before = fast.phase_rows["fast_prefill_rows"]
        result["prefill_fast"] = staggered(fast, short, greedy)
        result["prefill_fast_rows"] = fast.phase_rows["fast_prefill_rows"] - before
        result["prefill_eager"] = staggered(eager, short, greedy)
        # where the two part: whether each is eager's greedy choice within bfloat16 rounding at every token (the
        # random tiny model has near ties; a wrong key or position is far from any)
        result["prefill_parted_near_ties"] = all(
            near_greedy(eager, p, f, tol=0.1) and near_greedy(eager, p, e, tol=0.1)
            for p, f, e in zip(short, result["prefill_fast"], result["prefill_eager"]) if f != e)
    result.update(kernel_buckets(fast))
    fast.close()
    variants = json.loads(os.environ.get("FAST_CHECK_VARIANTS", "{}"))
    if variants:
        result["variants"] = {}
    for name, env in variants.items():
        with mock.patch.dict(os.environ, env):  # (the kernel switches are read as the runtime is made)
            fast = runtime(ckpt, "bfloat16", True, tp_mode)
            # (no lockstep greedy run: a variant's kernels are checked by its first step's logits and the staggered
            # run, steps of 1-3 rows at unlike positions in every bucket; the lockstep run's bucket-4 steps of rows
            # at one position are the main runtime's check)
            result["variants"][name] = {**fast_results(fast, first_step_logits(fast, prompts, [7, 8, 9]),
                                                       parts - {"greedy"}), **kernel_buckets(fast)}
            fast.close()
    if os.environ.get("FAST_CHECK_LIBRARY") == "1":  # the same checks with buckets 2 and 4 on cuBLAS's linears
        from trtllm_pipeline.runtimes.torch_engine.cuda import decode_step, graphs

        decode_step.LIBRARY_MIN_BATCH = 2
        graphs.MAX_FAST_ROWS = 2  # bucket 4 past the one-tile kernels' limit: it runs because cuBLAS takes its linears
        library = runtime(ckpt, "bfloat16", True, tp_mode)
        logits["library"], padding = first_step_logits(library, prompts, [7, 8, 9])
        result.update({
            "library_buckets": library.decoder.buckets,
            "library_configs": sorted({c.library for c in library.decoder.buffers[4].configs.values()}),
            "library_bucket1_kernels": not any(c.library for c in library.decoder.buffers[1].configs.values()),
            "library_padding_wrote_scratch_only": padding,
            "library_vs_fp32": rel("library", "fp32"), "library_vs_eager": rel("library", "eager"),
            "library_argmax_equal": logits["library"].argmax(-1).tolist() == logits["eager"].argmax(-1).tolist(),
        })
        if "greedy" in parts:
            result["library_greedy"] = [c.token_ids for c in library.generate(prompts, greedy)]
        result["library_staggered"] = staggered(library, prompts, greedy)
        library.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
