"""TensorRT-LLM's Triton tensor contract: what a client sends, what the engine model takes and returns.

Names, data types and dims follow TensorRT-LLM 1.x's templates (``triton_backend/all_models/
inflight_batcher_llm/*/config.pbtxt`` in NVIDIA/TensorRT-LLM, e.g. tensorrt_llm@0c8de69a), where the
engine takes ``min_tokens`` and ``seed`` (0.19 and older: ``min_length``, ``random_seed``). The
repository writer, the client, the served models and every backend's ``tensorrt_llm`` model read
them from here, so the contract is stated once.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

LOGITS_DATATYPE = "TYPE_FP32"  # generation logits as TensorRT-LLM gathers them (float32)

# The client contract of `ensemble` and `tensorrt_llm_bls`, identical for both runtimes:
# (name, data type, dims, the tensorrt_llm input it feeds, or None when preprocessing consumes it).
CLIENT_INPUTS = [
    ("text_input", "TYPE_STRING", [1], None),
    ("max_tokens", "TYPE_INT32", [1], None),
    ("stream", "TYPE_BOOL", [1], "streaming"),
    ("temperature", "TYPE_FP32", [1], "temperature"),
    ("top_k", "TYPE_INT32", [1], "runtime_top_k"),
    ("top_p", "TYPE_FP32", [1], "runtime_top_p"),
    ("random_seed", "TYPE_UINT64", [1], "seed"),
    ("end_id", "TYPE_INT32", [1], None),
    ("pad_id", "TYPE_INT32", [1], None),
    ("stop_words", "TYPE_STRING", [-1], None),
    ("bad_words", "TYPE_STRING", [-1], None),
    ("exclude_input_in_output", "TYPE_BOOL", [1], "exclude_input_in_output"),
    ("min_tokens", "TYPE_INT32", [1], "min_tokens"),
    ("return_generation_logits", "TYPE_BOOL", [1], "return_generation_logits"),
]
REQUIRED_INPUTS = ("text_input", "max_tokens")
# tensorrt_llm_bls's output beside text_output: the generated tokens one response stands for (1 each, as
# TensorRT-LLM streams; several when the server coalesces: TRTLLM_PIPELINE_STREAM_COALESCE). The ensemble has none.
NUM_OUTPUT_TOKENS = "num_output_tokens"
# The model clients are pointed at: it takes the contract above and, unlike the ensemble in Triton
# 2.51, stops a request whose client disconnected or cancelled it (docs/serving.md).
FRONT_MODEL = "tensorrt_llm_bls"
# Request ids given by the HTTP front (and passed on by the BLS to its engine request): a request with
# one is stopped by a stop request with the same id, so the engine model need not poll it.
STOP_ID_PREFIX = "front-"
BLS_ID_PREFIX = "bls-"
# The request parameter by which the BLS marks its engine requests (a front's id passes through it unchanged)
BLS_PARAMETER = "trtllm_pipeline_bls"

# tensorrt_llm_bls tokenizes prompts up to this many bytes itself (~1k tokens: ~2 ms of its GIL at most on this
# project's CPU machine), longer ones through the preprocessing model (the tokenizer holds the GIL while it works)
LOCAL_TOKENIZE_BYTES = 4096

# ensemble input -> preprocessing input, and preprocessing output -> tensorrt_llm input.
PREPROCESSING_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
                         "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
PREPROCESSING_OUTPUTS = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
                          "REQUEST_OUTPUT_LEN": "request_output_len", "STOP_WORDS_IDS": "stop_words_list",
                          "BAD_WORDS_IDS": "bad_words_list", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id"}


# TensorRT-LLM 1.x tensorrt_llm inputs (name, dtype, dims, flags): s = scalar (reshape to []),
# o = optional, r = allow_ragged_batch. None dtypes are filled per build (model and logits dtypes).
TRTLLM_INPUTS = [
    ("input_ids", "TYPE_INT32", [-1], "or"), ("encoder_input_features", None, [-1, -1], "or"),
    ("encoder_output_lengths", "TYPE_INT32", [1], "so"), ("input_lengths", "TYPE_INT32", [1], "s"),
    ("request_output_len", "TYPE_INT32", [1], "s"), ("num_return_sequences", "TYPE_INT32", [1], "so"),
    ("draft_input_ids", "TYPE_INT32", [-1], "or"), ("decoder_input_ids", "TYPE_INT32", [-1], "or"),
    ("decoder_input_lengths", "TYPE_INT32", [1], "so"), ("draft_logits", LOGITS_DATATYPE, [-1, -1], "or"),
    ("draft_acceptance_threshold", "TYPE_FP32", [1], "so"), ("end_id", "TYPE_INT32", [1], "so"),
    ("pad_id", "TYPE_INT32", [1], "so"), ("stop_words_list", "TYPE_INT32", [2, -1], "or"),
    ("bad_words_list", "TYPE_INT32", [2, -1], "or"), ("embedding_bias", "TYPE_FP32", [-1], "or"),
    ("beam_width", "TYPE_INT32", [1], "so"), ("temperature", "TYPE_FP32", [1], "so"),
    ("runtime_top_k", "TYPE_INT32", [1], "so"), ("runtime_top_p", "TYPE_FP32", [1], "so"),
    ("runtime_top_p_min", "TYPE_FP32", [1], "so"), ("runtime_top_p_decay", "TYPE_FP32", [1], "so"),
    ("runtime_top_p_reset_ids", "TYPE_INT32", [1], "so"), ("len_penalty", "TYPE_FP32", [1], "so"),
    ("early_stopping", "TYPE_BOOL", [1], "so"), ("repetition_penalty", "TYPE_FP32", [1], "so"),
    ("min_tokens", "TYPE_INT32", [1], "so"), ("beam_search_diversity_rate", "TYPE_FP32", [1], "so"),
    ("presence_penalty", "TYPE_FP32", [1], "so"), ("frequency_penalty", "TYPE_FP32", [1], "so"),
    ("seed", "TYPE_UINT64", [1], "so"), ("return_log_probs", "TYPE_BOOL", [1], "so"),
    ("return_context_logits", "TYPE_BOOL", [1], "so"), ("return_generation_logits", "TYPE_BOOL", [1], "so"),
    ("return_perf_metrics", "TYPE_BOOL", [1], "so"), ("exclude_input_in_output", "TYPE_BOOL", [1], "so"),
    ("stop", "TYPE_BOOL", [1], "so"), ("streaming", "TYPE_BOOL", [1], "so"),
    ("prompt_embedding_table", None, [-1, -1], "or"), ("prompt_table_extra_ids", "TYPE_UINT64", [-1], "or"),
    ("prompt_vocab_size", "TYPE_INT32", [1], "so"),
    ("lora_task_id", "TYPE_UINT64", [1], "so"), ("lora_weights", "TYPE_FP16", [-1, -1], "or"),
    ("lora_config", "TYPE_INT32", [-1, 3], "or"),
]
TRTLLM_OUTPUTS = [
    ("output_ids", "TYPE_INT32", [-1, -1]), ("sequence_length", "TYPE_INT32", [-1]),
    ("cum_log_probs", "TYPE_FP32", [-1]), ("output_log_probs", "TYPE_FP32", [-1, -1]),
    ("context_logits", LOGITS_DATATYPE, [-1, -1]), ("generation_logits", LOGITS_DATATYPE, [-1, -1, -1]),
    ("batch_index", "TYPE_INT32", [1]), ("sequence_index", "TYPE_INT32", [1]),
]


def dynamic_batching(cfg: "BuildConfig") -> dict[str, Any]:
    return {"preferred_batch_size": [cfg.serving.max_batch_size],
            "max_queue_delay_microseconds": cfg.serving.max_queue_delay_microseconds,
            "default_queue_policy": {"max_queue_size": 0}}  # 0: unbounded, TensorRT-LLM's default


# --------------------------------------------------------------------------- the front door's limits


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What one request may bring, checked where it enters (HTTP front, BLS, preprocessing, OpenAI
    front) before any expensive work: ``request_limits`` computes them, once, from the config."""

    max_input_tokens: int  # build.max_input_len
    max_seq_len: int  # build.max_seq_len: prompt and output tokens
    max_text_bytes: int  # a prompt of more UTF-8 bytes cannot be max_input_tokens long: refused before tokenizing
    max_batch: int  # prompts per request (serving.max_batch_size)
    max_words: int = 64  # stop words, and bad words, per request
    max_word_bytes: int = 1024  # each

    @property
    def max_body_bytes(self) -> int:
        """An HTTP generate body that can hold such a request (one prompt): the prompt JSON-escaped (a
        byte is at most 6 characters, ``\\u0001``), the word lists, and room for the other fields."""
        words = 2 * self.max_words * 6 * self.max_word_bytes
        return 6 * self.max_text_bytes + words + 64 * 1024

    def text_problem(self, name: str, size: int) -> str | None:
        if size > self.max_text_bytes:
            return (f"{name} is {size} bytes; this engine takes at most {self.max_input_tokens} tokens "
                    f"(build.max_input_len), which no text of more than {self.max_text_bytes} bytes fits")
        return None

    def words_problem(self, name: str, words: list) -> str | None:
        if len(words) > self.max_words:
            return f"{name} has {len(words)} entries; at most {self.max_words}"
        if any(len(w) > self.max_word_bytes for w in words):
            return f"{name}: each entry may be at most {self.max_word_bytes} bytes"
        return None

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def request_limits(cfg: "BuildConfig", max_token_bytes: int) -> RequestLimits:
    """The limits of ``cfg``'s engine; ``max_token_bytes``: the longest text one token of the build's
    tokenizer stands for (``longest_token_bytes``), so that the byte limit never refuses a prompt
    the engine would take."""
    b = cfg.build
    return RequestLimits(max_input_tokens=b.max_input_len, max_seq_len=b.max_seq_len,
                         max_text_bytes=b.max_input_len * max(1, max_token_bytes),
                         max_batch=cfg.serving.max_batch_size)


def longest_token_bytes(tokenizer) -> int:
    """UTF-8 bytes of the longest text a single token decodes to (special tokens included: a prompt
    may spell one out); a partial character decodes to U+FFFD, 3 bytes, over its true 1-3."""
    return max((len(tokenizer.decode([i]).encode("utf-8")) for i in range(len(tokenizer))), default=1)
