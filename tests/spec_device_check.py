"""Run by tests/test_fast_decode.py in a subprocess: prompt lookup drafted on the device (``cuda.drafted``), its verify
steps chained on the running step, through Triton's interpreter on the CPU, against the same fast path without
speculation and against eager decoding. Two models: the tiny random one (its drafts are rejected: a random model
does not repeat its prompt) and a copy of it that repeats what its context held (mlp.proj zero, attention.dense
scaled to 0.03: the next token nearly a function of the current one, attention still moving it), whose prompts
hold its own continuation, so drafts are accepted, some runs whole. Prints JSON.

    python tests/spec_device_check.py CHECKPOINT_DIR SCRATCH_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import triton_interpreter  # noqa: F401  (before any kernel module is imported)
from safetensors.torch import load_file, save_file

from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

ARGS = dict(device="cpu", dtype="bfloat16", max_batch_size=2, max_seq_len=64, kv_block_size=4,
            graph_batch_sizes=[1, 2])
SETTINGS = types.SimpleNamespace(method="ngram", num_draft_tokens=3, adaptive=True, ngram_min=1, ngram_max=3, tree=None)


def greedy(rt: TorchRuntime, prompts, n: int, end_id: int = -1) -> list[list[int]]:
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=n, end_id=end_id))]


def counted(rt: TorchRuntime) -> dict:
    """Fast steps with a pending tracked row (their tokens made on the device), by kind."""
    calls = {"verify": 0, "decode": 0}
    for kind in calls:
        inner = getattr(rt.decoder, kind)

        def wrapped(*a, _inner=inner, _kind=kind, **kw):
            calls[_kind] += 2 in (kw.get("tracked") or ())
            return _inner(*a, **kw)

        setattr(rt.decoder, kind, wrapped)
    return calls


def copying_model(ckpt: Path, scratch: Path) -> Path:
    out = scratch / "copying"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(ckpt, out)
    (out / "manifest.json").unlink(missing_ok=True)  # (its record of the tensors quantize wrote: these differ)
    tensors = load_file(out / "rank0.safetensors")
    for name, t in tensors.items():
        if name.endswith(("attention.dense.weight", "mlp.proj.weight")):
            tensors[name] = (t.float() * (0.03 if "dense" in name else 0.0)).to(t.dtype)
    save_file(tensors, out / "rank0.safetensors")
    return out


def main() -> None:
    ckpt, scratch = Path(sys.argv[1]), Path(sys.argv[2])
    result = {}
    # the random model: drafts rejected, verify rows chained on the device's tokens all the same
    fast = TorchRuntime(ckpt, ckpt / "tokenizer", fast_decode=True, speculative=SETTINGS, **ARGS)
    calls = counted(fast)
    prompts = [[301, 302, 303, 304, 301, 302, 303, 304, 301, 302], [11, 12, 13]]
    result["random"] = greedy(fast, prompts, 8)
    fast.speculator.enabled = False
    result["random_plain"] = greedy(fast, prompts, 8)
    result["random_pending"] = dict(calls)
    result["device_drafting"], result["describe"] = fast.device_drafting, fast.describe()["speculative"]
    # the copying model: each prompt a token, its own continuation, the token again
    model = copying_model(ckpt, scratch)
    eager = TorchRuntime(model, model / "tokenizer", fast_decode=False, **ARGS)
    paths = greedy(eager, [[301], [900]], 10)
    prompts = [[t, *path, t] for t, path in zip((301, 900), paths)]
    result["expected"] = greedy(eager, prompts, 14)
    fast = TorchRuntime(model, model / "tokenizer", fast_decode=True, speculative=SETTINGS, **ARGS)
    calls = counted(fast)
    result["copy"] = greedy(fast, prompts, 14)
    fast.kv.check()
    stats = fast.stats()
    result["accepted"], result["drafted"] = stats["spec_decode_accepted_tokens"], stats["spec_decode_draft_tokens"]
    result["chained"] = stats["steps_chained"]
    result["copy_pending"] = dict(calls)
    result["alone"] = greedy(fast, prompts[:1], 10)  # batch 1: the case
    end_id = result["expected"][0][6]  # ends inside a run of kept drafts
    result["ended"] = greedy(fast, prompts, 14, end_id)
    result["ended_eager"] = greedy(eager, prompts, 14, end_id)
    fast.kv.check()
    result["blocks_back"] = fast.kv.free_blocks == fast.kv.usable_blocks
    print(json.dumps(result))


if __name__ == "__main__":
    main()
