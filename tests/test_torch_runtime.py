"""The torch runtime: the same numbers as the reference models, and correct scheduling and sampling."""

from __future__ import annotations

import pytest
import torch

from conftest import load
from near_ties import assert_same_or_tied
from trtllm_pipeline import checkpoint, quantize
from trtllm_pipeline.runtimes.base import SamplingParams, TextStream
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

PROMPT = list(range(100, 164))


def _runtime(built, engines_dir, name, **kw) -> TorchRuntime:
    result = built(name)
    if kw:
        ckpt = result.engine_dir.parent / "checkpoint"
        return TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=1024, **kw)
    return load_runtime(load(name), engines_dir)


def _logits(rt: TorchRuntime, ids: list[int]) -> torch.Tensor:
    return rt.engine.logits(rt.hidden_states(ids))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _hf(model_dir, dtype: str):
    model, _ = quantize._load(model_dir, dtype, "cpu")
    return model


def test_bf16_runtime_matches_hf_within_bf16_rounding(built, engines_dir):
    name = "tiny-qwen2-bf16-tp1"
    model_dir = built(name).manifest and quantize.resolve_model(load(name).model).model_dir
    with torch.no_grad():
        hf_bf16 = _hf(model_dir, "bfloat16")(torch.tensor([PROMPT])).logits[0].float()
        hf_fp32 = _hf(model_dir, "float32")(torch.tensor([PROMPT])).logits[0].float()
    ours_bf16 = _logits(_runtime(built, engines_dir, name, dtype="bfloat16"), PROMPT)
    ours_fp32 = _logits(_runtime(built, engines_dir, name, dtype="float32"), PROMPT)
    bf16_noise = _rel(hf_bf16, hf_fp32)  # what bf16 arithmetic alone costs on this model
    assert _rel(ours_fp32, hf_fp32) < 1e-5  # same math
    assert _rel(ours_bf16, hf_fp32) < 2 * bf16_noise
    assert _rel(ours_bf16, hf_bf16) < 3 * bf16_noise


def _fake_quantized_reference(cfg, ckpt_dir, dtype: str):
    """ModelOpt's fake-quantized model carrying the exported checkpoint's weights and scales.

    The export merges q/k/v and gate/up onto one scale each (as TensorRT-LLM fuses them), so the
    calibrated model is given the exported FP8 weights and every quantizer the exported amax.
    """
    model_dir = quantize.resolve_model(cfg.model).model_dir
    model, tokenizer = quantize._load(model_dir, dtype, "cpu")
    model = quantize._calibrate(cfg, model, tokenizer, "cpu")
    config, tensors = checkpoint.load_checkpoint(ckpt_dir)
    layout = checkpoint.CheckpointLayout(config)
    q, kv = layout.heads * layout.head_size, layout.kv_heads * layout.head_size
    rows = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
    targets = {"q_proj": "attention.qkv", "k_proj": "attention.qkv", "v_proj": "attention.qkv",
               "o_proj": "attention.dense", "gate_proj": "mlp.fc", "up_proj": "mlp.gate", "down_proj": "mlp.proj"}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for parent in (layer.self_attn, layer.mlp):
                for hf_name, trt in targets.items():
                    module = getattr(parent, hf_name, None)
                    if module is None:
                        continue
                    p = f"transformer.layers.{i}.{trt}."
                    w_scale, a_scale = tensors[p + "weights_scaling_factor"].float(), tensors[p + "activation_scaling_factor"].float()
                    weight = tensors[p + "weight"].float() * w_scale
                    module.weight.copy_(weight[rows[hf_name]] if hf_name in rows else weight)
                    module.weight_quantizer.amax = (w_scale * 448).reshape(())
                    module.input_quantizer.amax = (a_scale * 448).reshape(())
    return model


def test_fp8_runtime_matches_modelopt_fake_quantized_model(built, engines_dir):
    name = "tiny-qwen2-fp8-tp1"
    cfg = load(name)
    ckpt = built(name).engine_dir.parent / "checkpoint"
    # float32 compute isolates the FP8 math: on this random model, bf16 rounding alone flips FP8
    # roundings of activations and moves logits by several percent between any two implementations.
    reference = _fake_quantized_reference(cfg, ckpt, "float32")
    with torch.no_grad():
        ref = reference(torch.tensor([PROMPT])).logits[0].float()
    ours = _logits(_runtime(built, engines_dir, name, dtype="float32"), PROMPT)
    assert _rel(ours, ref) < 1e-2
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def _greedy(rt, prompts, n=24):
    return [c.token_ids for c in rt.generate(prompts, SamplingParams(max_tokens=n, end_id=-1))]


def test_greedy_tokens_identical_across_tp_merged(built, engines_dir):
    """Merged shards are the tp=1 model bit for bit (the distributed path: tests/test_tensor_parallel.py)."""
    prompts = [PROMPT, list(range(300, 340))]
    outs = []
    for tp in (1, 2, 4):
        built(f"tiny-qwen2-fp8-tp{tp}")
        rt = load_runtime(load(f"tiny-qwen2-fp8-tp{tp}").with_runtime(tp_mode="merged"), engines_dir)
        assert rt.describe()["tp_mode"] == "merged" and rt.describe()["world_size"] == 1
        outs.append(_greedy(rt, prompts))
    assert outs[0] == outs[1] == outs[2]
    assert all(len(t) == 24 for t in outs[0])


def test_continuous_batching_matches_one_at_a_time(built, engines_dir):
    # The unquantized model: on a host whose float32 GEMM is not row-invariant, FP8's activation rounding turns a
    # last-bit difference into a logit 0.1 away (seen: tiny FP8, one thread, Sapphire Rapids), past any tie
    rt = _runtime(built, engines_dir, "tiny-qwen2-bf16-tp1", dtype="float32")
    rt.max_batch_size = 2  # five requests through two slots: admissions while others decode
    prompts = [list(range(100 + 7 * i, 120 + 13 * i)) for i in range(5)]
    together = _greedy(rt, prompts, n=12)
    alone = [_greedy(rt, [p], n=12)[0] for p in prompts]
    assert_same_or_tied(rt, prompts, together, alone)  # (a host whose GEMM is not row-invariant: tests/near_ties.py)


def test_score_matches_a_full_forward_and_shares_prefixes(built, engines_dir):
    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1", dtype="float32")
    prefix = list(range(200, 260))
    contexts = [prefix + [5, 6, 7], prefix + [8, 9], prefix + [5, 6, 7], prefix + [10]]
    continuations = [[11], [12, 13], [14], [15, 16, 17]]
    scored = rt.score(contexts, continuations)
    for (ctx, cont), (logprob, greedy) in zip(zip(contexts, continuations), scored):
        full = torch.log_softmax(_logits(rt, ctx + cont), dim=-1)
        rows = full[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
        want = float(rows.gather(-1, torch.tensor(cont)[:, None]).sum())
        assert logprob == pytest.approx(want, abs=1e-4)
        assert greedy == bool(torch.equal(rows.argmax(-1), torch.tensor(cont)))
    # The argmax continuation is reported as greedy.
    best = int(torch.argmax(_logits(rt, contexts[1])[-1]))
    assert rt.score([contexts[1]], [[best]])[0][1] is True


def test_sampling_is_seeded_and_top_k_1_is_greedy(built, engines_dir):
    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    sampled = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=7, end_id=-1)
    first = rt.generate([PROMPT], sampled)[0].token_ids
    assert rt.generate([PROMPT], sampled)[0].token_ids == first
    other = rt.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.0, seed=8, end_id=-1))[0].token_ids
    assert other != first
    top1 = rt.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.0, top_k=1, seed=3, end_id=-1))[0]
    assert top1.token_ids == _greedy(rt, [PROMPT], n=16)[0]


def test_end_id_min_tokens_and_stop_words(built, engines_dir):
    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    greedy = _greedy(rt, [PROMPT], n=12)[0]
    stop_at = greedy[4]
    first = greedy.index(stop_at)
    ended = rt.generate([PROMPT], SamplingParams(max_tokens=12, end_id=stop_at))[0]
    assert ended.token_ids == greedy[:first] and ended.finish_reason == "end_id"
    longer = rt.generate([PROMPT], SamplingParams(max_tokens=12, end_id=stop_at, min_tokens=first + 1))[0]
    assert len(longer.token_ids) > first and stop_at not in longer.token_ids[: first + 1]
    full_text = rt.tokenizer.decode(greedy, skip_special_tokens=True)
    needle = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    stopped = rt.generate([PROMPT], SamplingParams(max_tokens=12, end_id=-1, stop_words=(needle,)))[0]
    assert stopped.finish_reason == "stop" and stopped.text == full_text[: full_text.index(needle)]


def test_text_stream_holds_back_partial_characters_and_stop_prefixes(built, engines_dir):
    tok = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1").tokenizer
    text = "naïve 日本 done"
    ids = tok.encode(text, add_special_tokens=False)
    stream = TextStream(tok, stop_words=("done",))
    pieces = [stream.push([t]) for t in ids]
    pieces.append(stream.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "naïve 日本 " and stream.stopped


def test_invalid_requests_are_refused(built, engines_dir):
    from trtllm_pipeline.errors import InputError

    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    with pytest.raises(InputError, match="empty"):
        rt.submit("a", [], SamplingParams())
    with pytest.raises(InputError, match="at most"):
        rt.submit("b", [1] * (rt.max_input_len + 1), SamplingParams())
    with pytest.raises(InputError, match="outside the vocabulary"):
        rt.submit("c", [rt.vocab_size + 5], SamplingParams())
    assert not rt.has_work()


def test_text_stream_equals_decoding_the_whole_output(built, engines_dir):
    """Windowed incremental decoding gives exactly the text of decoding everything at once, also for
    random token soup (byte tokens that split or break UTF-8 characters, special tokens)."""
    tok = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1").tokenizer
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        # Half the tokens from the first 256 ids, the byte alphabet of a byte-level BPE: partial characters.
        ids = torch.where(torch.rand(n, generator=gen) < 0.5, torch.randint(256, (n,), generator=gen),
                          torch.randint(len(tok), (n,), generator=gen)).tolist()
        stream = TextStream(tok)
        pieces = [stream.push([t]) for t in ids] + [stream.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


# --------------------------------------------------------------------------- one request cannot hurt the others

POISON = [
    ({"temperature": float("nan")}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"), ({"top_k": -3}, "top_k"), ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"), ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"), ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": True}, "temperature"), ({"end_id": 10**9}, "end_id"),
]


@pytest.mark.parametrize(("params", "field"), POISON, ids=[",".join(f"{k}={v}" for k, v in p.items()) for p, _ in POISON])
def test_poison_sampling_params_are_refused_at_submit(built, engines_dir, params, field):
    from trtllm_pipeline.errors import InputError

    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    with pytest.raises(InputError, match=field):
        rt.submit("poison", PROMPT, SamplingParams(**params))
    assert not rt.has_work()


def test_a_vanishing_temperature_samples_the_greedy_tokens(built, engines_dir):
    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    tiny = rt.generate([PROMPT], SamplingParams(max_tokens=8, temperature=1e-45, top_k=5, seed=1, end_id=-1))[0]
    assert tiny.token_ids == _greedy(rt, [PROMPT], n=8)[0]


def _run_all(rt, prompts, params):
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        rt.submit(i, prompt, p)
    tokens, finished = {i: [] for i in range(len(prompts))}, {}
    while rt.has_work():
        for event in rt.step():
            tokens[event.request_id] += event.token_ids
            if event.finish_reason:
                finished[event.request_id] = (event.finish_reason, event.error)
    return tokens, finished


def test_a_request_that_fails_inside_a_step_fails_alone(built, engines_dir, monkeypatch):
    from trtllm_pipeline.runtimes.torch_engine import sampling
    from trtllm_pipeline.runtimes.base import RequestFailed

    rt = _runtime(built, engines_dir, "tiny-qwen2-fp8-tp1")
    prompts = [PROMPT, list(range(300, 340)), list(range(400, 420))]
    params = [SamplingParams(max_tokens=10, end_id=-1),
              SamplingParams(max_tokens=10, temperature=0.9, top_k=20, seed=5, end_id=-1),
              SamplingParams(max_tokens=10, temperature=0.9, seed=666, end_id=-1)]  # the one that will fail
    alone = [rt.generate([p], q)[0].token_ids for p, q in zip(prompts[:2], params[:2])]
    real = sampling.sample

    def sample(logits, rows, greedy=None):  # a sampler that fails on one request's row from its 4th token on
        if any(r.params.seed == 666 for r in rows):
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, rows, greedy)

    calls: list = []
    monkeypatch.setattr(sampling, "sample", sample)
    tokens, finished = _run_all(rt, prompts, params)
    assert [tokens[0], tokens[1]] == alone  # the others: exactly their tokens, seeded sampling included
    assert finished[0] == finished[1] == ("length", None)
    assert finished[2][0] == "error" and "probability tensor" in finished[2][1]
    assert not rt.has_work() and not rt.scheduler.running and rt.kv.free_blocks == rt.kv.usable_blocks
    # A forward pass that fails for one request's row: that request alone is dropped.
    real_forward = rt._forward
    monkeypatch.setattr(rt, "_forward", lambda rows: (_ for _ in ()).throw(RuntimeError("boom"))
                        if any(r.request_id == 2 for r in rows) else real_forward(rows))
    tokens, finished = _run_all(rt, prompts, [SamplingParams(max_tokens=10, end_id=-1)] * 3)
    assert tokens[0] == alone[0] and finished[2] == ("error", "RuntimeError: boom")
    # In-process generate: the failure is raised, and the runtime is idle and usable afterwards.
    with pytest.raises(RequestFailed, match="boom"):
        rt.generate(prompts, SamplingParams(max_tokens=10, end_id=-1))
    assert not rt.has_work()
    monkeypatch.setattr(rt, "_forward", real_forward)
    assert _greedy(rt, [PROMPT], n=10)[0] == alone[0]


def test_a_kv_cache_that_cannot_fit_is_refused_before_it_is_allocated(built, engines_dir, monkeypatch):
    from trtllm_pipeline.errors import UnavailableError
    from trtllm_pipeline.runtimes.torch_engine import executor

    monkeypatch.setattr(executor, "device_free_bytes", lambda device: 2**30)  # whatever this machine has
    ckpt = built("tiny-qwen2-fp8-tp1").engine_dir.parent / "checkpoint"
    with pytest.raises(UnavailableError, match=r"KV cache for build.max_batch_size 4096 x build.max_seq_len 8192 "
                                               r"needs [\d.]+ GiB") as exc:
        TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4096, max_seq_len=8192, dtype="float32")
    assert "lower build.max_batch_size" in exc.value.fix
