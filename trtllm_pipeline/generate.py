"""``generate``: run a prompt through the built engine in-process, or through a served model, streaming text.

The model's chat template is applied unless ``raw`` (``chat``); in-process, text is produced by the
same incremental detokenizer (``runtimes.base.TextStream``) that the Triton deployment uses, so a
prompt gives the same text in-process and served. Either way the command streams a
``Generation``: its text pieces, then one line of statistics.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from trtllm_pipeline import artifacts
from trtllm_pipeline.chat import encode_prompt, served_prompt
from trtllm_pipeline.client import connect
from trtllm_pipeline.config import BuildConfig
from trtllm_pipeline.endpoints import is_openai_url, resolve_url
from trtllm_pipeline.errors import InputError
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TextStream
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.tokenizer import Tokenizer


@dataclasses.dataclass
class GenerationStats:
    runtime: dict
    prompt_tokens: int
    output_tokens: int
    seconds: float


@dataclasses.dataclass
class Generation:
    """What ``generate`` prints: notes (stderr), the text as it streams (stdout), then statistics (stderr)."""

    pieces: Iterator[str]
    summary: Callable[[], str]  # once the pieces are consumed
    notes: list[str] = dataclasses.field(default_factory=list)


def stream_text(runtime: Runtime, prompt: str, params: SamplingParams, *, raw: bool = False,
                system: str | None = None, stats: list | None = None) -> Iterator[str]:
    """Yield text pieces; append a GenerationStats to ``stats`` when done."""
    ids = encode_prompt(runtime.tokenizer, prompt, raw=raw, system=system)
    text = TextStream(runtime.tokenizer, params.stop_words)
    start = time.perf_counter()
    yield from runtime.stream(ids, params, text=text)
    if stats is not None:
        stats.append(GenerationStats(runtime.describe(), len(ids), len(text.token_ids), time.perf_counter() - start))


def open_runtime(cfg: BuildConfig, engines_dir: str | Path = "engines", device: str | None = None,
                 runtime: str | None = None) -> Runtime:
    return load_runtime(cfg, engines_dir, runtime, **({"device": device} if device else {}))


def in_process(cfg: BuildConfig, prompt: str, params: SamplingParams, *, engines_dir: str | Path = "engines",
               raw: bool = False, system: str | None = None, device: str | None = None,
               runtime: str | None = None) -> Generation:
    """The built engine of ``cfg``, run here (``runtime``: the one it must have been built for, if given)."""
    runtime = open_runtime(cfg, engines_dir, device, runtime)
    stats: list[GenerationStats] = []

    def summary() -> str:
        s = stats[0]
        rate = s.output_tokens / s.seconds if s.seconds > 0 else float("nan")
        where = s.runtime.get("device", "")
        if s.runtime.get("tp_mode") == "distributed":
            n = s.runtime["world_size"]
            where += f", tensor parallel in {n} process{'es' if n != 1 else ''}"
        elif s.runtime.get("checkpoint_tp", 1) > 1:
            where += f", {s.runtime['checkpoint_tp']} TP shards merged in one process"
        return (f"[{s.runtime['runtime']} runtime, {where}; {s.prompt_tokens} prompt tokens, "
                f"{s.output_tokens} generated in {s.seconds:.2f} s ({rate:.1f} tokens/s)]")

    return Generation(stream_text(runtime, prompt, params, raw=raw, system=system, stats=stats), summary)


def served(prompt: str, params: SamplingParams, *, url: str, protocol: str = "grpc", cfg: BuildConfig | None = None,
           engines_dir: str | Path = "engines", raw: bool = False, system: str | None = None) -> Generation:
    """A served model at ``url`` (``default``: where ``serve`` runs ``cfg``); templated with ``cfg``'s tokenizer
    unless ``raw``."""
    target = resolve_url(url, protocol, cfg, engines_dir)
    protocol = "openai" if is_openai_url(target) else protocol
    notes = []
    if cfg is None and not raw:
        notes.append("note: without -c there is no tokenizer here for the chat template; the prompt is sent as is")
    start, responses = time.perf_counter(), [0]

    def pieces() -> Iterator[str]:
        for piece in stream_served(prompt, url=target, protocol=protocol, cfg=cfg, engines_dir=engines_dir, raw=raw,
                                   system=system, **ensemble_inputs(params)):
            responses[0] += 1
            yield piece

    def summary() -> str:
        unit = "streamed pieces" if protocol == "openai" else "streamed responses"  # OpenAI chunks are not tokens
        return f"[served by {target} ({protocol}); {responses[0]} {unit} in {time.perf_counter() - start:.2f} s]"

    return Generation(pieces(), summary, notes)


def ensemble_inputs(params: SamplingParams) -> dict[str, Any]:
    """The ensemble inputs for ``params``: the sampling ones only when sampling, then all of them (the
    server samples only when ``top_k`` or ``top_p`` is given, as TensorRT-LLM does)."""
    values: dict[str, Any] = {"max_tokens": params.max_tokens, "stop_words": list(params.stop_words) or None}
    if params.greedy:
        return values
    return values | {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                     "random_seed": params.seed}


def stream_served(prompt: str, *, url: str, protocol: str = "grpc", cfg: BuildConfig | None = None,
                  engines_dir: str | Path = "engines", raw: bool = False, system: str | None = None,
                  **params) -> Iterator[str]:
    """Text pieces of ``prompt`` from a served model; templated with ``cfg``'s tokenizer unless ``raw``."""
    text = prompt
    if not raw and cfg is not None:
        tokenizer_dir = artifacts.artifact_paths(engines_dir, cfg.name).tokenizer
        if not tokenizer_dir.is_dir():
            raise InputError(f"{tokenizer_dir} does not exist, so the chat template cannot be applied here.",
                             fix="pass --raw to send the prompt as it is, or point --engines-dir at the build")
        text = served_prompt(artifacts.checked_tokenizer(tokenizer_dir, Tokenizer), prompt, system)
    with connect(url, protocol) as client:
        yield from client.stream(text, **params)
