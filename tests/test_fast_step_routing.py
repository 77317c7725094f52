"""Which rows of a step the torch runtime gives its fast path, and which of their logits it reads back (``_split``,
``_run_fast``, ``_settle``), on the CPU without Triton's interpreter: the runtime's ``DecodeGraphs`` over a decode step
that runs no model and "predicts" each position's token + 1. A request's first token then tells which position's
prediction was read (its prompt's last, wherever the prompt ran), and every later one that it fed its own token back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from continuous_batching import staggered
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine import runtime as runtime_module
from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import DecodeGraphs
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime


@dataclasses.dataclass
class _Buffers:  # what the host side of DecodeGraphs reads and writes of decode_step.StepBuffers
    batch: int
    inputs: torch.Tensor
    logits: torch.Tensor
    greedy: torch.Tensor
    attention_passes: int = 1


class _PlusOne:
    """A decode step whose prediction at each row is the row's token + 1; rows and passes counted."""

    def __init__(self, engine, vocab: int):
        self.engine, self.vocab, self.rows = engine, vocab, []

    def buffers(self, batch: int, tables):
        return _Buffers(batch, torch.zeros((3, batch), dtype=torch.long), torch.zeros((batch, self.vocab)),
                        torch.zeros(batch, dtype=torch.long))

    def run(self, buf) -> None:
        torch.remainder(buf.inputs[0] + 1, self.vocab, out=buf.greedy)
        buf.logits.zero_()
        buf.logits[torch.arange(buf.batch), buf.greedy] = 1.0
        self.rows.append(buf.batch)

    def weight_bytes(self) -> int:
        return 0


@pytest.fixture
def runtime(built):
    ckpt = built("tiny-qwen2-bf16-tp1").engine_dir.parent / "checkpoint"
    rt = TorchRuntime(ckpt, ckpt / "tokenizer", device="cpu", max_batch_size=4, max_seq_len=256, fast_decode=False)
    rt.decoder = DecodeGraphs(_PlusOne(rt.engine, rt.vocab_size), [1, 2, 4, 8], use_graphs=False)
    rt.decoder.prepare()
    rt.overlap = runtime_module.overlap_enabled()  # as the runtime sets it where it made a decoder itself
    yield rt
    rt.close()


def test_short_prompts_prefill_as_rows_of_fast_steps_beside_the_decodes(runtime):
    # 3 + 5 fit the largest bucket (8) beside one decode; 9 tokens never fit: eager; 2 joins three decodes
    prompts = [list(range(10, 13)), list(range(20, 25)), list(range(30, 39)), list(range(40, 42))]
    out = staggered(runtime, prompts, SamplingParams(max_tokens=5, end_id=-1))
    for i, prompt in enumerate(prompts):
        if len(prompt) <= 8:  # read at the prompt's last position of the fast step, then its own tokens fed back
            assert out[i] == [prompt[-1] + 1 + j for j in range(5)], i
        else:  # the eager model's first token (the tiny random model's), then the fast path's +1 from it
            assert out[i][1:] == [out[i][0] + 1 + j for j in range(4)], i
    assert runtime.phase_rows["fast_prefill_rows"] == 3
    assert runtime.phase_rows["eager_rows"] == 1  # the 9-token prompt
    assert max(runtime.decoder.step.rows) == 8  # a prefill's rows and the decodes in one bucket


def test_fast_prefill_can_be_turned_off(runtime, monkeypatch):
    monkeypatch.setenv("TRTLLM_PIPELINE_FAST_PREFILL", "0")
    assert not runtime_module.fast_prefill_enabled()
    prompts = [list(range(10, 13)), list(range(20, 25))]
    out = staggered(runtime, prompts, SamplingParams(max_tokens=3, end_id=-1))
    assert runtime.phase_rows["fast_prefill_rows"] == 0 and runtime.phase_rows["eager_rows"] == 2
    assert all(t[1:] == [t[0] + 1, t[0] + 2] for t in out)


def test_a_decode_step_samples_every_row_without_gathering_its_logits(runtime, monkeypatch):
    """All rows sampled in order: the step's logits go to the sampler as they are, the decode buffer itself (no
    indexed copy of [rows, vocab] float32 logits each step)."""
    own = []
    real = runtime_module.TorchRuntime._sample

    def spy(self, reqs, logits, greedy=None):
        own.append(logits.data_ptr() in {b.logits.data_ptr() for b in self.decoder.buffers.values()})
        return real(self, reqs, logits, greedy)

    monkeypatch.setattr(runtime_module.TorchRuntime, "_sample", spy)
    staggered(runtime, [list(range(10, 13)), list(range(20, 22))], SamplingParams(max_tokens=4, end_id=-1))
    assert own.count(True) >= 3 and False in own  # decode steps: the buffer; a prefill's last position: a copy


def test_decode_steps_left_running_give_their_tokens_at_the_next_step(runtime):
    """Overlap (``_may_leave_running``): a decode step is launched and its tokens come back from the next ``step()``,
    so the caller handles one step's events while the next one runs; the tokens are those of the synchronous
    path."""
    prompts = [list(range(10, 13)), list(range(20, 25)), list(range(30, 39))]
    params = SamplingParams(max_tokens=6, end_id=-1)
    assert runtime.overlap
    overlapped = staggered(runtime, prompts, params)
    runtime.overlap = False
    synchronous = staggered(runtime, prompts, params)
    assert overlapped == synchronous and all(len(t) == 6 for t in overlapped)
    runtime.overlap = True
    runtime.submit("a", list(range(50, 53)), params)
    assert runtime.step()[0].token_ids == [53]  # the prompt's token, from its (synchronous) prefill step
    assert runtime.step() == [] and runtime._launched is not None  # its first decode step, left running
    assert [e.token_ids for e in runtime.step()] == [[54]]  # ... read as the next one is launched


def test_a_request_cancelled_while_its_decode_step_runs_is_skipped(runtime):
    params = SamplingParams(max_tokens=8, end_id=-1)
    runtime.submit("a", list(range(10, 13)), params)
    runtime.submit("b", list(range(20, 23)), params)
    while runtime._launched is None:
        runtime.step()
    runtime.cancel("a")
    events = runtime.step()
    assert [e.request_id for e in events] == ["b"] and not any(e.finish_reason == "error" for e in events)
    rest = []
    while runtime.has_work():
        rest += runtime.step()
    assert {e.request_id for e in rest} == {"b"} and rest[-1].finish_reason == "length"
    assert runtime.kv.free_blocks == runtime.kv.usable_blocks and not runtime.kv.tables  # every block back
