"""The TensorRT-LLM 1.2.x runtime: a built engine run in-process by the executor bindings.

Nothing here imports TensorRT-LLM at module level: ``TrtllmRuntime.from_engine`` raises
``UnavailableError`` (exit 3) on a machine without it instead of pretending. The bindings used are
those of ``examples/bindings/executor/example_advanced.py`` in TensorRT-LLM's 1.2 sources.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import InputError, StageFailed, UnavailableError
from trtllm_pipeline.machine import gpus, package_version, trtllm_status
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TokenEvent
from trtllm_pipeline.runtimes.trtllm.commands import (engine_run_command, engine_world_size, generate_argv, quoted,
                                                      read_engine_config)

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

log = logging.getLogger(__name__)

_FINISH = {"END_ID": "end_id", "STOP_WORDS": "stop", "LENGTH": "length", "CANCELLED": "cancelled",
           "TIMED_OUT": "length"}


def mpi_world_size() -> int:
    """World size of the MPI job this process belongs to (1 outside mpirun)."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_WORLD_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


class TrtllmRuntime(Runtime):
    """A TensorRT-LLM engine run by the executor bindings (``tensorrt_llm.bindings.executor``).

    The executor's ``enqueue_request``/``await_responses`` is exactly ``submit``/``step``: requests
    are queued, in-flight batched by the engine, and stream their new tokens per iteration.
    """

    name = "tensorrt_llm"

    def __init__(self, executor, bindings, tokenizer, engine_dir: Path, engine_config: dict, poll_ms: int = 50):
        self._executor, self._tllm = executor, bindings
        self.tokenizer = tokenizer
        self.engine_dir = engine_dir
        build = engine_config["build_config"]
        self.max_batch_size = int(build["max_batch_size"])
        self.max_seq_len = int(build["max_seq_len"])
        self._pretrained = engine_config["pretrained_config"]
        self._gather = {"context": bool(build.get("gather_context_logits")),
                        "generation": bool(build.get("gather_generation_logits"))}
        self._poll = datetime.timedelta(milliseconds=poll_ms)
        self._ours: dict[int, Any] = {}  # executor request id -> caller's request id
        self._theirs: dict[Any, int] = {}

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg: "BuildConfig", manifest: dict, **opts) -> "TrtllmRuntime":
        version, problem = trtllm_status()
        if problem:
            raise UnavailableError(f"cannot load the TensorRT-LLM engine in {engine_dir}: {problem.problem}.",
                                   fix="run where tensorrt_llm 1.2.x is installed, or build for the torch runtime")
        engine_dir = Path(engine_dir)
        world = engine_world_size(engine_dir, cfg)
        running = mpi_world_size()
        if running != world:
            argv = generate_argv(cfg)
            raise InputError(
                f"the engine in {engine_dir} has world size {world} (one process per GPU) but this process "
                f"runs in an MPI world of {running}.",
                fix=f"launch it with one rank per GPU, e.g. `{quoted(engine_run_command(cfg, engine_dir, argv))}`")
        import tensorrt_llm.bindings.executor as tllm
        from transformers import AutoTokenizer

        exec_cfg = tllm.ExecutorConfig(1)
        exec_cfg.kv_cache_config = tllm.KvCacheConfig(
            free_gpu_memory_fraction=cfg.runtime.kv_cache_free_gpu_mem_fraction,
            enable_block_reuse=cfg.runtime.enable_kv_cache_reuse)
        executor = tllm.Executor(str(engine_dir), tllm.ModelType.DECODER_ONLY, exec_cfg)
        if not executor.can_enqueue_requests():
            # Ranks > 0 of a leader-mode MPI job only execute what rank 0 enqueues; they stay in
            # shutdown() until rank 0 shuts down, then leave.
            executor.shutdown()
            raise SystemExit(0)
        tokenizer = AutoTokenizer.from_pretrained(artifacts.ArtifactPaths(engine_dir.parent).tokenizer)
        log.info("tensorrt_llm runtime: TensorRT-LLM %s, engine %s, world size %d", version, engine_dir, world)
        return cls(executor, tllm, tokenizer, engine_dir, read_engine_config(engine_dir), **opts)

    # ---- Runtime interface

    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        params.check()
        request = self._request(list(prompt_ids), params.max_tokens, params, streaming=True)
        engine_id = self._executor.enqueue_request(request)
        self._ours[engine_id], self._theirs[request_id] = request_id, engine_id

    def step(self) -> list[TokenEvent]:
        events = []
        for response in self._executor.await_responses(self._poll):
            ours = self._ours.get(response.request_id)
            if ours is None:
                continue
            if response.has_error():  # that request alone: the executor goes on with the others
                self._forget(ours)
                events.append(TokenEvent(ours, [], "error", error=f"TensorRT-LLM: {response.error_msg}"))
                continue
            result = response.result
            reason = _finish_reason(result.finish_reasons[0]) if result.is_final else None
            events.append(TokenEvent(ours, list(result.output_token_ids[0]), reason))
            if result.is_final:
                self._forget(ours)
        return events

    def cancel(self, request_id: Any) -> None:
        engine_id = self._theirs.get(request_id)
        if engine_id is not None:
            self._executor.cancel_request(engine_id)
            self._forget(request_id)

    def has_work(self) -> bool:
        return bool(self._ours)

    def score(self, contexts: Sequence[Sequence[int]],
              continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation from the engine's logits.

        With context logits (``--gather_context_logits``) one request per pair; else with generation
        logits (``build.gather_generation_logits``) one single-token request per continuation token.
        """
        if self._gather["context"]:
            return self._score_with_context_logits(contexts, continuations)
        if self._gather["generation"]:
            return self._score_with_generation_logits(contexts, continuations)
        raise InputError(f"the engine in {self.engine_dir} was built without logits output, so it cannot score "
                         "continuations (MMLU log-likelihood).",
                         fix="set build.gather_generation_logits: true in the config and rebuild")

    def describe(self) -> dict[str, Any]:
        quant = self._pretrained.get("quantization") or {}
        world = self._pretrained.get("mapping", {}).get("world_size", 1)
        devices = gpus()
        device = f"{devices[0].name} x{world}" if devices else None
        return {"runtime": self.name, "device": device, "engine_dir": str(self.engine_dir),
                "tensorrt_llm": package_version("tensorrt_llm"),
                "world_size": self._pretrained.get("mapping", {}).get("world_size", 1),
                "dtype": self._pretrained.get("dtype"), "quant_algo": quant.get("quant_algo"),
                "kv_cache_quant_algo": quant.get("kv_cache_quant_algo")}

    def close(self) -> None:
        self._executor.shutdown()

    # ---- internals

    def _request(self, prompt: list[int], max_tokens: int, params: SamplingParams, *, streaming: bool,
                 context_logits: bool = False, generation_logits: bool = False):
        tllm = self._tllm
        sampling = tllm.SamplingConfig(
            beam_width=1, top_k=1 if params.greedy else (params.top_k or None),
            top_p=None if params.greedy else params.top_p,
            temperature=None if params.greedy else params.temperature, seed=params.seed,
            min_tokens=params.min_tokens or None)
        output = tllm.OutputConfig(return_context_logits=context_logits, return_generation_logits=generation_logits,
                                   exclude_input_from_output=True)
        end_id = self.tokenizer.eos_token_id if params.end_id is None else params.end_id
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else end_id
        return tllm.Request(input_token_ids=prompt, max_tokens=max_tokens, streaming=streaming,
                            sampling_config=sampling, output_config=output,
                            end_id=None if end_id == -1 else end_id, pad_id=pad_id)

    def _forget(self, request_id: Any) -> None:
        engine_id = self._theirs.pop(request_id, None)
        self._ours.pop(engine_id, None)

    def _run_to_completion(self, prompts: list[list[int]], **logits) -> list[Any]:
        """Final results of single-token, non-streaming requests, in order."""
        greedy = SamplingParams(max_tokens=1, end_id=-1)
        ids = [self._executor.enqueue_request(self._request(p, 1, greedy, streaming=False, **logits)) for p in prompts]
        results: dict[int, Any] = {}
        while len(results) < len(ids):
            for response in self._executor.await_responses(self._poll):
                if response.has_error():
                    raise StageFailed(f"TensorRT-LLM scoring request failed: {response.error_msg}",
                                      fix="check context lengths against build.max_input_len")
                if response.result.is_final:
                    results[response.request_id] = response.result
        return [results[i] for i in ids]

    def _score_with_context_logits(self, contexts, continuations):
        import torch

        prompts = [list(c) + list(k) for c, k in zip(contexts, continuations)]
        out = []
        for ctx, cont, result in zip(contexts, continuations, self._run_to_completion(prompts, context_logits=True)):
            logits = self._unpadded(torch.as_tensor(result.context_logits))  # [prompt length, vocab]
            rows = logits[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
            out.append(_loglikelihood(rows, list(cont)))
        return out

    def _score_with_generation_logits(self, contexts, continuations):
        import torch

        prompts, owners = [], []
        for n, (ctx, cont) in enumerate(zip(contexts, continuations)):
            for k in range(len(cont)):
                prompts.append(list(ctx) + list(cont[:k]))
                owners.append(n)
        rows: dict[int, list] = collections.defaultdict(list)
        for n, result in zip(owners, self._run_to_completion(prompts, generation_logits=True)):
            rows[n].append(self._unpadded(torch.as_tensor(result.generation_logits))[0])
        return [_loglikelihood(torch.stack(rows[n]), list(cont)) for n, cont in enumerate(continuations)]

    def _unpadded(self, logits):
        """[tokens, vocab] float32 on the CPU, without the columns of the vocabulary padded for TP."""
        logits = logits.float().cpu()
        return logits.reshape(-1, logits.shape[-1])[:, : int(self._pretrained["vocab_size"])]


def _loglikelihood(logits, targets: list[int]) -> tuple[float, bool]:
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    picked = logprobs[torch.arange(len(targets)), torch.tensor(targets)]
    greedy = bool((logprobs.argmax(dim=-1) == torch.tensor(targets)).all())
    return float(picked.sum()), greedy


def _finish_reason(reason) -> str:
    return _FINISH.get(getattr(reason, "name", str(reason)).split(".")[-1], "length")
