"""EAGLE-3 draft heads (``runtime.speculative.method: eagle3``) on CPU against the tiny Qwen2 target: a synthetic head
written in the upstream checkpoint layout (random weights: no EAGLE-3 weights can be fetched here) loads, is checked
against the target, drafts, and greedy output stays plain greedy's token for token; drafts made incrementally (the
head's KV rolled back past rejected drafts) are the drafts a fresh proposer makes from the whole history; each
refusal names its fix and exits 2; the contract itself is pinned against the upstream sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, run_cli
from spec_oracle import greedy
from safetensors.torch import save_file

from trtllm_pipeline.config import SpeculativeSection, config_from_dict
from trtllm_pipeline.errors import ConfigError, InputError
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime
from trtllm_pipeline.runtimes.torch_engine.speculative import eagle3_checkpoint
from trtllm_pipeline.runtimes.torch_engine.speculative.eagle3 import Eagle3Proposer
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import DraftRequest

NAME = "tiny-qwen2-bf16-tp1"  # the target: 4 layers, hidden 128, vocabulary 8192
PASSAGE = list(range(3000, 3030))
PROMPTS = [PASSAGE + [7, 8] + PASSAGE[:6], list(range(4000, 4021)), PASSAGE[5:] + PASSAGE[:9],
           [11, 12, 13, 11, 12, 13, 11, 12]]
DRAFT_VOCAB = 512
FREQUENT = 1448  # a token the tiny target writes twice in PROMPTS' greedy outputs (a constant draft of it is kept)


@pytest.fixture(scope="module")
def ckpt(built):
    return built(NAME).engine_dir.parent / "checkpoint"


def _rt(ckpt, spec: dict | None = None) -> TorchRuntime:
    return TorchRuntime(ckpt, ckpt / "tokenizer", max_batch_size=4, max_seq_len=256, dtype="float32",
                        kv_block_size=4, speculative=SpeculativeSection(**spec) if spec else None)


def _greedy(rt, prompts=PROMPTS, n=24):
    return greedy(rt, prompts, n, check=True)  # the target's allocator checked after every rollback


@pytest.fixture(scope="module")
def expected(ckpt):
    return _greedy(_rt(ckpt))


def write_head(directory: Path, *, seed: int = 0, config: dict | None = None, drop: tuple[str, ...] = (),
               replace: dict | None = None, zero_head: bool = False) -> Path:
    """A synthetic EAGLE-3 head for the tiny target in the upstream layout (config.json + model.safetensors, names
    as SafeAILab/EAGLE saves them and SGLang / vLLM load them; ``eagle3_checkpoint``'s docstring cites the files):
    hidden 128 (the target's, so the embedding is shared), 4 heads / 2 KV heads of 32, MLP 256, a draft vocabulary
    of 512 target ids (``d2t``, ``t2d``), reading the target's streams through eagle_config's ids [1, 2, 3] (first id
    1: outputs of layers 1, 2, 3, i.e. the streams entering layers 2, 3 and leaving the last). ``zero_head``: lm_head
    all zeros, so every draft is draft id 0, which d2t maps to FREQUENT."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 128,
           "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
           "vocab_size": 8192, "draft_vocab_size": DRAFT_VOCAB, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
           **(config or {})}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def w(*shape, std=0.2):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    others = torch.randperm(8192, generator=g)
    others = others[others != FREQUENT][: DRAFT_VOCAB - 1].sort().values
    targets = torch.cat([torch.tensor([FREQUENT]), others])  # draft id 0 -> FREQUENT
    t2d = torch.zeros(8192, dtype=torch.bool)
    t2d[targets] = True
    tensors = {
        "fc.weight": w(h, 3 * 128, std=0.05),
        "midlayer.input_layernorm.weight": norm(h), "midlayer.hidden_norm.weight": norm(h),
        "midlayer.self_attn.q_proj.weight": w(q, 2 * h), "midlayer.self_attn.k_proj.weight": w(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(kv, 2 * h), "midlayer.self_attn.o_proj.weight": w(h, q),
        "midlayer.post_attention_layernorm.weight": norm(h),
        "midlayer.mlp.gate_proj.weight": w(inter, h), "midlayer.mlp.up_proj.weight": w(inter, h),
        "midlayer.mlp.down_proj.weight": w(h, inter),
        "norm.weight": norm(h),
        "lm_head.weight": torch.zeros(DRAFT_VOCAB, h, dtype=torch.bfloat16) if zero_head else w(DRAFT_VOCAB, h),
        "d2t": targets - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    }
    for name in drop:
        del tensors[name]
    tensors.update(replace or {})
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _recording(rt) -> list[tuple[DraftRequest, list[int], torch.Tensor]]:
    """Every request's proposal: a copy of what was asked, the drafts, and then the head's keys for the request's real
    pairs (what must not depend on earlier drafts, kept or not)."""
    calls, proposer = [], rt.speculator.proposer
    propose = proposer.propose

    def recorded(batch):
        out = propose(batch)
        for r, d in zip(batch, out):
            state = proposer._requests[r.request_id]
            calls.append((DraftRequest(r.request_id, list(r.prompt), list(r.generated), r.k), d,
                          state.cache.k[: state.pairs].clone()))
        return out

    proposer.propose = recorded
    return calls


def _same_as_a_fresh_proposer(rt, head: Path, calls) -> None:
    """The incremental proposals (the head's KV kept across steps, its drafted positions dropped, the accepted drafts'
    pairs fed again with the target's hidden states) are those of a proposer that sees each history whole; asked
    again with nothing new (a step that did not run the request), it drafts the same again."""
    fresh = Eagle3Proposer.from_settings(SpeculativeSection(method="eagle3", draft_checkpoint=str(head)), rt)
    for ask, drafts, keys in calls:
        assert fresh.propose([ask]) == [drafts] == fresh.propose([ask]), ask
        state = fresh._requests[ask.request_id]
        assert state.pairs == len(ask.prompt) + len(ask.generated) - 1
        torch.testing.assert_close(state.cache.k[: state.pairs], keys, rtol=1e-4, atol=1e-4)
        fresh.release(ask.request_id)


def test_an_eagle3_head_drafts_and_greedy_stays_plain_greedy_token_for_token(ckpt, expected, tmp_path):
    head = write_head(tmp_path / "head")
    rt = _rt(ckpt, {"method": "eagle3", "num_draft_tokens": 3, "draft_checkpoint": str(head), "adaptive": False})
    proposer = rt.speculator.proposer
    assert isinstance(proposer, Eagle3Proposer) and proposer.points == (2, 3, 4)  # [1, 2, 3], outputs: +1
    assert len(proposer.view.layers) == 4 and proposer.view.layers[0] is rt.engine.layers[0]  # the target's tensors
    calls = _recording(rt)
    assert _greedy(rt) == expected
    stats = rt.stats()
    assert stats["spec_decode_draft_tokens"] > 0 and len(calls) > 20
    vocab = set(proposer.head.targets.tolist())
    assert all(len(d) == r.k and set(d) <= vocab for r, d, _ in calls)  # k drafts, each a draft-vocabulary token
    assert sum(len(set(d)) for _, d, _ in calls) > 1.5 * len(calls)  # they depend on the step, not only the context
    _same_as_a_fresh_proposer(rt, head, calls[::4])
    assert not proposer._requests and proposer.kv.free_blocks == proposer.kv.usable_blocks  # all released
    rt.close()


def test_kept_drafts_go_through_d2t_and_the_rollback(ckpt, expected, tmp_path):
    """A head whose lm_head is zero drafts draft id 0 every time, which d2t maps to a token the target writes: those
    drafts are kept, the head's pairs for them are fed again with the target's hidden states, and output is
    unchanged."""
    head = write_head(tmp_path / "zero", zero_head=True)
    rt = _rt(ckpt, {"method": "eagle3", "num_draft_tokens": 2, "draft_checkpoint": str(head), "adaptive": False})
    calls = _recording(rt)
    assert _greedy(rt) == expected
    assert {t for _, d, _ in calls for t in d} == {FREQUENT}
    assert rt.stats()["spec_decode_accepted_tokens"] >= 2  # once in each of the two outputs that hold it
    after = [c for c in calls if FREQUENT in c[0].generated[-3:]]  # the proposals just after a kept draft
    assert after
    _same_as_a_fresh_proposer(rt, head, after)
    rt.close()


def _refused(ckpt, head: Path) -> str:
    with pytest.raises((InputError, ConfigError)) as exc:
        _rt(ckpt, {"method": "eagle3", "draft_checkpoint": str(head)})
    assert exc.value.exit_code == 2 and exc.value.fix
    return str(exc.value)


def test_heads_that_do_not_fit_the_target_are_refused_naming_the_fix(ckpt, tmp_path):
    # trained for a wider target: fc reads 3 x 256 (target_hidden_size), this target's states are 128 wide
    message = _refused(ckpt, write_head(tmp_path / "wide", config={"target_hidden_size": 256},
                                        replace={"fc.weight": torch.zeros(128, 768, dtype=torch.bfloat16)}))
    assert "target hidden states of width 256" in message and "hidden size is 128" in message
    assert "trained for this target" in message
    # a capture point past the target's 4 layers
    message = _refused(ckpt, write_head(tmp_path / "deep", config={"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [2, 3, 9]}}))
    assert "streams [2, 3, 9]" in message and "has 4 layers" in message
    assert "eagle_aux_hidden_state_layer_ids [2, 3, 9]" in message
    # upstream's default capture for a 4-layer target is (2, 2, 1): not three layers in order
    message = _refused(ckpt, write_head(tmp_path / "default", config={"eagle_config": {}}))
    assert "[2, 2, 1]" in message and "not increasing" in message and "eagle_aux_hidden_state_layer_ids" in message
    # a tensor missing, one outside the contract, one of the wrong shape
    message = _refused(ckpt, write_head(tmp_path / "missing", drop=("midlayer.hidden_norm.weight",)))
    assert "missing midlayer.hidden_norm.weight" in message and "complete release" in message
    message = _refused(ckpt, write_head(tmp_path / "bias", replace={
        "midlayer.self_attn.q_proj.bias": torch.zeros(128, dtype=torch.bfloat16)}))
    assert "outside the EAGLE-3 contract: midlayer.self_attn.q_proj.bias" in message
    message = _refused(ckpt, write_head(tmp_path / "d2t", replace={"d2t": torch.zeros(100, dtype=torch.int64)}))
    assert "d2t is [100], the contract's [512]" in message and "draft_vocab_size 512" in message
    message = _refused(ckpt, write_head(tmp_path / "d2t-range", replace={
        "d2t": torch.full((DRAFT_VOCAB,), 8000, dtype=torch.int64)}))
    assert "d2t maps draft ids outside the target's 8192 tokens" in message
    # another vocabulary, another architecture, pickle weights only
    assert "vocab_size is 32000" in _refused(ckpt, write_head(tmp_path / "vocab", config={"vocab_size": 32000}))
    assert "not an EAGLE-3 head" in _refused(ckpt, write_head(tmp_path / "arch", config={
        "architectures": ["LlamaForCausalLM"]}))
    pickled = write_head(tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    message = _refused(ckpt, pickled)
    assert "pytorch_model.bin: pickle files" in message and "not read" in message and "weights_only=True" in message


def test_eagle3_config_refusals_and_the_cli_exit_code(built, engines_dir, tmp_path):
    base = yaml.safe_load((CONFIGS / f"{NAME}.yaml").read_text())

    def config_with(spec) -> dict:
        return {**base, "runtime": {**base["runtime"], "speculative": spec}}

    with pytest.raises(ConfigError, match="method: eagle3 needs runtime.speculative.draft_checkpoint"):
        config_from_dict(config_with({"method": "eagle3"}), name="t", path=CONFIGS / "t.yaml")
    with pytest.raises(ConfigError, match="set method: draft .* or eagle3"):
        config_from_dict(config_with({"method": "ngram", "draft_checkpoint": "x"}), name="t", path=CONFIGS / "t.yaml")
    assert config_from_dict(config_with({"method": "eagle3", "draft_checkpoint": "x"}), name="t").runtime.speculative\
        .method == "eagle3"
    # through the CLI: the config refused before anything runs; a head that does not fit, refused when the built
    # engine loads (exit 2, the message and its fix, no traceback)
    built(NAME)
    cfg_path = tmp_path / f"{NAME}.yaml"  # the built engine's name, so `generate` finds it in engines_dir
    cfg_path.write_text(yaml.safe_dump(config_with({"method": "eagle3"})))
    proc = run_cli("build", "-c", str(cfg_path), "--dry-run", "--engines-dir", str(tmp_path / "engines"))
    assert proc.returncode == 2 and "eagle3 needs runtime.speculative.draft_checkpoint" in proc.stderr, proc.stderr
    head = write_head(tmp_path / "head", drop=("norm.weight",))
    cfg_path.write_text(yaml.safe_dump(config_with({"method": "eagle3", "draft_checkpoint": str(head)})))
    proc = run_cli("generate", "-c", str(cfg_path), "--engines-dir", str(engines_dir), "--max-tokens", "2", "hi")
    assert proc.returncode == 2 and "missing norm.weight" in proc.stderr and "Fix:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()


# The contract, pinned. Read from (facts, not code):
#   SafeAILab/EAGLE eagle/model/cnets.py @ 148042c5fed07822194a49b027c897c9c5494b0e (Model, LlamaDecoderLayeremb)
#   SafeAILab/EAGLE eagle/model/modeling_llama_kv.py @ f2f2366485f092f9d0ffb0bc0c6bd174e69083bf (capture 2, L//2, L-3)
#   SafeAILab/EAGLE eagle/traineagle3/config.json @ 9666a8182d9bed8b5b637fd4a126c90d9b9c3db2 (the 8B head's config)
#   sgl-project/sglang python/sglang/srt/models/llama_eagle3.py @ d737979cbd17c6162f39c1953cfa72d3d23cc0d0
#   vllm-project/vllm vllm/model_executor/models/llama_eagle3.py @ 583507d13075783a12ccbd774575974d10ca4959
#   vllm-project/vllm vllm/model_executor/models/llama.py @ e06c9ba2a6ea923a84add30f5dafaea126429b81 (capture)
#   sgl-project/sglang#25454 (explicit ids: +1 only where the first is 1)
LLAMA31_8B_HEAD = {  # EAGLE's training config for the Llama-3.1-8B-Instruct head (eagle/traineagle3/config.json)
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}
LLAMA31_8B_TENSORS = {
    "fc.weight": (4096, 3 * 4096),
    "midlayer.input_layernorm.weight": (4096,),
    "midlayer.hidden_norm.weight": (4096,),
    "midlayer.self_attn.q_proj.weight": (4096, 8192),
    "midlayer.self_attn.k_proj.weight": (1024, 8192),
    "midlayer.self_attn.v_proj.weight": (1024, 8192),
    "midlayer.self_attn.o_proj.weight": (4096, 4096),
    "midlayer.post_attention_layernorm.weight": (4096,),
    "midlayer.mlp.gate_proj.weight": (14336, 4096),
    "midlayer.mlp.up_proj.weight": (14336, 4096),
    "midlayer.mlp.down_proj.weight": (4096, 14336),
    "norm.weight": (4096,),
    "lm_head.weight": (32000, 4096),
    "d2t": (32000,),
    "t2d": (128256,),
    "embed_tokens.weight": (128256, 4096),
}


def test_the_contract_pinned_against_the_upstream_sources(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B_HEAD))
    spec = eagle3_checkpoint.read_spec(tmp_path, target_layers=32, target_hidden=4096, target_vocab=128256)
    assert spec.tensor_shapes() == LLAMA31_8B_TENSORS
    assert spec.optional() == {"t2d", "embed_tokens.weight"}  # t2d: SGLang and vLLM skip it; the target's embedding
    assert spec.points == (2, 16, 29) and spec.head_dim == 128 and spec.eps == 1e-5 and spec.rope_base == 10000.0
    # explicit capture ids: vLLM's convention (the stream entering layer j), SGLang's older one (+1) where the first
    # id is 1, top-level or under eagle_config
    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 18, 33]}}
    assert eagle3_checkpoint.capture_points(nested, 36) == ((2, 18, 33), "eagle_config.eagle_aux_hidden_state_layer_ids "
                                                                     "[2, 18, 33]")
    assert eagle3_checkpoint.capture_points({"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}, 94)[0] == (2, 47, 91)
    assert eagle3_checkpoint.capture_points({}, 28)[0] == (2, 14, 25)
    with pytest.raises(ValueError, match="differ"):
        eagle3_checkpoint.capture_points({"eagle_aux_hidden_state_layer_ids": [2, 3, 4],
                                          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 5]}}, 8)
    # names: SGLang's optional model. prefix, vLLM's layers.0. for midlayer.
    assert eagle3_checkpoint.canonical_name("model.midlayer.mlp.up_proj.weight") == "midlayer.mlp.up_proj.weight"
    assert eagle3_checkpoint.canonical_name("layers.0.hidden_norm.weight") == "midlayer.hidden_norm.weight"
    assert eagle3_checkpoint.canonical_name("model.fc.weight") == "fc.weight"
    # a draft model wider or narrower than the target ships its own embedding; without draft_vocab_size the head
    # is the target's (SGLang)
    narrow = eagle3_checkpoint.read_spec(_config(tmp_path / "n", {**LLAMA31_8B_HEAD, "hidden_size": 2048,
                                                                   "target_hidden_size": 4096}),
                                         target_layers=32, target_hidden=4096, target_vocab=128256)
    assert "embed_tokens.weight" not in narrow.optional() and narrow.tensor_shapes()["fc.weight"] == (2048, 3 * 4096)
    full = {k: v for k, v in LLAMA31_8B_HEAD.items() if k != "draft_vocab_size"}
    shared = eagle3_checkpoint.read_spec(_config(tmp_path / "f", full), target_layers=32, target_hidden=4096,
                                         target_vocab=128256)
    assert shared.head_from_target and {"lm_head.weight", "d2t"} <= shared.optional()


def _config(directory: Path, config: dict) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_the_checkpoint_names_may_carry_the_model_prefix(ckpt, expected, tmp_path):
    head = write_head(tmp_path / "head")
    from safetensors.torch import load_file

    tensors = load_file(str(head / "model.safetensors"))
    save_file({("model." + k if k.startswith("midlayer.") else k): v for k, v in tensors.items()},
              str(head / "model.safetensors"))
    rt = _rt(ckpt, {"method": "eagle3", "num_draft_tokens": 2, "draft_checkpoint": str(head), "adaptive": False})
    assert _greedy(rt, PROMPTS[:1], n=8) == [expected[0][:8]]
    assert rt.stats()["spec_decode_draft_tokens"] > 0
    rt.close()
