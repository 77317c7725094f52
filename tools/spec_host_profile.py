"""The host's cost of one step of the torch runtime's generate loop on the fast path's code, plain decoding against
n-gram speculation, on a machine without a GPU (docs/perf-notes.md, "SmolLM2 at batch 1").

On a model as small as SmolLM2-135M a step is mostly host work, which the CPU can time: ``TorchRuntime.step()`` whole
(proposer, scheduler, ``DecodeGraphs``' host side: table rows, inputs, buffers; settling, acceptance, recording)
with only the device step replaced by a scripted "model" whose greedy token after position p is ``SCRIPT[p + 1]``:
a passage's spans copied with an edit between them, so prompt lookup hits as on a grounded prompt. Times are the
thread's CPU seconds (this machine is shared), torch on one thread; the scripted step's own time is taken out.
The prefill runs the real (tiny) model eagerly and is outside the clock.

    python -m trtllm_pipeline quantize -c build_configs/tiny-qwen2-bf16-tp1.yaml --engines-dir /tmp/engines
    python tools/spec_host_profile.py /tmp/engines/tiny-qwen2-bf16-tp1/checkpoint [--tokens 400] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import random
import time
import types
from pathlib import Path

import torch

from trtllm_pipeline import checkpoint
from trtllm_pipeline.config import SpeculativeSection
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


def script(vocab: int, seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """(prompt, every position's next token): a 300-token passage, then spans of 4-30 of its tokens with one token
    of no span after each (where prompt lookup finds nothing for a step or two)."""
    rng = random.Random(seed)
    passage = [rng.randrange(100, vocab) for _ in range(300)]
    prompt = [1, 2, 3] + passage + [4, 5]
    out: list[int] = []
    while len(out) < 2000:
        n = rng.randrange(4, 30)
        start = rng.randrange(0, len(passage) - n)
        out += passage[start : start + n] + [rng.randrange(100, vocab)]
    return prompt, torch.tensor(prompt + out + [0] * 4096)


@dataclasses.dataclass
class _Buffers:  # the fields of cuda.decode_step.StepBuffers that DecodeGraphs reads
    inputs: torch.Tensor
    logits: torch.Tensor
    greedy: torch.Tensor
    attention_passes: int = 1


class ScriptedStep:
    """In place of ``cuda.decode_step.DecodeStep``: one-hot logits of the script's next token at each row's position."""

    def __init__(self, width: int, vocab: int, following: torch.Tensor):
        self.engine = types.SimpleNamespace(slot_blocks=width, device=torch.device("cpu"))
        self.vocab, self.following, self.seconds = vocab, following, 0.0

    def buffers(self, batch: int, tables: torch.Tensor) -> _Buffers:
        return _Buffers(torch.zeros(3, batch, dtype=torch.long), torch.zeros(batch, self.vocab),
                        torch.zeros(batch, dtype=torch.long))

    def run(self, buf: _Buffers) -> None:
        start = time.thread_time()
        nxt = self.following[buf.inputs[1] + 1]
        buf.logits.zero_()
        buf.logits[torch.arange(len(nxt)), nxt] = 1.0
        buf.greedy.copy_(nxt)
        self.seconds += time.thread_time() - start

    def pin_carveout(self, buf) -> None:
        pass


def runtime(ckpt: Path, spec: bool, k: int, following: torch.Tensor) -> tuple[TorchRuntime, ScriptedStep]:
    settings = SpeculativeSection(method="ngram", num_draft_tokens=k) if spec else None
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=8, max_seq_len=4096, dtype="float32",
                      speculative=settings)
    step = ScriptedStep(rt.engine.slot_blocks, rt.vocab_size, following)
    rt.decoder = DecodeGraphs(step, [1, 2, 4, 8] + ([8 * (1 + k)] if spec else []), use_graphs=False)
    rt.decoder.prepare()
    if spec:
        rt.decoder.prepare_verify()
    return rt, step


def generate(rt: TorchRuntime, step: ScriptedStep, prompt: list[int], n: int, prof: cProfile.Profile | None = None):
    """(tokens, steps, host seconds) of one request's decode steps, the prefill step left out."""
    rt.submit("r", prompt, SamplingParams(max_tokens=n, end_id=-1))
    rt.step()
    tokens, steps = [], 0
    start, scripted = time.thread_time(), step.seconds
    if prof:
        prof.enable()
    while rt.has_work():
        for event in rt.step():
            tokens += event.token_ids
        steps += 1
    if prof:
        prof.disable()
    return tokens, steps, time.thread_time() - start - (step.seconds - scripted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="a tiny model's checkpoint directory (see the module's docstring)")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("-k", type=int, default=4, help="draft tokens (runtime.speculative.num_draft_tokens)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode; the fastest is reported")
    ap.add_argument("--profile", action="store_true", help="then one more run of each under cProfile")
    args = ap.parse_args()
    torch.set_num_threads(1)
    outputs = {}
    for spec in (False, True):
        prompt, following = script(int(checkpoint.read_config(args.checkpoint)["vocab_size"]))
        rt, step = runtime(args.checkpoint, spec, args.k, following)
        generate(rt, step, prompt, 16)  # allocator, first calls
        tokens, steps, host = min((generate(rt, step, prompt, args.tokens) for _ in range(args.repeats)),
                                  key=lambda r: r[2])
        outputs[spec] = tokens
        stats = rt.stats()
        extra = f", acceptance length {stats['spec_decode_acceptance_length']:.2f}" if spec else ""
        print(f"{'speculative' if spec else 'plain':>11}: {len(tokens)} tokens in {steps} steps: host "
              f"{1e3 * host / steps:.3f} ms/step, {1e6 * host / len(tokens):.1f} us/token{extra}")
        if args.profile:
            prof = cProfile.Profile()
            generate(rt, step, prompt, args.tokens, prof)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    print(f"same tokens: {outputs[False] == outputs[True]}")


if __name__ == "__main__":
    main()
