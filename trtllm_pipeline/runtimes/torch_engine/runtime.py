"""The torch runtime: runs the exported TensorRT-LLM checkpoint in PyTorch, on CPU or CUDA.

The "engine" of this runtime is the validated checkpoint itself (``engines/<config>/checkpoint``)
plus the build manifest that names it. A TP checkpoint runs as ``runtime.tp_mode`` says: merged
(every rank's slice reassembled at load time, checked for consistency, run on one device by a
``LocalExecutor``) or distributed (one process per rank, each loading only its own shard, this
process rank 0: ``runtimes/torch_engine/tp``, a ``TpExecutor``); the math is the engine's (see ``torch_engine/model``).
The executor (``torch_engine/executor``) is the seam: this class keeps the scheduler and the sampling, the
executor runs the model. Scheduling is continuous batching over ``max_batch_size`` cache slots:
each ``step`` prefills admitted requests (at most ``prefill_chunk_tokens`` prompt tokens a step, so
a long prompt is spread over steps instead of stalling the requests already decoding) and decodes
one token for the running ones. On CUDA the decode step runs as fused Triton kernels replayed from
CUDA graphs (``cuda/``); eager PyTorch stays the CPU path and the reference it is checked against.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from trtllm_pipeline import artifacts, checkpoint
from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.runtimes.torch_engine import sampling
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TokenEvent
from trtllm_pipeline.runtimes.torch_engine.executor import Executor, ExecutorLost, LocalExecutor
from trtllm_pipeline.runtimes.torch_engine.model import Qwen2Engine
from trtllm_pipeline.runtimes.torch_engine.tp.executor import TpExecutor
from trtllm_pipeline.runtimes.torch_engine.tp.mode import resolve_tp_mode

log = logging.getLogger(__name__)

KEY_BLOCK = 256  # attention spans cache positions rounded up to this, to keep shapes few


@dataclasses.dataclass
class _Request:
    request_id: Any
    prompt: list[int]
    params: SamplingParams
    end_id: int
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the cache
    generated: list[int] = dataclasses.field(default_factory=list)
    generator: torch.Generator | None = None
    bad_ids: list[list[int]] = dataclasses.field(default_factory=list)  # bad words, tokenized once

    @property
    def length(self) -> int:  # tokens in the cache once the last generated token is fed back
        return len(self.prompt) + len(self.generated)

    def banned(self) -> list[int]:
        """Tokens this request may not produce next: its end id before min_tokens, bad words' last tokens."""
        out = [self.end_id] if len(self.generated) < self.params.min_tokens and self.end_id >= 0 else []
        for ids in self.bad_ids:
            if len(ids) == 1 or self.generated[-(len(ids) - 1):] == ids[:-1]:
                out.append(ids[-1])
        return out


def _check_cache_fits(config: dict, device: torch.device, slots: int, max_seq_len: int, dtype: torch.dtype,
                      ranks: int = 1) -> None:
    """The static KV cache must fit in what the device has free; else say which limits to lower
    (instead of an allocator failure naming exabytes). ``ranks`` > 1: each rank holds its KV heads;
    on CPU they all share this machine's memory, on CUDA each has a GPU (checked: the first)."""
    layout = checkpoint.CheckpointLayout(config)
    kv_heads = layout.kv_heads_per_rank if ranks > 1 else layout.kv_heads
    need = 2 * layout.layers * slots * kv_heads * max_seq_len * layout.head_size * dtype.itemsize
    if device.type != "cuda":
        need *= ranks
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _available_host_memory()
    if free is not None and need > free:
        raise UnavailableError(
            f"the torch runtime's KV cache for build.max_batch_size {slots - 1} x build.max_seq_len {max_seq_len} "
            f"needs {need / 2**30:.1f} GiB; {device} has {free / 2**30:.1f} GiB free.",
            fix="lower build.max_batch_size or build.max_seq_len (the cache is allocated whole, at load)")


def _available_host_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resolve_device(requested: str | None) -> torch.device:
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UnavailableError("runtime.device: cuda was asked for but torch sees no CUDA GPU.",
                               fix="use device cpu (or auto), or install a CUDA build of torch")
    return torch.device(requested)


class TorchRuntime(Runtime):
    name = "torch"

    def __init__(self, checkpoint_dir: Path, tokenizer_dir: Path, *, device: str | None = None,
                 max_batch_size: int = 8, max_seq_len: int = 4096, max_input_len: int | None = None,
                 dtype: str | None = None, fast_decode: bool = True, cuda_graphs: bool = True,
                 graph_batch_sizes: Sequence[int] | None = None, prefill_chunk_tokens: int = 2048,
                 tp_mode: str = "auto"):
        """``dtype`` overrides the checkpoint's compute dtype (FP8 weights stay FP8 values).

        ``tp_mode``: ``auto`` | ``merged`` | ``distributed`` for a tp>1 checkpoint (``tp.mode``); for
        tp=1, ``distributed`` runs the distributed code path with one rank.

        ``fast_decode``/``cuda_graphs``: the CUDA decode path's Triton kernels and their graphs
        (ignored on CPU); ``graph_batch_sizes``: the batch buckets captured (default: powers of two
        up to ``max_batch_size``); ``prefill_chunk_tokens``: prompt tokens prefilled per step.
        """
        self.device = resolve_device(device)
        config = checkpoint.read_config(checkpoint_dir)
        layout = checkpoint.CheckpointLayout(config)
        self.tp_mode, self.tp_notice = resolve_tp_mode(tp_mode, layout.tp, self.device)
        if self.tp_notice:
            log.warning("%s", self.tp_notice)
        self.config = config
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, int(config.get("max_position_embeddings") or max_seq_len))
        self.max_input_len = min(max_input_len or self.max_seq_len - 1, self.max_seq_len - 1)
        self.prefill_chunk_tokens = max(1, prefill_chunk_tokens)
        compute_dtype = getattr(torch, dtype) if dtype else getattr(torch, config["dtype"])
        ranks = layout.tp if self.tp_mode == "distributed" else 1
        _check_cache_fits(config, self.device, max_batch_size + 1, self.max_seq_len, compute_dtype, ranks)
        # One slot more than requests: padding rows of a CUDA-graph batch write there.
        engine_args = dict(max_slots=max_batch_size + 1, max_seq_len=self.max_seq_len,
                           dtype=getattr(torch, dtype) if dtype else None)
        if self.tp_mode == "distributed":
            self.executor: Executor = TpExecutor(checkpoint_dir, world_size=layout.tp, device=self.device,
                                                 **engine_args)
            self.device = self.executor.device  # rank 0's: cuda:0 on CUDA
        else:
            _, tensors = checkpoint.load_checkpoint(checkpoint_dir)
            self.executor = LocalExecutor(Qwen2Engine(config, tensors, device=self.device, **engine_args))
            del tensors
        self.engine = self.executor.engine
        try:
            self._finish_init(tokenizer_dir, fast_decode, cuda_graphs, graph_batch_sizes)
        except BaseException:
            self.executor.close()
            raise

    def _finish_init(self, tokenizer_dir: Path, fast_decode: bool, cuda_graphs: bool, graph_batch_sizes) -> None:
        from transformers import AutoTokenizer

        config = self.config
        self.tokenizer = artifacts.checked_tokenizer(tokenizer_dir, AutoTokenizer.from_pretrained)
        self.vocab_size = int(config["vocab_size"])
        self._waiting: list[_Request] = []
        self._running: dict[int, _Request] = {}  # slot -> request (prefilling or decoding)
        self._ids: set[Any] = set()
        self.decoder, self.decode_path = self._fast_decoder(fast_decode, cuda_graphs, graph_batch_sizes)

    def _fast_decoder(self, fast: bool, graphs: bool, sizes):
        """The CUDA fast path, compiled and captured now (once per process), or why eager runs."""
        from trtllm_pipeline.runtimes.torch_engine.cuda import support

        if self.device.type != "cuda" and not support.interpreting():
            return None, "eager (CPU)"
        if not fast:
            return None, "eager (runtime.fast_decode is off)"
        usable, why = support.available(self.device.type)
        if not usable:
            log.warning("the fast CUDA decode path is off: %s; decoding eagerly", why)
            return None, f"eager ({why})"
        from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import Unsupported
        from trtllm_pipeline.runtimes.torch_engine.cuda.graphs import batch_buckets

        try:
            decoder = self.executor.fast_decoder(batch_buckets(self.max_batch_size, sizes), self.max_batch_size,
                                                 graphs)
        except Unsupported as exc:
            log.warning("the fast CUDA decode path cannot run this engine: %s; decoding eagerly", exc)
            return None, f"eager ({exc})"
        kind = "CUDA graphs" if decoder.use_graphs else "direct launches"
        ranks = f", {self.executor.world_size} ranks" if self.executor.world_size > 1 else ""
        return decoder, (f"triton kernels, {kind} for batches {decoder.buckets}{ranks}, ready in "
                         f"{decoder.setup_seconds:.1f} s")

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg, manifest: dict, device: str | None = None,
                    tp_mode: str | None = None) -> "TorchRuntime":
        ckpt = (Path(engine_dir) / manifest["checkpoint"]["dir"]).resolve()
        rt = cfg.runtime
        dtype = rt.compute_dtype
        if dtype == "auto":
            dtype = None if resolve_device(device or rt.device).type == "cuda" else "float32"
        if rt.kernel_cache_dir:  # where Triton keeps compiled kernels between processes
            os.environ.setdefault("TRITON_CACHE_DIR", str(Path(rt.kernel_cache_dir).expanduser()))
        return cls(ckpt, artifacts.checkpoint_tokenizer(ckpt), device=device or rt.device,
                   max_batch_size=cfg.build.max_batch_size, max_seq_len=cfg.build.max_seq_len,
                   max_input_len=cfg.build.max_input_len, dtype=dtype, fast_decode=rt.fast_decode,
                   cuda_graphs=rt.cuda_graphs, graph_batch_sizes=rt.graph_batch_sizes,
                   prefill_chunk_tokens=rt.prefill_chunk_tokens, tp_mode=tp_mode or rt.tp_mode)

    def describe(self) -> dict[str, Any]:
        layout = checkpoint.CheckpointLayout(self.config)
        first = self.engine.layers[0]["dense"]
        ranks = self.executor.ranks()
        gemm = None
        if first.fp8:
            gemm = "torch._scaled_mm (FP8 tensor cores)" if first.scaled_mm else "emulated (FP8 values, compute-dtype matmul)"
        return {
            "weight_format": self.engine.format,
            "linear": first.describe(),
            "emulated": first.format != "none" and not first.scaled_mm,
            "runtime": self.name,
            "device": str(self.device) + (f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""),
            "dtype": str(self.engine.dtype).removeprefix("torch."),
            "quant_algo": layout.quant_algo,
            "kv_cache_quant_algo": layout.kv_cache_quant_algo,
            "fp8_gemm": gemm,
            "checkpoint_tp": layout.tp,
            "tp_mode": self.tp_mode,
            "world_size": self.executor.world_size,
            **({"tp_notice": self.tp_notice} if self.tp_notice else {}),
            "decode_path": self.decode_path,
            # What a step reads over every rank: the fast path's packed weights where it runs, else the
            # eager model's (replicated KV heads are read by each rank holding them).
            "weight_bytes": (self.decoder.weight_bytes() if self.decoder is not None
                             else sum(r["weight_bytes"] for r in ranks)),
            "kv_bytes_per_token": sum(r["kv_bytes_per_token"] for r in ranks),
            "ranks": ranks,
            "torch": torch.__version__,
        }

    @property
    def processes(self) -> list[int]:
        """The process ids running this runtime's ranks (this one first)."""
        return [r["pid"] for r in self.executor.ranks()]

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (the runtime cannot run afterwards)."""
        self.executor.close()

    def unavailable(self) -> str | None:
        failure = self.executor.failure
        return None if failure is None else f"{failure.message} ({failure.fix})"

    # ---- requests -------------------------------------------------------------------------------

    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        if self.executor.failure is not None:  # the tensor-parallel group is gone: say so, at once
            raise self.executor.failure
        params.check()
        prompt = [int(t) for t in prompt_ids]
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already active")
        if not prompt:
            raise InputError("the prompt is empty.", fix="send at least one token")
        if len(prompt) > self.max_input_len:
            raise InputError(f"the prompt has {len(prompt)} tokens; this engine takes at most {self.max_input_len}.",
                             fix="shorten the prompt or rebuild with a larger build.max_input_len")
        if bad := [t for t in prompt if not 0 <= t < self.vocab_size]:
            raise InputError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1}).")
        if params.end_id is not None and params.end_id >= self.vocab_size:
            raise InputError(f"end_id {params.end_id} is outside the vocabulary (0..{self.vocab_size - 1}, or -1).")
        end_id = self.tokenizer.eos_token_id if params.end_id is None else params.end_id
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        bad_ids = [ids for ids in (self.tokenizer.encode(w, add_special_tokens=False) for w in params.bad_words) if ids]
        self._waiting.append(_Request(request_id, prompt, params, end_id, generator=gen, bad_ids=bad_ids))
        self._ids.add(request_id)

    def cancel(self, request_id: Any) -> None:
        self._waiting = [r for r in self._waiting if r.request_id != request_id]
        for slot, req in list(self._running.items()):
            if req.request_id == request_id:
                del self._running[slot]
        self._ids.discard(request_id)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[TokenEvent]:
        """Admit, prefill and decode; a request whose part of the step fails is dropped with an
        ``error`` event and the step goes on for the others (``_isolated``)."""
        decoding = [r for r in self._running.values() if r.prefilled == len(r.prompt)]
        free = [s for s in range(self.max_batch_size) if s not in self._running]
        while self._waiting and free:
            req = self._waiting.pop(0)
            req.slot = free.pop(0)
            self._running[req.slot] = req
        events: list[TokenEvent] = []
        try:
            events += self._isolated(self._prefill, [r for r in self._running.values() if r.prefilled < len(r.prompt)])
            decoding = [r for r in decoding if self._running.get(r.slot) is r]
            return events + self._isolated(self._decode, decoding)
        except ExecutorLost as exc:  # no request can go on: each ends with the reason
            return events + self._fail_everything(exc)

    def _fail_everything(self, exc: ExecutorLost) -> list[TokenEvent]:
        reqs = list(self._running.values()) + self._waiting
        self._running.clear()
        self._waiting.clear()
        self._ids.clear()
        return [TokenEvent(r.request_id, [], "error", error=f"{exc.message} ({exc.fix})") for r in reqs]

    def _isolated(self, phase, reqs: list[_Request]) -> list[TokenEvent]:
        """``phase(reqs)``; when it raises, the same phase once per request, so that only the requests
        that fail on their own are dropped. Phases change no state until they have succeeded."""
        if not reqs:
            return []
        try:
            return phase(reqs)
        except ExecutorLost:
            raise
        except Exception as exc:
            if len(reqs) == 1:
                return [self._failed(reqs[0], exc)]
            log.warning("torch runtime: a %s step of %d requests failed (%s: %s); retrying them one by one",
                        phase.__name__.strip("_"), len(reqs), type(exc).__name__, exc)
        events: list[TokenEvent] = []
        for req in reqs:
            try:
                events += phase([req])
            except ExecutorLost:
                raise
            except Exception as exc:
                events.append(self._failed(req, exc))
        return events

    def _failed(self, req: _Request, exc: Exception) -> TokenEvent:
        log.error("torch runtime: request %r failed and was dropped: %s: %s", req.request_id, type(exc).__name__, exc,
                  exc_info=not isinstance(exc, InputError))
        self._finish(req)
        message = exc.message if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        return TokenEvent(req.request_id, [], "error", error=message)

    def _prefill(self, reqs: list[_Request]) -> list[TokenEvent]:
        """The next chunk of each prefilling request's prompt, in admission order, within the budget."""
        budget, chunks = self.prefill_chunk_tokens, []
        for req in reqs:
            if budget <= 0:
                break
            take = min(budget, len(req.prompt) - req.prefilled)
            chunks.append((req, req.prompt[req.prefilled : req.prefilled + take]))
            budget -= take
        if not chunks:
            return []
        hidden = self._forward([c for _, c in chunks], [r.slot for r, _ in chunks], [r.prefilled for r, _ in chunks])
        done = [(row, len(chunk) - 1, req) for row, (req, chunk) in enumerate(chunks)
                if req.prefilled + len(chunk) == len(req.prompt)]
        tokens = []
        if done:
            rows = torch.tensor([row for row, _, _ in done], device=self.device)
            last = torch.tensor([col for _, col, _ in done], device=self.device)
            tokens = self._sample([r for _, _, r in done], self.executor.logits(hidden[rows, last]))
        for req, chunk in chunks:  # the step succeeded: now it counts
            req.prefilled += len(chunk)
        return self._record_all([r for _, _, r in done], tokens)

    def _decode(self, reqs: list[_Request]) -> list[TokenEvent]:
        tokens, slots, positions = [r.generated[-1] for r in reqs], [r.slot for r in reqs], [r.length - 1 for r in reqs]
        if self.decoder is not None:
            if max(positions) >= self.max_seq_len:
                raise InputError(f"a sequence exceeds this engine's max_seq_len {self.max_seq_len}.")
            logits = self.decoder.decode(tokens, slots, positions)
            return self._record_all(reqs, self._sample(reqs, logits, greedy=self.decoder.greedy(len(reqs))))
        hidden = self._forward([[t] for t in tokens], slots, positions)
        return self._record_all(reqs, self._sample(reqs, self.executor.logits(hidden[:, -1])))

    def _sample(self, reqs: list[_Request], logits: torch.Tensor,
                greedy: torch.Tensor | None = None) -> list[int | Exception]:
        """One token per request, sampled as one batch; if that raises, row by row (with the seeded rows'
        generators rewound first), so that only a row that cannot be sampled gets its exception."""
        rows = [sampling.Row(r.params, r.banned(), r.generator) for r in reqs]
        seeded = {i: r.generator.get_state() for i, r in enumerate(reqs) if r.generator is not None and
                  r.params.seed is not None}
        try:
            return list(sampling.sample(logits, rows, greedy))
        except Exception as exc:
            log.warning("torch runtime: sampling %d rows failed (%s: %s); sampling them one by one",
                        len(rows), type(exc).__name__, exc)
        out: list[int | Exception] = []
        for i, row in enumerate(rows):
            if i in seeded:
                row.generator.set_state(seeded[i])
            try:
                out.append(sampling.sample(logits[i : i + 1], [row])[0])
            except Exception as exc:
                out.append(exc)
        return out

    def _record_all(self, reqs: list[_Request], tokens: list[int | Exception]) -> list[TokenEvent]:
        return [self._failed(req, token) if isinstance(token, Exception) else self._record(req, token)
                for req, token in zip(reqs, tokens)]

    def _record(self, req: _Request, token: int) -> TokenEvent:
        p = req.params
        if token == req.end_id and len(req.generated) >= p.min_tokens:
            self._finish(req)
            return TokenEvent(req.request_id, [], "end_id")
        req.generated.append(token)
        if len(req.generated) >= p.max_tokens or req.length >= self.max_seq_len:
            self._finish(req)
            return TokenEvent(req.request_id, [token], "length")
        return TokenEvent(req.request_id, [token])

    def _finish(self, req: _Request) -> None:
        self._running.pop(req.slot, None)
        self._ids.discard(req.request_id)

    def _forward(self, inputs: list[list[int]], slots: list[int], starts: list[int]) -> torch.Tensor:
        """Right-pad rows to one length and run them; padding lands after each row's real tokens."""
        width = max(len(x) for x in inputs)
        tokens = torch.zeros((len(inputs), width), dtype=torch.long)
        for i, x in enumerate(inputs):
            tokens[i, : len(x)] = torch.tensor(x)
        end = max(s + width for s in starts)
        if end > self.max_seq_len:
            raise InputError(f"a sequence of {end} tokens exceeds this engine's max_seq_len {self.max_seq_len}.")
        key_len = min(self.max_seq_len, -(-end // KEY_BLOCK) * KEY_BLOCK)
        return self.executor.forward(tokens, slots, starts, key_len)

    # ---- scoring --------------------------------------------------------------------------------

    def next_token_logprobs(self, context: Sequence[int]) -> list[float]:
        if self.has_work():
            raise RuntimeError("next_token_logprobs() cannot run while generation requests are active")
        hidden = self._forward([list(context)], [0], [0])
        return torch.log_softmax(self.executor.logits(hidden[0, -1]), dim=-1).tolist()

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[tuple[float, bool]]:
        """Log-likelihoods of continuations, computing a shared context prefix once.

        Requests whose inputs (context + continuation minus its last token) are identical, like
        the four answer letters of one MMLU question, share a single forward pass.
        """
        if self.has_work():
            raise RuntimeError("score() cannot run while generation requests are active")
        if not contexts:
            return []
        seqs = [list(c) + list(x) for c, x in zip(contexts, continuations)]
        if any(not c for c in contexts) or any(not x for x in continuations):
            raise InputError("score() needs a non-empty context and continuation for every request.")
        if (longest := max(len(s) for s in seqs)) > self.max_seq_len:
            raise InputError(f"a scored sequence has {longest} tokens; max_seq_len is {self.max_seq_len}.",
                             fix="truncate the context from the left before scoring")
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(seqs):
            groups.setdefault(tuple(s[:-1]), []).append(i)
        keys = list(groups)
        prefix = min(_common_prefix(keys), min(len(c) for c in contexts) - 1)
        if prefix > 0:
            self._forward([list(keys[0][:prefix])], [0], [0])
        results: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
        for start in range(0, len(keys), self.max_batch_size):
            chunk = keys[start : start + self.max_batch_size]
            slots = list(range(len(chunk)))
            if prefix > 0 and len(chunk) > 1:
                self.executor.copy_prefix(0, slots[1:], prefix)
            hidden = self._forward([list(k[prefix:]) for k in chunk], slots, [prefix] * len(chunk))
            for row, key in enumerate(chunk):
                members = groups[key]
                first = min(len(contexts[i]) for i in members) - 1  # first position whose logits we need
                logprobs = torch.log_softmax(self.executor.logits(hidden[row, first - prefix :]), dim=-1)
                for i in members:
                    offset = len(contexts[i]) - 1 - first
                    target = torch.tensor(continuations[i], device=self.device)
                    rows = logprobs[offset : offset + len(target)]
                    results[i] = (float(rows.gather(-1, target[:, None]).sum()),
                                  bool(torch.equal(rows.argmax(-1), target)))
        return results


def _common_prefix(seqs: list[tuple[int, ...]]) -> int:
    first, n = seqs[0], len(seqs[0])
    for s in seqs[1:]:
        n = min(n, len(s))
        for j in range(n):
            if s[j] != first[j]:
                n = j
                break
    return n
