"""An EAGLE-3 draft head's checkpoint: the contract it is read by, checked against the target before anything loads.

An EAGLE-3 head (Li et al. 2025) is one Llama decoder layer that drafts from the target's own hidden states: the
target's residual streams at a few of its layers (by default three: low, middle, high) for the tokens so far,
concatenated and projected by ``fc`` to the head's width, beside the embedding of the next token. The contract is
traced to the public implementations that load such heads (the facts carry over; the code here is this project's):

* SafeAILab/EAGLE ``eagle/model/cnets.py`` @ 148042c5fed07822194a49b027c897c9c5494b0e: the head (``Model``,
  ``LlamaDecoderLayeremb``: ``fc`` without bias, q/k/v over 2 x hidden, ``hidden_norm`` and ``input_layernorm``,
  ``lm_head`` over ``draft_vocab_size``, the ``d2t`` / ``t2d`` buffers, the embedding taken from the target and
  frozen) and its drafting loop (``topK_genrate``: the next step's input token is ``d + d2t[d]``, its hidden state
  the layer's output before ``norm``); ``eagle/model/modeling_llama_kv.py`` @
  f2f2366485f092f9d0ffb0bc0c6bd174e69083bf: the capture, the stream *entering* target layers 2, L // 2 and L - 3.
* sgl-project/sglang ``python/sglang/srt/models/llama_eagle3.py`` @ d737979cbd17c6162f39c1953cfa72d3d23cc0d0
  (``LlamaForCausalLMEagle3``): the names, with or without a ``model.`` prefix; ``num_hidden_layers`` must be 1;
  ``target_hidden_size`` (default ``hidden_size``) sizes ``fc``, whose bias follows ``bias``; ``t2d`` is skipped;
  without ``draft_vocab_size`` (and untied) the head's ``lm_head`` is the target's; ``tie_word_embeddings`` makes it
  the embedding. Its ``python/sglang/srt/speculative/eagle_worker.py`` @ 00559eacbf0841146db7e27e445d1971e35e6294
  gives the head the target's embedding (and, in that case, head) and reads ``eagle_config.use_aux_hidden_state``.
  EAGLE loads the embedding from the target only where ``target_hidden_size`` is unset (the widths agree).
* vllm-project/vllm ``vllm/model_executor/models/llama_eagle3.py`` @ 583507d13075783a12ccbd774575974d10ca4959
  (``Eagle3LlamaForCausalLM``: ``midlayer.`` read as ``layers.0.``, ``d2t`` as ``draft_id_to_target_id``) and
  ``vllm/model_executor/models/llama.py`` @ e06c9ba2a6ea923a84add30f5dafaea126429b81 (the default capture
  ``(2, L // 2, L - 3)``, the stream entering each of those layers).

docs/perf-notes.md ("EAGLE-3 draft heads") has the table; ``read_spec`` refuses what the contract does not cover.
Weights are read from safetensors only (a pickle can run code when loaded).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from trtllm_pipeline.errors import InputError
from trtllm_pipeline.model import families

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # SGLang's / EAGLE's name, vLLM's
DEFAULT_EPS = 1e-6  # transformers' LlamaConfig.rms_norm_eps
DEFAULT_ROPE_BASE = 10000.0  # LlamaConfig.rope_theta
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # derived buffers some trainers save (vLLM skips them too)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# EAGLE-3 variants this reader would read wrongly, refused where their key is true: vLLM's speculators heads
# (norm_before_residual), NVIDIA's GPT-OSS heads (norm_before_fc, with an input_norm: sgl-project/sglang#32334)
VARIANTS = {"norm_before_residual": "the residual taken after hidden_norm",
            "norm_before_fc": "an RMSNorm over the concatenated target states before fc"}


@dataclasses.dataclass(frozen=True)
class Eagle3Spec:
    """An EAGLE-3 head's shape, from its config.json, as checked against the target (``read_spec``)."""

    directory: Path
    hidden: int  # H: the head's width
    target_hidden: int  # H_t: the width of the target states fc reads (``target_hidden_size``, default H)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int  # V: the target's vocabulary (the embedding, ``t2d``)
    draft_vocab: int  # V_d: the rows of ``lm_head`` (``draft_vocab_size``, default V)
    eps: float
    rope_base: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    fc_bias: bool
    # no draft_vocab_size and untied: lm_head may be absent, and the target's drafts (SGLang takes the target's then
    # even where the checkpoint has one; here a shipped lm_head is used)
    head_from_target: bool
    points: tuple[int, ...]  # the target's residual streams read, in fc's input order (``capture_points``)
    points_from: str  # the config key they came from, for messages

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the head's checkpoint may hold, by its name without prefix, and its shape."""
        h, d, inter = self.hidden, self.head_dim, self.intermediate
        shapes = {
            "fc.weight": (h, len(self.points) * self.target_hidden),
            "midlayer.input_layernorm.weight": (h,),  # normalizes the token's embedding
            "midlayer.hidden_norm.weight": (h,),  # normalizes the hidden state (fc's output, or the last step's)
            # attention over the two, concatenated (embedding first): input width 2H
            "midlayer.self_attn.q_proj.weight": (self.heads * d, 2 * h),
            "midlayer.self_attn.k_proj.weight": (self.kv_heads * d, 2 * h),
            "midlayer.self_attn.v_proj.weight": (self.kv_heads * d, 2 * h),
            "midlayer.self_attn.o_proj.weight": (h, self.heads * d),
            "midlayer.post_attention_layernorm.weight": (h,),
            "midlayer.mlp.gate_proj.weight": (inter, h),
            "midlayer.mlp.up_proj.weight": (inter, h),
            "midlayer.mlp.down_proj.weight": (h, inter),
            "norm.weight": (h,),
            "lm_head.weight": (self.draft_vocab, h),
            "d2t": (self.draft_vocab,),  # draft id -> target id offset: target = d + d2t[d]
            "t2d": (self.vocab,),  # which target ids the draft vocabulary holds
            "embed_tokens.weight": (self.vocab, h),
        }
        if self.fc_bias:
            shapes["fc.bias"] = (h,)
        return shapes

    def optional(self) -> set[str]:
        """The names that may be absent: the embedding where the target's is shared, the head where it is the
        embedding or the target's, the vocabulary maps where the draft vocabulary is the target's."""
        out = {"t2d"}
        if self.hidden == self.target_hidden:
            out.add("embed_tokens.weight")
        if self.tie_word_embeddings or self.head_from_target:
            out.add("lm_head.weight")
        if self.draft_vocab == self.vocab:
            out.add("d2t")
        return out


def capture_points(config: dict[str, Any], target_layers: int) -> tuple[tuple[int, ...], str]:
    """Which residual streams of the target the head reads, as indexes j of the stream *entering* target layer j
    (0: the embedding; ``target_layers``: leaving the last layer, before the final norm), and the key they came from.

    Without explicit ids: (2, L // 2, L - 3), as EAGLE, vLLM and SGLang capture by default. Explicit ids,
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang, SpecForge) or a top-level
    ``eagle_aux_hidden_state_layer_ids`` (vLLM, speculators), come in two conventions upstream: vLLM takes id j as
    the stream entering layer j (as the default); SGLang added one to each (id j: the output of layer j) until
    sgl-project/sglang#25454, which adds one only where the first id is 1 (the first layer's output: the other
    convention's 2). This follows #25454."""
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if nested and top and list(nested) != list(top):
        raise ValueError(f"eagle_config.eagle_aux_hidden_state_layer_ids {list(nested)} and "
                         f"eagle_aux_hidden_state_layer_ids {list(top)} differ")
    ids = nested or top
    if not ids:
        n = target_layers
        return (2, n // 2, n - 3), f"the default (2, L // 2, L - 3) for the target's L = {n} layers"
    key = "eagle_config.eagle_aux_hidden_state_layer_ids" if nested else "eagle_aux_hidden_state_layer_ids"
    ids = [int(i) for i in ids]
    shift = 1 if ids[0] == 1 else 0
    note = " (the first is 1: outputs of those layers)" if shift else ""
    return tuple(i + shift for i in ids), f"{key} {ids}{note}"


def read_spec(directory: Path, *, target_layers: int, target_hidden: int, target_vocab: int) -> Eagle3Spec:
    """The head's config.json at ``directory``, checked against the target's shape (its layer count, hidden size and
    vocabulary). ``InputError`` (exit 2) naming the fix for anything the contract does not cover."""
    where = f"runtime.speculative.draft_checkpoint ({directory})"
    path = directory / "config.json"
    if not path.is_file():
        raise InputError(f"{where}: no config.json; an EAGLE-3 head directory holds config.json and *.safetensors.",
                         fix="point draft_checkpoint at the EAGLE-3 head's directory (as downloaded)")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise InputError(f"{where}: config.json is not JSON ({exc}).") from None

    def refuse(problem: str, fix: str) -> InputError:
        return InputError(f"{where}: {problem}", fix=fix)

    arch = (config.get("architectures") or [None])[0]
    if "transformer_layer_config" in config or "speculators_config" in config:
        raise refuse(f"config.json is in the speculators format ({arch}: the layer's config nested under "
                     "transformer_layer_config); this reader takes the EAGLE / SGLang layout.",
                     "use the head's LlamaForCausalLMEagle3 release, or flatten transformer_layer_config into "
                     "config.json with architectures [\"LlamaForCausalLMEagle3\"]")
    if arch not in ARCHITECTURES:
        raise refuse(f"config.json's architectures is {arch!r}, not an EAGLE-3 head ({' or '.join(ARCHITECTURES)}).",
                     "use method: draft for a whole draft model, or point draft_checkpoint at an EAGLE-3 head")
    missing = [k for k in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size") if k not in config]
    if missing:
        raise refuse(f"config.json lacks {', '.join(missing)}.", "use the config.json the head was released with")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise refuse(f"the head has {config['num_hidden_layers']} layers; the EAGLE-3 layout has one (midlayer).",
                     "use a one-layer EAGLE-3 head")
    if config.get("hidden_act", "silu") != "silu":
        raise refuse(f"hidden_act is {config['hidden_act']!r}; the head's MLP is SiLU-gated.",
                     "use a head with hidden_act silu")
    if (config.get("eagle_config") or {}).get("use_aux_hidden_state", True) is False:
        raise refuse("eagle_config.use_aux_hidden_state is false: the head reads only the target's last hidden "
                     "state (EAGLE-1/2 style), not the three an EAGLE-3 head reads.", "use an EAGLE-3 head")
    if variants := [f"{k} ({what})" for k, what in VARIANTS.items() if config.get(k)]:
        raise refuse(f"config.json sets {', '.join(variants)}: a variant this reader does not implement.",
                     "use a head without it (the EAGLE / SGLang layout)")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    t_hidden = int(config.get("target_hidden_size") or hidden)
    if t_hidden != target_hidden:
        key = "target_hidden_size" if config.get("target_hidden_size") else "hidden_size (no target_hidden_size)"
        raise refuse(f"the head reads target hidden states of width {t_hidden} ({key}; fc.weight is [{hidden}, "
                     f"that x the capture points]), but this target's hidden size is {target_hidden}: it was "
                     "trained for another model.", "use the EAGLE-3 head trained for this target model")
    vocab = int(config["vocab_size"])
    if vocab != target_vocab:
        raise refuse(f"the head's vocab_size is {vocab}, the target's vocabulary {target_vocab}: its token ids "
                     "(embedding, d2t's targets) would mean other tokens.",
                     "use the EAGLE-3 head trained for this target (same tokenizer)")
    try:
        points, points_from = capture_points(config, target_layers)
    except ValueError as exc:
        raise refuse(f"{exc}.", "keep one of them") from None
    if not points or any(not 0 <= p <= target_layers for p in points):
        raise refuse(f"the head reads the target's residual streams {list(points)} ({points_from}), but the target "
                     f"has {target_layers} layers: streams 0..{target_layers} exist (j enters layer j; "
                     f"{target_layers} leaves the last).",
                     "use the head trained for this target, or correct eagle_aux_hidden_state_layer_ids")
    if any(b <= a for a, b in zip(points, points[1:])):
        raise refuse(f"the head's capture points {list(points)} ({points_from}) are not increasing: upstream engines "
                     "capture in layer order, once each, so fc's input would be read in another order or short.",
                     "set eagle_config.eagle_aux_hidden_state_layer_ids to the increasing layer ids the head was "
                     "trained with")
    scaling = families.rope_scaling(config)
    implemented = families.BY_ARCHITECTURE["LlamaForCausalLM"].rope_scaling
    if scaling is not None and scaling["rope_type"] not in implemented:
        raise refuse(f"rope scaling {scaling['rope_type']!r} is not implemented for the head.",
                     f"use a head with rope scaling {' or '.join(implemented)} or none")
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    tie = bool(config.get("tie_word_embeddings", False))
    head_from_target = not tie and not config.get("draft_vocab_size")
    if (tie or head_from_target) and draft_vocab != vocab:
        raise refuse(f"tie_word_embeddings with a draft vocabulary of {draft_vocab} (the embedding has {vocab} rows).",
                     "untie it, or drop draft_vocab_size")
    if head_from_target and hidden != target_hidden:
        raise refuse("without draft_vocab_size the head drafts with the target's lm_head, which needs its hidden "
                     f"size ({hidden}) to be the target's ({target_hidden}).",
                     "set draft_vocab_size (and ship lm_head)")
    return Eagle3Spec(
        directory=directory, hidden=hidden, target_hidden=t_hidden, heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads), intermediate=int(config["intermediate_size"]),
        vocab=vocab, draft_vocab=draft_vocab, eps=float(config.get("rms_norm_eps") or DEFAULT_EPS),
        rope_base=float(config.get("rope_theta") or DEFAULT_ROPE_BASE), rope_scaling=scaling,
        tie_word_embeddings=tie, fc_bias=bool(config.get("bias", False)), head_from_target=head_from_target,
        points=points, points_from=points_from)


def canonical_name(name: str) -> str:
    """A tensor's name as the contract spells it: without SGLang's optional ``model.`` prefix, ``midlayer.`` for
    vLLM's ``layers.0.``."""
    name = name.removeprefix("model.")
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def load_tensors(spec: Eagle3Spec) -> dict[str, torch.Tensor]:
    """The head's tensors from ``spec.directory/*.safetensors``, by canonical name, after checking every name and
    shape from the files' headers (nothing is read before they pass): ``InputError`` naming the fix otherwise."""
    from safetensors import safe_open

    where = f"runtime.speculative.draft_checkpoint ({spec.directory})"
    files = sorted(spec.directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in spec.directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        found = f" (it holds {', '.join(pickles)}: pickle files, which can run code when loaded; not read)" \
            if pickles else ""
        raise InputError(f"{where}: no *.safetensors{found}.",
                         fix="convert the weights to safetensors where you trust them, e.g. save_file(torch.load("
                         "'pytorch_model.bin', weights_only=True), 'model.safetensors') with safetensors.torch")
    shapes, optional = spec.tensor_shapes(), spec.optional()
    found: dict[str, tuple[Path, str]] = {}
    unexpected, wrong = [], []
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for raw in f.keys():
                if raw.endswith(IGNORED_SUFFIXES):
                    continue
                name = canonical_name(raw)
                if name in found:
                    raise InputError(f"{where}: {raw} and {found[name][1]} are the same tensor ({name}) twice.",
                                     fix="keep one of them")
                if name not in shapes:
                    unexpected.append(raw)
                    continue
                found[name] = (file, raw)
                shape = tuple(f.get_slice(raw).get_shape())
                if shape != shapes[name]:
                    wrong.append(f"{raw} is {list(shape)}, the contract's {list(shapes[name])}")
    if missing := sorted(set(shapes) - set(found) - optional):
        raise InputError(f"{where}: missing {', '.join(missing)} (an EAGLE-3 head holds fc, midlayer.*, norm, "
                         "lm_head and, with a draft vocabulary, d2t).",
                         fix="use the head's complete release (every *.safetensors file of it)")
    if unexpected:
        raise InputError(f"{where}: tensors outside the EAGLE-3 contract: {', '.join(sorted(unexpected)[:6])}"
                         f"{' ...' if len(unexpected) > 6 else ''} (q/k/v biases, more layers or another layout "
                         "would be ignored and drafts silently wrong).",
                         fix="use a LlamaForCausalLMEagle3 head (one bias-free layer)")
    if wrong:
        raise InputError(f"{where}: {'; '.join(wrong)} (from config.json: hidden_size {spec.hidden}, "
                         f"target hidden {spec.target_hidden} x {len(spec.points)} capture points, heads "
                         f"{spec.heads}/{spec.kv_heads} of {spec.head_dim}, intermediate_size {spec.intermediate}, "
                         f"vocab_size {spec.vocab}, draft_vocab_size {spec.draft_vocab}).",
                         fix="use the config.json released with these weights")
    tensors = {}
    for name, (file, raw) in found.items():
        with safe_open(str(file), framework="pt") as f:
            tensors[name] = f.get_tensor(raw)
    check_vocab_maps(spec, tensors, where)
    return tensors


def check_vocab_maps(spec: Eagle3Spec, tensors: dict[str, torch.Tensor], where: str) -> None:
    """``d2t`` (int, [V_d]) maps every draft id to a distinct target id inside the vocabulary; ``t2d`` (bool, [V]),
    where present, marks exactly those."""
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is not None:
        if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            raise InputError(f"{where}: d2t is {d2t.dtype}; it holds integer offsets (target = d + d2t[d]).",
                             fix="use the head's released d2t (int64)")
        targets = torch.arange(spec.draft_vocab) + d2t.long()
        if int(targets.min()) < 0 or int(targets.max()) >= spec.vocab or targets.unique().numel() != spec.draft_vocab:
            raise InputError(f"{where}: d2t maps draft ids outside the target's {spec.vocab} tokens or two onto one "
                             "(target = d + d2t[d]).", fix="use the d2t released with this head's lm_head")
    if t2d is not None:
        if t2d.dtype != torch.bool:
            raise InputError(f"{where}: t2d is {t2d.dtype}, not bool.", fix="use the head's released t2d")
        targets = torch.arange(spec.draft_vocab) + (d2t.long() if d2t is not None else 0)
        if int(t2d.sum()) != spec.draft_vocab or not bool(t2d[targets].all()):
            raise InputError(f"{where}: t2d marks {int(t2d.sum())} target ids, not the {spec.draft_vocab} d2t maps to.",
                             fix="use the t2d and d2t released together")


def draft_targets(spec: Eagle3Spec, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each draft id's target id [V_d] (int64): ``d + d2t[d]``, or the identity without a draft vocabulary."""
    ids = torch.arange(spec.draft_vocab)
    d2t = tensors.get("d2t")
    return ids if d2t is None else ids + d2t.long()
