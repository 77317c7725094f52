"""Build configs: one YAML file per build, validated into one typed ``BuildConfig``.

This module is the single source of truth for what a config may say, its defaults, and the
checks that reject a config before any GPU time is spent. Every stage takes the ``BuildConfig``
and reads only the sections it needs. Errors name the file, the field and the fix, and raise
``ConfigError`` (exit code 2).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import reprlib
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from trtllm_pipeline.errors import ConfigError
from trtllm_pipeline.model.catalog import ModelShape
from trtllm_pipeline.tasks.registry import TASKS, TaskName

# Formats ModelOpt can produce for TensorRT-LLM (its names, as in TensorRT-LLM's quantize.py
# --qformat) and the TensorRT-LLM checkpoint's quant_algo for each (quantize_by_modelopt.py).
MODELOPT_FORMATS = {
    "none": None,
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "int8_wo": "W8A16",
    "nvfp4": "NVFP4",
}
SUPPORTED_FORMATS = tuple(MODELOPT_FORMATS)
# The ModelOpt 0.47 config (an attribute of modelopt.torch.quantization) each format calibrates with.
MODELOPT_CONFIGS = {
    "fp8": "FP8_DEFAULT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "int8_wo": "INT8_WEIGHT_ONLY_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}
AWQ_FORMATS = ("int4_awq", "w4a8_awq")
DEFAULT_AWQ_BLOCK_SIZE = 128  # ModelOpt's INT4_AWQ_CFG and TensorRT-LLM's quantize.py --awq_block_size
NVFP4_BLOCK_SIZE = 16  # NVFP4_DEFAULT_CFG's block, fixed by the format (E2M1 values, one E4M3 scale per 16)
# Weight formats whose FP8 context FMHA (and so paged context FMHA with an FP8 KV cache) TensorRT-LLM
# 1.2's builder keeps on; for any other it turns both off (builder.py build()).
FP8_CONTEXT_FMHA_FORMATS = ("fp8", "w4a8_awq", "nvfp4")
KV_CACHE_FORMATS = {"none": None, "fp8": "FP8"}

# The runtime backends, as runtime.backend and --runtime name them: runtimes/registry.py registers one
# backend for each (tests/test_architecture.py checks that the two agree).
BACKEND_NAMES = ("tensorrt_llm", "tensorrt_llm_pytorch", "torch")
# What each runtime backend needs installed; config errors and the README say it.
BACKEND_NEEDS = {
    "tensorrt_llm": "TensorRT-LLM >=1.0,<1.3 (trtllm-build engines; the engine flow was removed in 1.3)",
    "tensorrt_llm_pytorch": "TensorRT-LLM >=1.0 with its PyTorch backend (the LLM API on the unified HF checkpoint; "
                            "the only flow from 1.3 on)",
    "torch": "no TensorRT-LLM (the checkpoint run in PyTorch, CPU or CUDA)",
}
TP_MODES = ("auto", "merged", "distributed")  # runtime.tp_mode and --tp-mode (runtimes/torch_engine/tp/mode.py)

PluginDtype = Literal["auto", "float16", "bfloat16", "float32", "fp8", "nvfp4", "disable"]

# Bounds on what can run, so that a typo (1e12) is refused here rather than as an allocator failure
# minutes later. Generous: far beyond any engine this pipeline builds.
MAX_BATCH = 4096
MAX_TOKENS = 1 << 20  # a sequence: prompt and output
SEED_MAX = 2**32 - 1  # every generator here (torch, numpy, random) takes these
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")  # [org/]name, as the hub spells ids
REVISION = re.compile(r"^[\w./-]{1,200}$")
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]


LOCAL_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".txt")


def looks_like_a_path(value: str) -> bool:
    """Whether a source names a local file or directory (which must then exist), not a hub id."""
    return (value.startswith((".", "/", "~")) or Path(value).suffix.lower() in LOCAL_DATA_SUFFIXES
            or Path(os.path.expanduser(value)).exists())


class _Section(BaseModel):
    # strict: YAML `"8"` is not an integer; forbid: a misspelt key is an error, not a silent default;
    # no NaN or infinity for any number.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    source: str = Field(description="hub id (org/name), local HF model directory, gguf:PATH (a .gguf file or a "
                        "directory holding one), or builtin:<name> (e.g. builtin:smollm2-135m-instruct)")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit)")

    @field_validator("source")
    @classmethod
    def _source_kind(cls, value: str) -> str:
        local = value.startswith((".", "/", "~")) or Path(os.path.expanduser(value)).exists()
        if value.startswith("gguf:") and not value.removeprefix("gguf:"):
            raise ValueError("gguf: needs a path, e.g. gguf:/models/name.Q4_K_M.gguf")
        if not (value.startswith(("builtin:", "gguf:")) or local or HUB_ID.match(value)):
            raise ValueError(f"{value[:100]!r} is not a hub id (org/name), a local directory (./..., /..., ~/...), "
                             "gguf:PATH or builtin:<name>")
        return value

    @field_validator("revision")
    @classmethod
    def _revision_syntax(cls, value: str | None) -> str | None:
        if value is not None and not REVISION.match(value):
            raise ValueError(f"{value[:100]!r} is not a branch, tag or commit name")
        return value

    @property
    def is_builtin(self) -> bool:
        return self.source.startswith("builtin:")

    @property
    def is_gguf(self) -> bool:
        return self.source.startswith("gguf:")

    @property
    def is_local(self) -> bool:
        return not self.is_builtin and not self.is_gguf and (
            self.source.startswith((".", "/", "~")) or Path(os.path.expanduser(self.source)).exists()
        )


class CalibrationSection(_Section):
    """Defaults are TensorRT-LLM's quantize.py recipe: 512 cnn_dailymail articles of 512 tokens."""

    dataset: str = Field(
        "abisee/cnn_dailymail",
        description="hub dataset id, local json/jsonl/parquet/csv/txt file or directory, or builtin:random-tokens",
    )
    subset: str | None = Field(None, description="dataset configuration; default 3.0.0 for cnn_dailymail")
    split: str = "train"
    text_column: str | None = Field(None, description="default: article for cnn_dailymail, else text")
    num_samples: int = Field(512, gt=0, le=100_000)
    max_seq_len: int = Field(512, gt=0, le=131_072)
    batch_size: BatchSize = 1
    seed: Seed = 1234
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="what the model computes in while calibrating: auto = the config's dtype on a GPU, "
        "float32 on a CPU; float32 on a GPU takes the CPU's statistics (its checkpoint then matches a CPU's within "
        "rounding: what a comparison across machines needs)")

    @field_validator("dataset")
    @classmethod
    def _dataset_kind(cls, value: str) -> str:
        if not (value.startswith("builtin:") or looks_like_a_path(value) or HUB_ID.match(value)):
            raise ValueError(f"{value[:100]!r} is not a hub dataset id (org/name), a local file or directory "
                             "(./..., /..., or a .json/.jsonl/.parquet/.csv/.txt file) or builtin:random-tokens")
        return value

    @property
    def is_cnn_dailymail(self) -> bool:
        return "cnn_dailymail" in self.dataset

    @property
    def resolved_subset(self) -> str | None:
        return self.subset if self.subset is not None else ("3.0.0" if self.is_cnn_dailymail else None)

    @property
    def resolved_text_column(self) -> str:
        return self.text_column or ("article" if self.is_cnn_dailymail else "text")


class QuantizationSection(_Section):
    format: str = Field("none", description="none | fp8 | int4_awq | w4a8_awq | int8_sq | int8_wo | nvfp4")
    kv_cache: str = Field("none", description="none | fp8")
    awq_block_size: int | None = Field(
        None, description=f"int4_awq, w4a8_awq: input features per INT4 scale; default {DEFAULT_AWQ_BLOCK_SIZE} "
        "(TensorRT-LLM's kernels take 64 or 128)")
    smoothquant_alpha: float | None = Field(
        None, ge=0, le=1, description="int8_sq: SmoothQuant's migration strength alpha; default ModelOpt's (1.0)")
    calibration: CalibrationSection = CalibrationSection()
    export_hf_checkpoint: bool = Field(True, description="also write ModelOpt's unified HF checkpoint")

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in MODELOPT_FORMATS:
            raise ValueError(
                f"{value!r} is not a ModelOpt quantization format; use one of {', '.join(SUPPORTED_FORMATS)}"
            )
        return value

    @field_validator("kv_cache")
    @classmethod
    def _known_kv(cls, value: str) -> str:
        if value not in KV_CACHE_FORMATS:
            raise ValueError(f"{value!r} is not a KV-cache format; use one of {', '.join(KV_CACHE_FORMATS)}")
        return value

    @field_validator("awq_block_size")
    @classmethod
    def _block_size(cls, value: int | None) -> int | None:
        if value is not None and (value < 8 or value & (value - 1)):
            raise ValueError(f"{value} is not a power of two of at least 8 (TensorRT-LLM uses 64 or 128)")
        return value

    @property
    def quant_algo(self) -> str | None:
        return MODELOPT_FORMATS[self.format]

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return KV_CACHE_FORMATS[self.kv_cache]

    @property
    def needs_calibration(self) -> bool:
        return self.format != "none" or self.kv_cache != "none"

    @property
    def modelopt_config(self) -> str | None:
        """The name of the ModelOpt config the format calibrates with (None: no weight quantization)."""
        return MODELOPT_CONFIGS.get(self.format)

    @property
    def group_size(self) -> int | None:
        """Input features per weight scale for the group-quantized formats (AWQ block, NVFP4 block)."""
        if self.format in AWQ_FORMATS:
            return self.awq_block_size or DEFAULT_AWQ_BLOCK_SIZE
        return NVFP4_BLOCK_SIZE if self.format == "nvfp4" else None

    @property
    def effective_smoothquant_alpha(self) -> float | None:
        return (1.0 if self.smoothquant_alpha is None else self.smoothquant_alpha) if self.format == "int8_sq" else None


def quantization_problems(cfg: "BuildConfig") -> list[str]:
    """Combinations of quantization settings that ModelOpt or TensorRT-LLM 1.2 do not build."""
    q, b, p = cfg.quantization, cfg.build, cfg.build.plugins
    out = []
    if q.awq_block_size is not None and q.format not in AWQ_FORMATS:
        out.append(f"quantization.awq_block_size applies to int4_awq and w4a8_awq only, not {q.format!r}. "
                   "Fix: remove it.")
    if q.smoothquant_alpha is not None and q.format != "int8_sq":
        out.append(f"quantization.smoothquant_alpha applies to int8_sq only, not {q.format!r}. Fix: remove it.")
    if q.kv_cache == "fp8" and q.format not in FP8_CONTEXT_FMHA_FORMATS and b.use_paged_context_fmha:
        out.append(
            f"quantization.kv_cache: fp8 with format {q.format!r}: TensorRT-LLM 1.2 keeps FP8 context FMHA only for "
            f"{', '.join(FP8_CONTEXT_FMHA_FORMATS)} weights and turns paged context FMHA off otherwise (builder.py). "
            "Fix: set build.use_paged_context_fmha: false, or kv_cache: none, or a format among "
            f"{', '.join(FP8_CONTEXT_FMHA_FORMATS)}.")
    if b.use_fp8_context_fmha and q.format not in FP8_CONTEXT_FMHA_FORMATS:
        out.append(f"build.use_fp8_context_fmha: TensorRT-LLM 1.2 turns it off for {q.format!r} weights (FP8 context "
                   f"FMHA needs {', '.join(FP8_CONTEXT_FMHA_FORMATS)}). Fix: leave it null.")
    if p.gemm_plugin == "nvfp4" and q.format != "nvfp4":
        out.append("build.plugins.gemm_plugin: `nvfp4` needs quantization.format: nvfp4. Fix: use auto or disable.")
    if q.format == "nvfp4" and p.gemm_plugin == "disable":
        out.append("build.plugins.gemm_plugin: `disable` makes TensorRT-LLM 1.2 run NVFP4 GEMMs without its NVFP4 "
                   "GEMM plugin (an explicit disable overrides its NVFP4 default). Fix: set gemm_plugin: nvfp4.")
    return out


class ParallelismSection(_Section):
    tp: int = Field(1, ge=1, le=64, description="tensor parallel size")
    pp: int = Field(1, ge=1, le=64, description="pipeline parallel size (only 1 is supported)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class PluginsSection(_Section):
    """trtllm-build plugin flags; each takes a dtype or `disable`."""

    gpt_attention_plugin: PluginDtype = "auto"
    gemm_plugin: PluginDtype = "disable"
    low_latency_gemm_plugin: Literal["fp8", "disable"] = "disable"
    gemm_swiglu_plugin: Literal["fp8", "disable"] = "disable"
    low_latency_gemm_swiglu_plugin: Literal["fp8", "disable"] = "disable"


class BuildSection(_Section):
    """Engine limits and trtllm-build options. TensorRT-LLM's own max_seq_len default is the
    model's 131072 positions, which sizes the KV cache for contexts nobody sends: set it."""

    max_batch_size: BatchSize = 8
    max_input_len: int = Field(2048, ge=1, le=MAX_TOKENS)
    max_seq_len: int = Field(4096, ge=2, le=MAX_TOKENS)
    max_num_tokens: int = Field(8192, ge=1, le=16 * MAX_TOKENS)
    max_beam_width: int = Field(1, ge=1, le=64)
    kv_cache_type: Literal["paged", "continuous"] = "paged"
    use_paged_context_fmha: bool = True
    use_fp8_context_fmha: bool | None = Field(None, description="null: on exactly when the KV cache is FP8")
    use_fused_mlp: bool = True
    multiple_profiles: bool = True
    workers: int | None = Field(None, ge=1, le=64, description="parallel build workers; default min(world size, GPUs)")
    gather_generation_logits: bool = Field(
        False, description="keep generation logits in the engine (--gather_generation_logits): lets `eval --url` "
        "score MMLU against a TensorRT-LLM deployment")
    plugins: PluginsSection = PluginsSection()
    extra_args: list[str] = Field(default_factory=list, description="passed to trtllm-build verbatim")


SPECULATIVE_METHODS = ("none", "ngram", "draft", "self", "eagle3")
CHECKPOINT_METHODS = ("draft", "eagle3")  # the methods that read runtime.speculative.draft_checkpoint
# k where the config gives none. Prompt lookup drafts for free and a verify row of 1 + k costs about one step at batch
# 1, so long copies want a long k: benchmarks/spec_simulate.py (SmolLM2, 18 grounded prompts x 128 tokens, with
# ngram 1..4 and an all-kept row going back to k) 1646 steps at k 8 against 1765 at k 4 and today's 2..4 (float32
# outputs; bf16 1616 / 1730), 6 random prompts 235 / 254. A draft model pays k of its own steps per row: unmeasured
# there, so 4 stays.
DEFAULT_DRAFT_TOKENS = {"ngram": 8}


class SpeculativeTreeSection(_Section):
    """Tree drafts for prompt lookup (``speculative/tree.py``): SuffixDecoding's frequency tree, verified in one row."""

    max_nodes: int = Field(32, ge=1, le=64, description="tokens of the tree verified a step (its most frequent "
                           "continuations' nodes); 32: benchmarks/spec_tree.py's best (1.86x ideal, SmolLM2 grounded)")
    max_depth: int = Field(32, ge=1, le=64, description="the longest continuation counted (replaces num_draft_tokens)")
    min_occurrences: int = Field(4, ge=1, le=64, description="shorter suffixes' continuations are counted too while "
                                 "the longest matching one occurred fewer times than this")


class SpeculativeSection(_Section):
    """Speculative decoding in the torch runtime (runtimes/torch_engine/speculative): a proposer drafts up to
    ``num_draft_tokens`` tokens per decoding request, the target verifies them in one step."""

    method: Literal[SPECULATIVE_METHODS] = Field(  # type: ignore[valid-type]
        "none", description="none; ngram = prompt lookup (the continuation of the request's last n tokens where they "
        "occurred before in its prompt + output); draft = a smaller checkpoint with the same tokenizer drafts greedily; "
        "self = the target's first draft_layers layers (with its final norm and head) draft greedily; eagle3 = an "
        "EAGLE-3 draft head (draft_checkpoint: its directory) drafts greedily from the target's own hidden states")
    num_draft_tokens: int = Field(4, ge=1, le=8, description="k: tokens drafted per request per step (1..8; default 8 "
                                  "for ngram, 4 for the model-based proposers)")
    # 1: a 1-token suffix drafts right after an edit, where 2 finds nothing for two steps; its misses turn the
    # request down (halved k, back-off). With k 8 and all-kept rows back to k: 1646 grounded steps against 1684 at
    # 2..4 (float32 outputs; bf16 1616 / 1676), random 235 / 248 (spec_simulate; see DEFAULT_DRAFT_TOKENS)
    ngram_min: int = Field(1, ge=1, le=16, description="ngram: the shortest suffix looked up")
    ngram_max: int = Field(4, ge=1, le=16, description="ngram: the longest suffix looked up (tried first)")
    draft_checkpoint: str | None = Field(
        None, description="draft: the draft model's checkpoint directory (what `quantize` wrote, with its tokenizer/; "
        "e.g. engines/<small build>/checkpoint); its tokenizer must equal the target's. eagle3: the EAGLE-3 head's "
        "directory (config.json, *.safetensors), trained for this target")
    draft_layers: int | None = Field(
        None, ge=1, le=1024, description="self: how many of the target's first layers draft (default a quarter)")
    adaptive: bool = Field(
        True, description="per request: draft fewer tokens (down to none, probing again later) while few are "
        "accepted, so a workload whose drafts miss runs as fast as plain decoding")
    tree: SpeculativeTreeSection | None = Field(
        None, description="ngram: draft a token tree (several continuations of the matched suffix, e.g. "
        "{max_nodes: 32}) instead of one; greedy requests verify it (on one GPU in the CUDA fast path's verify step), "
        "sampled ones take its most frequent path")

    @model_validator(mode="before")
    @classmethod
    def _draft_tokens_by_method(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("num_draft_tokens") is None:  # not given (or null): by method
            data = {**data, "num_draft_tokens": DEFAULT_DRAFT_TOKENS.get(data.get("method"), 4)}
        return data


class RuntimeSection(_Section):
    backend: Literal[("auto", *BACKEND_NAMES)] = Field(  # type: ignore[valid-type]
        "auto", description="; ".join(f"{name}: {needs}" for name, needs in BACKEND_NEEDS.items()))
    pytorch_deploy: Literal["triton_llmapi", "trtllm_serve"] = Field(
        "triton_llmapi", description="tensorrt_llm_pytorch: a Triton llmapi model repository (model.yaml) or a "
        "trtllm-serve launch (--extra_llm_api_options YAML and its argv)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="torch runtime device")
    compute_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="torch runtime activations/matmuls: auto = the checkpoint dtype on CUDA, float32 on CPU "
        "(CPUs without bf16 units run bf16 matmuls ~3x slower); FP8 layers stay FP8 either way",
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        0.9, gt=0, le=1, description="KV pool size: this fraction of the GPU memory free once the weights are loaded "
        "(TensorRT-LLM; the torch runtime on CUDA too)")
    enable_kv_cache_reuse: bool = Field(
        False, description="the prefix cache: full KV blocks of earlier requests reused by later ones with the same "
        "prefix (TensorRT-LLM and the torch runtime)")
    kv_block_size: int = Field(
        32, ge=1, le=1024, description="torch runtime: tokens per KV block (prefix-cache granularity; 32 as "
        "TensorRT-LLM's tokens_per_block)")
    kv_cache_blocks: int | None = Field(
        None, ge=1, description="torch runtime: KV blocks in the pool; default: on CUDA from "
        "kv_cache_free_gpu_mem_fraction, on CPU enough for build.max_batch_size x build.max_seq_len")
    fast_decode: bool = Field(
        True, description="torch runtime on CUDA: decode with fused Triton kernels (off: eager PyTorch ops)")
    batch_invariant: bool = Field(
        False, description="torch runtime on one CUDA device: every token computed by the same kernels whatever the "
        "batch, chunk or cached prefix it is computed in (Triton GEMMs of one shape for every linear and the logits, "
        "one prefill attention kernel for every row, eager steps), so greedy outputs with the prefix cache equal those "
        "without; slower than the default, which picks the fastest kernel per shape")
    cuda_graphs: bool = Field(
        True, description="torch runtime on CUDA: replay the fast decode step from CUDA graphs, one per batch bucket")
    graph_batch_sizes: list[BatchSize] | None = Field(
        None, description="batch buckets captured as CUDA graphs; default: powers of two up to build.max_batch_size")
    prefill_chunk_tokens: int = Field(
        2048, ge=16, le=1_048_576,
        description="prompt tokens the torch runtime prefills per step: a long prompt is spread over steps so it "
        "cannot stall the requests already decoding")
    kernel_cache_dir: str | None = Field(
        None, description="where Triton keeps compiled kernels between runs (TRITON_CACHE_DIR); default ~/.triton")

    @field_validator("kernel_cache_dir")
    @classmethod
    def _usable_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\0" in value):
            raise ValueError("must be a directory path (not empty, no NUL character)")
        return value
    speculative: SpeculativeSection = Field(
        SpeculativeSection(), description="torch runtime: speculative decoding (off by default)")
    tp_mode: Literal[TP_MODES] = Field(  # type: ignore[valid-type]
        "auto", description="torch runtime with a tp>1 checkpoint: distributed = one process per rank, each loading "
        "only its rank file (gloo on CPU, NCCL with one GPU per rank); merged = every shard reassembled in one process; "
        "auto = distributed where the ranks have devices (CPU: always; CUDA: tp GPUs), else merged with a notice")


class ServingSection(_Section):
    host: str = Field("127.0.0.1", description="the address every endpoint binds: an IP address or a host name")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host header values the HTTP and OpenAI fronts accept besides the bound "
        "address, localhost and the loopback addresses (a name clients use for this machine); any other Host is "
        "refused (DNS rebinding)")
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int = Field(8001, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)
    max_batch_size: int = Field(8, ge=1, le=MAX_BATCH, description="Triton-side batch limit (triton_max_batch_size)")
    max_queue_delay_microseconds: int = Field(1000, ge=0, le=10_000_000)
    instance_count: int = Field(
        2, ge=1, le=64, description="preprocessing model instances, tokenizing in parallel (two: one long prompt "
        "does not hold up the others); postprocessing keeps one, so that a stream's responses stay in order")
    bls_instance_count: int = Field(
        1, ge=1, le=64, description="tensorrt_llm_bls model instances: each a Python stub process of its own, its "
        "requests in threads there; more spread a loaded server's streams (their responses, their prompts' "
        "tokenization) over more processes and cores than one process's GIL")
    instance_kind: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="torch runtime: the tensorrt_llm model's Triton instance group; auto = KIND_GPU (GPU 0) "
        "where the runtime will run on CUDA, else KIND_CPU (Triton refuses KIND_GPU on a machine without GPUs)")
    http_front: bool = Field(
        True, description="validate HTTP generate requests in front of Triton's HTTP endpoint: 400 naming the "
        "field for malformed JSON and wrong types, size limits before parsing (Triton 2.51 answers those with "
        "500, or 200 and an empty stream)")
    exclude_input_in_output: bool = True
    startup_timeout_s: float = Field(180.0, gt=0, le=86_400)
    openai_front: bool = Field(
        True, description="also serve the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions) on "
        "openai_port, bound to host like the other endpoints, translating to the deployment over gRPC")
    openai_port: int = Field(8003, ge=1, le=65535)
    openai_reasoning_parser: Literal["none", "deepseek_r1"] = Field(
        "none", description="deepseek_r1: the text before </think> is returned as reasoning_content (vLLM's "
        "reasoning parser); none: all of it is content")

    @field_validator("host")
    @classmethod
    def _bindable_host(cls, value: str) -> str:
        if not is_host(value):
            raise ValueError(f"{value!r} is not an IP address or a host name (127.0.0.1 serves this machine only, "
                             "0.0.0.0 every interface)")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        if bad := [h for h in value if not is_host(h)]:
            raise ValueError(f"{bad[0]!r} is not an IP address or a host name")
        return value


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def is_host(text: str) -> bool:
    """Whether ``text`` is an IP address or an RFC 1123 host name (what a server can bind, a Host header names)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    return 0 < len(name) <= 253 and all(_HOST_LABEL.match(label) for label in name.split("."))


class EvaluationSection(_Section):
    tasks: list[TaskName] = Field(default_factory=lambda: list(TASKS))
    limit: int | None = Field(None, ge=1, le=10_000_000, description="items per task, a stratified subset; null: all")
    batch_size: int = Field(
        128, ge=1, le=MAX_BATCH,
        description="questions per runtime call (MMLU: sharing one few-shot prefix; GSM8K: in flight)"
    )
    seed: Seed = Field(1234, description="seeds the --limit subset and GSM8K's few-shot exemplars")
    gsm8k_mode: Literal["lm-eval", "reasoning"] = Field(
        "lm-eval", description="lm-eval: 5-shot Question/Answer; reasoning: chat template, zero-shot, \\boxed{}"
    )
    gsm8k_max_new_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                             description="default: 256 (lm-eval), 4096 (reasoning)")
    fidelity_reference: str | None = Field(
        None, min_length=1, description="the build the fidelity task compares this one with: a config name in this "
        "config's directory, or a config file; null: the build is its own reference (its perplexity only)"
    )


class BuildConfig(_Section):
    """One build: a model, how to quantize, shard and build it, and how to serve and judge it."""

    model: ModelSection
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    quantization: QuantizationSection = QuantizationSection()
    parallelism: ParallelismSection = ParallelismSection()
    build: BuildSection = BuildSection()
    runtime: RuntimeSection = RuntimeSection()
    serving: ServingSection = ServingSection()
    evaluation: EvaluationSection = EvaluationSection()

    _name: str = PrivateAttr("")
    _path: Path | None = PrivateAttr(None)

    @property
    def name(self) -> str:
        """The file's stem: names the build everywhere (engines/<name>/, reports, Triton)."""
        return self._name

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def file(self) -> str:
        """The config file as a command line names it (``-c``); a config made in code is named as shipped."""
        return str(self._path or f"build_configs/{self._name}.yaml")

    @property
    def file_arg(self) -> str:
        """``file`` quoted for a shell: what a printed command line says, safe to paste."""
        return shlex.quote(self.file)

    def section(self, name: str) -> dict[str, Any]:
        return getattr(self, name).model_dump(mode="json")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def with_max_batch_size(self, rows: int) -> "BuildConfig":
        """This config with ``build.max_batch_size`` ``rows`` (``bench --in-process --max-batch-size``: the torch
        runtime reads it at load), ``serving.max_batch_size`` lowered to it where above, validated as a file's."""
        data = self.to_dict()
        data["build"] = {**data["build"], "max_batch_size": rows}
        data["serving"] = {**data["serving"], "max_batch_size": min(rows, data["serving"]["max_batch_size"])}
        return config_from_dict(data, name=self._name, path=self._path)

    def with_runtime(self, **settings: Any) -> "BuildConfig":
        """This config with ``runtime`` settings overridden (a command line's ``--tp-mode``), validated
        as the file's would be; None leaves a setting as it is."""
        return self.with_section("runtime", **settings)

    def with_section(self, section: str, **settings: Any) -> "BuildConfig":
        """This config with the settings of ``section`` (dotted: ``quantization.calibration``) overridden, validated
        as the file's would be; None leaves a setting as it is."""
        changes = {k: v for k, v in settings.items() if v is not None}
        if not changes:
            return self
        data = self.to_dict()
        *parents, last = section.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = {**node[last], **changes}
        return config_from_dict(data, name=self._name, path=self._path)


# --------------------------------------------------------------------------- loading


MAX_YAML_BYTES = 1 << 20
MAX_YAML_VALUES = 100_000  # after anchors and aliases are expanded


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hashable = key in seen
            except TypeError:  # an unhashable key: construct_mapping says so itself
                break
            if hashable:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {reprlib.repr(key)} (first on line {seen[key].line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | os.PathLike, what: str = "config") -> Any:
    """A YAML file's data: UTF-8, at most 1 MiB, no duplicate keys, and no anchor/alias expansion
    to more than 100000 values; ConfigError naming the file and the place otherwise."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file ({exc.strerror}).") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: {len(raw)} bytes is too large for a {what} file (at most {MAX_YAML_BYTES}).")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}, line {line}: {raw[exc.start:exc.start + 1]!r}); "
                          f"a {what} file is UTF-8 YAML.", fix="save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {reprlib.repr(problem)[1:-1] if len(problem) > 200 else problem}.",
                          fix="correct the YAML syntax") from None
    except RecursionError:  # thousands of nested [ or {: PyYAML's composer recurses per level
        raise ConfigError(f"{path}: the YAML is nested too deeply to be a {what} file.",
                          fix="a build config is a few levels deep; start from one of build_configs/*.yaml") from None
    if _count_values(data, MAX_YAML_VALUES) > MAX_YAML_VALUES:
        raise ConfigError(f"{path}: the YAML expands to more than {MAX_YAML_VALUES} values (anchors and aliases); "
                          f"a {what} file is far smaller.", fix="write the values out instead of nesting aliases")
    return data


def _count_values(data: Any, limit: int) -> int:
    """Values in ``data`` with aliases counted each time they appear; stops counting past ``limit``."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def load_config(path: str | os.PathLike) -> BuildConfig:
    """Read, validate and cross-check a build config file."""
    path = Path(path)
    if not path.is_file():
        hint = _nearby_configs(path)
        raise ConfigError(f"{path}: no such config file.", fix=hint or "pass an existing build_configs/*.yaml file")
    return config_from_dict(load_yaml(path), name=path.stem, path=path)


def config_from_dict(data: Any, *, name: str, path: Path | None = None) -> BuildConfig:
    where = str(path) if path else name
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a build config must be a YAML mapping with a `model` section.",
                          fix="start from one of build_configs/*.yaml")
    try:
        cfg = BuildConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(where, exc)) from None
    cfg._name, cfg._path = name, path
    problems = static_problems(cfg)
    if problems:
        raise ConfigError(f"{where}: " + " ".join(problems))
    return cfg


def static_problems(cfg: BuildConfig) -> list[str]:
    """Checks that need only the config itself."""
    q, b, p = cfg.quantization, cfg.build, cfg.build.plugins
    out = quantization_problems(cfg)
    for flag in ("low_latency_gemm_plugin", "gemm_swiglu_plugin", "low_latency_gemm_swiglu_plugin"):
        if getattr(p, flag) == "fp8" and q.format != "fp8":
            out.append(
                f"build.plugins.{flag}: `fp8` needs FP8 weights, but quantization.format is {q.format!r}. "
                f"Fix: set quantization.format: fp8, or {flag}: disable."
            )
    if p.gemm_plugin == "fp8" and q.format != "fp8":
        out.append("build.plugins.gemm_plugin: `fp8` needs quantization.format: fp8. Fix: use auto or disable.")
    if b.use_fp8_context_fmha and q.kv_cache != "fp8" and b.use_paged_context_fmha:
        out.append(
            "build.use_fp8_context_fmha: with paged context FMHA it needs an FP8 KV cache "
            "(TensorRT-LLM turns it off otherwise). Fix: set quantization.kv_cache: fp8, or leave it null."
        )
    if b.max_input_len >= b.max_seq_len:
        out.append(
            f"build.max_input_len ({b.max_input_len}) must be below build.max_seq_len ({b.max_seq_len}), "
            "which counts prompt and output tokens. Fix: raise max_seq_len or lower max_input_len."
        )
    if cfg.parallelism.pp != 1:
        out.append("parallelism.pp: only pipeline parallel size 1 is supported. Fix: set pp: 1 and use tp.")
    if (sizes := cfg.runtime.graph_batch_sizes) and (over := [n for n in sizes if n > b.max_batch_size]):
        out.append(f"runtime.graph_batch_sizes: {over} exceed build.max_batch_size ({b.max_batch_size}); no batch that "
                   "large ever runs. Fix: remove them or raise build.max_batch_size.")
    if cfg.serving.max_batch_size > b.max_batch_size:
        out.append(
            f"serving.max_batch_size ({cfg.serving.max_batch_size}) exceeds build.max_batch_size "
            f"({b.max_batch_size}); the engine would reject such batches. Fix: lower it."
        )
    out += speculative_problems(cfg)
    ports = [cfg.serving.http_port, cfg.serving.grpc_port, cfg.serving.metrics_port]
    ports += [cfg.serving.openai_port] if cfg.serving.openai_front else []
    if len(set(ports)) != len(ports):
        out.append("serving: http_port, grpc_port, metrics_port and openai_port must differ. Fix: give each its own "
                   "port.")
    return out


def speculative_problems(cfg: BuildConfig) -> list[str]:
    spec = cfg.runtime.speculative
    out = []
    if spec.ngram_min > spec.ngram_max:
        out.append(f"runtime.speculative.ngram_min ({spec.ngram_min}) exceeds ngram_max ({spec.ngram_max}). "
                   "Fix: make ngram_min <= ngram_max.")
    if spec.method == "draft" and not spec.draft_checkpoint:
        out.append("runtime.speculative.method: draft needs runtime.speculative.draft_checkpoint (the draft model's "
                   "checkpoint directory). Fix: set it, or use method: ngram.")
    if spec.method == "eagle3" and not spec.draft_checkpoint:
        out.append("runtime.speculative.method: eagle3 needs runtime.speculative.draft_checkpoint (the EAGLE-3 head's "
                   "directory: config.json and *.safetensors, trained for this model). Fix: set it, or use method: "
                   "ngram.")
    if spec.draft_layers is not None and spec.method != "self":
        out.append(f"runtime.speculative.draft_layers is set but method is {spec.method!r}; it would be ignored. "
                   "Fix: set method: self, or remove draft_layers.")
    if spec.tree is not None and spec.method != "ngram":
        out.append(f"runtime.speculative.tree is set but method is {spec.method!r}; only prompt lookup drafts "
                   "trees, so it would be ignored. Fix: set method: ngram, or remove tree.")
    if spec.draft_checkpoint and spec.method not in CHECKPOINT_METHODS:
        out.append(f"runtime.speculative.draft_checkpoint is set but method is {spec.method!r}; it would be ignored. "
                   "Fix: set method: draft (a draft model) or eagle3 (an EAGLE-3 head), or remove draft_checkpoint.")
    return out


def model_problems(cfg: BuildConfig, shape: ModelShape) -> list[str]:
    """Checks that need the model's architecture (from its config.json or the catalog)."""
    tp, heads, kv = cfg.parallelism.tp, shape.num_attention_heads, shape.num_key_value_heads
    divisors = [d for d in range(1, heads + 1) if heads % d == 0 and (d % kv == 0 or kv % d == 0)]
    out = []
    if heads % tp:
        out.append(
            f"parallelism.tp: {tp} does not divide the model's {heads} attention heads. "
            f"Fix: use tp in {divisors}."
        )
    elif tp % kv and kv % tp:
        out.append(
            f"parallelism.tp: the model's {kv} KV heads cannot be spread over {tp} ranks (TensorRT-LLM "
            f"needs tp to divide them or to be a multiple of them, to replicate them). Fix: use tp in {divisors}."
        )
    out += group_problems(cfg, shape)
    if cfg.build.max_seq_len > shape.max_position_embeddings:
        out.append(
            f"build.max_seq_len ({cfg.build.max_seq_len}) exceeds the model's "
            f"{shape.max_position_embeddings} positions. Fix: lower it."
        )
    return out


def group_problems(cfg: BuildConfig, shape: ModelShape) -> list[str]:
    """Group-quantized formats need every rank's input features of every linear in whole groups.

    The inputs per rank (TensorRT-LLM's sharding): hidden_size for attention.qkv, mlp.fc and mlp.gate
    (column-parallel), heads x head_dim / tp for attention.dense and intermediate_size / tp for mlp.proj
    (row-parallel). ModelOpt's INT4 packing refuses partial blocks; TensorRT-LLM's kernels need whole ones.
    """
    q, tp = cfg.quantization, cfg.parallelism.tp
    group = q.group_size
    if not group or shape.num_attention_heads % tp:
        return []
    inputs = {"hidden_size": shape.hidden_size,
              "attention.dense's heads x head_dim / tp": shape.num_attention_heads * shape.head_dim // tp,
              "mlp.proj's intermediate_size / tp": shape.intermediate_size // tp}
    bad = {name: n for name, n in inputs.items() if n % group}
    if not bad:
        return []
    key = "quantization.awq_block_size" if q.format in AWQ_FORMATS else "quantization.format"
    fits = [g for g in (128, 64, 32, 16, 8) if all(n % g == 0 for n in inputs.values())]
    fix = (f"set awq_block_size to one of {fits}" if fits and q.format in AWQ_FORMATS
           else "use a smaller tp" if tp > 1 else "use a per-channel format (int8_sq, int8_wo) or fp8")
    return [f"{key}: {q.format} quantizes weights in groups of {group} input features, but at tp={tp} "
            + ", ".join(f"{name} is {n}" for name, n in bad.items()) + f", not a multiple of {group}. Fix: {fix}."]


def check_against_model(cfg: BuildConfig, shape: ModelShape) -> None:
    problems = model_problems(cfg, shape)
    if problems:
        raise ConfigError(f"{cfg.path or cfg.name}: " + " ".join(problems))


# --------------------------------------------------------------------------- messages


_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60
_shown.maxlist = _shown.maxdict = 4
_shown.maxlevel = 2
MAX_ERRORS_SHOWN = 10


def _format_validation_error(where: str, exc: ValidationError) -> str:
    lines = []
    errors = exc.errors()
    for err in errors[:MAX_ERRORS_SHOWN]:
        err = dict(err, input=_Shown(err.get("input")))
        loc = ".".join(str(p) for p in err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = err["loc"][:-1]
            known = _known_keys(parent)
            guess = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            lines.append(f"{loc}: unknown key; {hint}known keys here: {', '.join(known)}.")
        elif kind == "missing":
            lines.append(f"{loc}: required key is missing.")
        elif kind == "literal_error":
            lines.append(f"{loc}: {err['input']!r} is not allowed; use one of {err['ctx']['expected']}.")
            if loc == "runtime.backend":
                lines.append("  (" + "; ".join(f"{name} needs {needs}" for name, needs in BACKEND_NEEDS.items()) + ")")
        elif kind == "value_error":
            lines.append(f"{loc}: {err['ctx']['error']}.")
        elif kind.endswith("_type") or kind.endswith("_parsing"):
            got = type(err["input"].value).__name__
            lines.append(f"{loc}: {err['msg'].lower()}, got {err['input']!r} ({got}).")
        else:
            lines.append(f"{loc}: {err['msg']} (got {err['input']!r}).")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"(and {len(errors) - MAX_ERRORS_SHOWN} more)")
    return f"{where}: invalid config. " + " ".join(lines)


class _Shown:
    """A value in an error message, its repr bounded (a value may be huge: YAML aliases)."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return _shown.repr(self.value)


def _known_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = BuildConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        sub = getattr(field, "annotation", None) if field else None
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            model = sub
        else:
            break
    return list(model.model_fields)


def _nearby_configs(path: Path) -> str | None:
    folder = path.parent if path.parent.is_dir() else Path("build_configs")
    names = sorted(p.name for p in folder.glob("*.yaml")) if folder.is_dir() else []
    guess = difflib.get_close_matches(path.name, names, n=3)
    if guess:
        return "did you mean " + ", ".join(str(folder / g) for g in guess) + "?"
    return None
