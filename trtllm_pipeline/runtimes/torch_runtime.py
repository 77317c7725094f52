"""The torch runtime: runs the exported TensorRT-LLM checkpoint in PyTorch, on CPU or CUDA.

The "engine" of this runtime is the validated checkpoint itself (``engines/<config>/checkpoint``)
plus the build manifest that names it. TP shards are reassembled at load time (each rank's slice
of the same weights, checked for consistency) and run on one device; the math is the engine's
(see ``torch_model``). Scheduling is continuous batching over ``max_batch_size`` cache slots:
each ``step`` prefills newly admitted requests and decodes one token for the running ones.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from trtllm_pipeline import artifacts, checkpoint
from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.runtimes.base import Runtime, SamplingParams, TokenEvent
from trtllm_pipeline.runtimes.torch_model import Qwen2Engine

log = logging.getLogger(__name__)

KEY_BLOCK = 256  # attention spans cache positions rounded up to this, to keep shapes few


@dataclasses.dataclass
class _Request:
    request_id: Any
    prompt: list[int]
    params: SamplingParams
    end_id: int
    slot: int = -1
    generated: list[int] = dataclasses.field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def length(self) -> int:  # tokens in the cache once the last generated token is fed back
        return len(self.prompt) + len(self.generated)


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
                 dtype: str | None = None):
        """``dtype`` overrides the checkpoint's compute dtype (FP8 weights stay FP8 values)."""
        from transformers import AutoTokenizer

        self.device = resolve_device(device)
        config, tensors = checkpoint.load_checkpoint(checkpoint_dir)
        self.config = config
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, int(config.get("max_position_embeddings") or max_seq_len))
        self.max_input_len = min(max_input_len or self.max_seq_len - 1, self.max_seq_len - 1)
        self.engine = Qwen2Engine(config, tensors, device=self.device, max_slots=max_batch_size,
                                  max_seq_len=self.max_seq_len, dtype=getattr(torch, dtype) if dtype else None)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.vocab_size = int(config["vocab_size"])
        self._waiting: list[_Request] = []
        self._running: dict[int, _Request] = {}  # slot -> request
        self._ids: set[Any] = set()

    @classmethod
    def from_engine(cls, engine_dir: Path, cfg, manifest: dict, device: str | None = None) -> "TorchRuntime":
        ckpt = (Path(engine_dir) / manifest["checkpoint"]["dir"]).resolve()
        dtype = cfg.runtime.compute_dtype
        if dtype == "auto":
            dtype = None if resolve_device(device or cfg.runtime.device).type == "cuda" else "float32"
        return cls(ckpt, artifacts.checkpoint_tokenizer(ckpt), device=device or cfg.runtime.device,
                   max_batch_size=cfg.build.max_batch_size, max_seq_len=cfg.build.max_seq_len,
                   max_input_len=cfg.build.max_input_len, dtype=dtype)

    def describe(self) -> dict[str, Any]:
        layout = checkpoint.CheckpointLayout(self.config)
        fp8 = layout.quant_algo == "FP8"
        gemm = None
        if fp8:
            first = self.engine.layers[0]["dense"]
            gemm = "torch._scaled_mm (FP8 tensor cores)" if first.scaled_mm else "emulated (FP8 values, compute-dtype matmul)"
        return {
            "runtime": self.name,
            "device": str(self.device) + (f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""),
            "dtype": str(self.engine.dtype).removeprefix("torch."),
            "quant_algo": layout.quant_algo,
            "kv_cache_quant_algo": layout.kv_cache_quant_algo,
            "fp8_gemm": gemm,
            "checkpoint_tp": layout.tp,
            "torch": torch.__version__,
        }

    # ---- requests -------------------------------------------------------------------------------

    def submit(self, request_id: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        prompt = [int(t) for t in prompt_ids]
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already active")
        if not prompt:
            raise InputError("the prompt is empty.", fix="send at least one token")
        if len(prompt) > self.max_input_len:
            raise InputError(f"the prompt has {len(prompt)} tokens; this engine takes at most {self.max_input_len}.",
                             fix="shorten the prompt or rebuild with a larger build.max_input_len")
        if params.max_tokens < 1:
            raise InputError(f"max_tokens must be at least 1, got {params.max_tokens}.")
        if bad := [t for t in prompt if not 0 <= t < self.vocab_size]:
            raise InputError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1}).")
        end_id = self.tokenizer.eos_token_id if params.end_id is None else params.end_id
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        self._waiting.append(_Request(request_id, prompt, params, end_id, generator=gen))
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
        events: list[TokenEvent] = []
        decoding = list(self._running.values())
        free = [s for s in range(self.max_batch_size) if s not in self._running]
        admitted = []
        while self._waiting and free:
            req = self._waiting.pop(0)
            req.slot = free.pop(0)
            self._running[req.slot] = req
            admitted.append(req)
        if admitted:
            events += self._advance(admitted, prefill=True)
        if decoding:
            events += self._advance(decoding, prefill=False)
        return events

    def _advance(self, reqs: list[_Request], *, prefill: bool) -> list[TokenEvent]:
        if prefill:
            inputs = [r.prompt for r in reqs]
            starts = [0] * len(reqs)
        else:
            inputs = [[r.generated[-1]] for r in reqs]
            starts = [r.length - 1 for r in reqs]
        hidden = self._forward(inputs, [r.slot for r in reqs], starts)
        last = torch.tensor([len(x) - 1 for x in inputs], device=self.device)
        logits = self.engine.logits(hidden[torch.arange(len(reqs), device=self.device), last])
        events = []
        for req, row in zip(reqs, logits):
            token = self._sample(req, row)
            events.append(self._record(req, token))
        return events

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

    def _sample(self, req: _Request, logits: torch.Tensor) -> int:
        p = req.params
        if len(req.generated) < p.min_tokens and 0 <= req.end_id < logits.shape[-1]:
            logits = logits.clone()
            logits[req.end_id] = float("-inf")
        if p.bad_words:
            logits = self._ban(req, logits)
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.shape[-1])).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > p.top_p
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _ban(self, req: _Request, logits: torch.Tensor) -> torch.Tensor:
        """Ban the last token of each bad word whose other tokens were just generated."""
        logits = logits.clone()
        for word in req.params.bad_words:
            ids = self.tokenizer.encode(word, add_special_tokens=False)
            if ids and (len(ids) == 1 or req.generated[-(len(ids) - 1):] == ids[:-1]):
                logits[ids[-1]] = float("-inf")
        return logits

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
        return self.engine(tokens.to(self.device), torch.tensor(slots, device=self.device),
                           torch.tensor(starts, device=self.device), key_len)

    # ---- scoring --------------------------------------------------------------------------------

    def next_token_logprobs(self, context: Sequence[int]) -> list[float]:
        if self.has_work():
            raise RuntimeError("next_token_logprobs() cannot run while generation requests are active")
        hidden = self._forward([list(context)], [0], [0])
        return torch.log_softmax(self.engine.logits(hidden[0, -1]), dim=-1).tolist()

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
                self.engine.copy_prefix(0, torch.tensor(slots[1:], device=self.device), prefix)
            hidden = self._forward([list(k[prefix:]) for k in chunk], slots, [prefix] * len(chunk))
            for row, key in enumerate(chunk):
                members = groups[key]
                first = min(len(contexts[i]) for i in members) - 1  # first position whose logits we need
                logprobs = torch.log_softmax(self.engine.logits(hidden[row, first - prefix :]), dim=-1)
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
