"""Stage ``bench``: a load generator over streamed requests, and the latency/throughput it measured.

Per load level (closed loop: ``concurrency`` requests always in flight; open loop: Poisson
arrivals at ``request_rate`` per second, whatever the server's speed) it sends ``requests``
requests after ``warmup`` unrecorded ones, times every streamed response (``bench_protocols``)
and summarises them (``bench_metrics``: TTFT, ITL, TPOT, end-to-end latency, throughput, errors).

Honest numbers need equal work per request: synthetic prompts are exactly ``input_tokens`` long
under the model's tokenizer (as the server counts them, special tokens included), the output is
forced to ``output_tokens`` (min = max tokens) and checked against what came back; a request that
returns another length is an error, counted, not averaged in. Results are never cached: every
run measures again.

Results file (JSON, ``schema`` 1): ``settings``; ``summary``, one entry per load level with
``concurrency`` or ``request_rate``, ``requests``, ``errors``, ``output_tokens_mean``,
``ttft_ms``/``itl_ms``/``tpot_ms``/``e2e_ms`` (each ``mean``, ``p50``, ``p90``, ``p99``),
``output_tokens_per_s``, ``requests_per_s`` and ``cost``; ``requests``, one record per request.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from trtllm_pipeline import artifacts, cost
from trtllm_pipeline.bench_metrics import RequestResult, summarize_level
from trtllm_pipeline.bench_protocols import Endpoint, RequestFailed, connect
from trtllm_pipeline.errors import InputError, StageFailed

log = logging.getLogger(__name__)

RESULTS_SCHEMA = 1
DATASETS = ("synthetic", "gsm8k")
MAX_OPEN_LOOP_CLIENTS = 256  # connections kept ready for open-loop arrivals


@dataclasses.dataclass(frozen=True)
class LoadLevel:
    concurrency: int | None = None
    request_rate: float | None = None

    @property
    def key(self) -> dict[str, Any]:
        if self.concurrency is not None:
            return {"concurrency": self.concurrency}
        return {"request_rate": self.request_rate}

    def __str__(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"{self.request_rate} requests/s"


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    protocol: str
    url: str
    levels: tuple[LoadLevel, ...]
    model: str | None = None
    input_tokens: int = 128
    output_tokens: int = 256
    requests: int = 32
    warmup: int = 2
    dataset: str = "synthetic"
    data_dir: Path | None = None
    seed: int = 1234
    timeout_s: float = 600.0

    def check(self) -> None:
        if not self.levels:
            raise InputError("no load level given.", fix="pass --concurrency 1,4,16 and/or --request-rate 2,4")
        if any(lv.concurrency is not None and lv.concurrency < 1 for lv in self.levels):
            raise InputError("--concurrency values must be at least 1.")
        if any(lv.request_rate is not None and lv.request_rate <= 0 for lv in self.levels):
            raise InputError("--request-rate values must be positive (requests per second).")
        if self.input_tokens < 2 or self.output_tokens < 1 or self.requests < 1 or self.warmup < 0:
            raise InputError("--input-tokens must be >= 2, --output-tokens >= 1, --requests >= 1, --warmup >= 0.")
        if self.dataset not in DATASETS:
            raise InputError(f"unknown dataset {self.dataset!r}.", fix=f"use one of {', '.join(DATASETS)}")


@dataclasses.dataclass
class BenchResult:
    path: Path
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Job:
    index: int
    prompt: str
    input_tokens: int


def bench(settings: BenchSettings, *, tokenizer, tokenizer_source: str, output: Path,
          config_name: str | None = None, engines_dir: Path | None = None, gpus: int = 1,
          gpu_hour_usd: float = cost.DEFAULT_GPU_HOUR_USD, progress: Callable[[str], None] = log.info) -> BenchResult:
    """Run every load level against the server and write the results file to ``output``.

    When ``output`` is in the config's ``bench/`` artifact directory, that directory's manifest is
    rewritten to name it as the latest results (the report reads it from there).
    """
    settings.check()
    cost.estimate(1.0, gpus=gpus, gpu_hour_usd=gpu_hour_usd)  # reject a bad price before measuring anything
    endpoint = connect(settings.protocol, settings.url, settings.model, settings.timeout_s)
    prompts, data_source = _prompts(settings, tokenizer)
    jobs = [Job(i, p, len(tokenizer(p)["input_ids"])) for i, p in enumerate(prompts)]
    warmup, measured = jobs[: settings.warmup], jobs[settings.warmup:]
    started = artifacts.now_iso()
    summary, records = [], []
    for level in settings.levels:
        progress(f"bench: {level}, {settings.warmup} warmup + {settings.requests} requests of "
                 f"{settings.input_tokens if settings.dataset == 'synthetic' else settings.dataset} -> "
                 f"{settings.output_tokens} tokens ({endpoint.protocol} {endpoint.url}, model {endpoint.model})")
        run_level(endpoint, warmup, level, settings.output_tokens, tokenizer, seed=settings.seed)
        results = run_level(endpoint, measured, level, settings.output_tokens, tokenizer, seed=settings.seed)
        entry = summarize_level(level.key, results)
        entry["input_tokens_mean"] = round(sum(j.input_tokens for j in measured) / len(measured), 3)
        estimate = cost.estimate(entry["output_tokens_per_s"], gpus=gpus, gpu_hour_usd=gpu_hour_usd)
        entry["cost"] = estimate.to_dict() if estimate else None
        summary.append(entry)
        records += [r.to_record() for r in results]
        progress("bench: " + describe_level(entry))
        for error in sorted({r.error for r in results if r.error})[:3]:
            log.warning("bench: %s: %s", level, error)
    data = {
        "schema": RESULTS_SCHEMA,
        "settings": {
            "protocol": endpoint.protocol, "url": endpoint.url, "model": endpoint.model, "config": config_name,
            "concurrency": [lv.concurrency for lv in settings.levels if lv.concurrency is not None],
            "request_rate": [lv.request_rate for lv in settings.levels if lv.request_rate is not None],
            "input_tokens": settings.input_tokens if settings.dataset == "synthetic" else None,
            "output_tokens": settings.output_tokens, "requests": settings.requests, "warmup": settings.warmup,
            "dataset": settings.dataset, "data_source": data_source, "tokenizer": tokenizer_source,
            "seed": settings.seed, "gpus": gpus, "gpu_hour_usd": gpu_hour_usd,
            "started_at": started, "finished_at": artifacts.now_iso(),
            "versions": artifacts.package_versions("tritonclient"),
        },
        "summary": summary,
        "requests": records,
    }
    artifacts.write_json_atomic(output, data)
    if config_name and engines_dir is not None:
        bench_dir = artifacts.artifact_paths(engines_dir, config_name).bench
        if output.parent.resolve() == bench_dir.resolve():
            artifacts.write_manifest(bench_dir, {"stage": "bench", "config": {"name": config_name},
                                                 "latest": output.name, "settings": data["settings"]})
    if all(entry["requests"] == 0 for entry in summary):
        first = next((r["error"] for r in records if r["error"]), "no detail")
        raise StageFailed(f"bench: every request failed (first error: {first}); results in {output}.",
                          fix="check the server's log; `trtllm-pipeline generate --url ...` shows one request")
    return BenchResult(output, data)


def level_label(entry: dict[str, Any]) -> str:
    """``c=4`` for a closed-loop level, ``2.0/s`` for an open-loop one."""
    return f"c={entry['concurrency']}" if "concurrency" in entry else f"{entry['request_rate']}/s"


def describe_level(entry: dict[str, Any]) -> str:
    """One line per load level for the terminal."""
    def fmt(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:.1f}{unit}"

    return (f"{level_label(entry)}: {entry['requests']} ok, {entry['errors']} errors; "
            f"TTFT p50 {fmt(entry['ttft_ms']['p50'], ' ms')}, ITL p50 {fmt(entry['itl_ms']['p50'], ' ms')}, "
            f"e2e p50 {fmt(entry['e2e_ms']['p50'], ' ms')}; "
            f"{fmt(entry['output_tokens_per_s'])} tokens/s, {fmt(entry['requests_per_s'])} requests/s")


def default_output(engines_dir: Path, config_name: str, settings: BenchSettings) -> Path:
    """``engines/<config>/bench/<protocol>-<input>-out<output>.json``."""
    source = f"in{settings.input_tokens}" if settings.dataset == "synthetic" else settings.dataset
    name = f"{settings.protocol}-{source}-out{settings.output_tokens}.json"
    return artifacts.artifact_paths(engines_dir, config_name).bench / name


def load_tokenizer(source: str | Path):
    """A transformers tokenizer from a directory or hub id; a failure is the user's to fix."""
    from transformers import AutoTokenizer

    from trtllm_pipeline.console import quiet

    try:
        with quiet():
            return AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
        raise InputError(f"cannot load a tokenizer from {source} ({type(exc).__name__}: {str(exc).splitlines()[0]}).",
                         fix="pass -c CONFIG of a quantized build, or --tokenizer with an HF model directory") from None


def config_tokenizer_dir(cfg, engines_dir: Path) -> Path:
    """The tokenizer the build was exported with (checkpoint/tokenizer), else the model's own."""
    exported = artifacts.artifact_paths(engines_dir, cfg.name).checkpoint / "tokenizer"
    if (exported / "tokenizer_config.json").is_file():
        return exported
    from trtllm_pipeline.model_source import resolve_model

    return resolve_model(cfg.model).model_dir


# --------------------------------------------------------------------------- load generation


def run_level(endpoint: Endpoint, jobs: Sequence[Job], level: LoadLevel, output_tokens: int, tokenizer,
              *, seed: int = 0) -> list[RequestResult]:
    """Send ``jobs`` at one load level; one RequestResult per job, in job order."""
    if not jobs:
        return []
    def execute(client, job: Job) -> RequestResult:
        return execute_request(client, job, level.key, output_tokens, tokenizer)

    width = level.concurrency if level.concurrency is not None else MAX_OPEN_LOOP_CLIENTS
    clients = [endpoint.client() for _ in range(min(width, len(jobs)))]  # connected before the clock starts
    try:
        if level.concurrency is not None:
            return _closed_loop(clients, jobs, execute)
        return _open_loop(clients, jobs, execute, level.request_rate, random.Random(seed))
    finally:
        for client in clients:
            client.close()


def _closed_loop(clients, jobs, execute) -> list[RequestResult]:
    """Each client sends its next request as soon as its previous one has finished."""
    results: list[RequestResult | None] = [None] * len(jobs)
    pending = iter(range(len(jobs)))
    lock = threading.Lock()

    def worker(client) -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            results[i] = execute(client, jobs[i])

    _run_threads([threading.Thread(target=worker, args=(c,), daemon=True) for c in clients])
    return results  # type: ignore[return-value]


def _open_loop(clients, jobs, execute, rate: float, rng: random.Random) -> list[RequestResult]:
    """Requests leave at Poisson arrival times (exponential gaps of mean 1/rate), busy server or not."""
    results: list[RequestResult | None] = [None] * len(jobs)
    idle: queue.Queue = queue.Queue()
    for client in clients:
        idle.put(client)
    late = 0

    def send(client, i: int) -> None:
        try:
            results[i] = execute(client, jobs[i])
        finally:
            idle.put(client)

    threads, clock, due = [], time.perf_counter(), 0.0
    for i in range(len(jobs)):
        due += rng.expovariate(rate)
        time.sleep(max(0.0, clock + due - time.perf_counter()))
        client = idle.get()  # waits only when every client is busy
        late += time.perf_counter() - (clock + due) > 0.05
        thread = threading.Thread(target=send, args=(client, i), daemon=True)
        thread.start()
        threads.append(thread)
    _run_threads(threads, started=True)
    if late:
        log.warning("bench: %d of %d open-loop requests left more than 50 ms after their arrival time "
                    "(the load generator could not keep up)", late, len(jobs))
    return results  # type: ignore[return-value]


def _run_threads(threads: list[threading.Thread], started: bool = False) -> None:
    if not started:
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join()


def execute_request(client, job: Job, level: dict[str, Any], output_tokens: int, tokenizer) -> RequestResult:
    """One timed request; a failure or a wrong output length becomes the record's ``error``."""
    start = time.perf_counter()
    try:
        streamed = client.generate(job.prompt, output_tokens)
    except Exception as exc:  # any failure of one request is data: recorded, counted, not fatal
        error = str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"
        return RequestResult(level, job.index, start, time.perf_counter(), input_tokens=job.input_tokens, error=error)
    result = RequestResult(
        level, job.index, start, streamed.token_times[-1] if streamed.token_times else time.perf_counter(),
        token_times=streamed.token_times, output_tokens=streamed.output_tokens, input_tokens=job.input_tokens,
        output_tokens_retokenized=len(tokenizer.encode(streamed.text, add_special_tokens=False)),
    )
    if result.output_tokens != output_tokens:
        result.error = (f"returned {result.output_tokens} tokens, {output_tokens} were requested "
                        "(min_tokens = max_tokens); the server does not honour the forced length")
    return result


# --------------------------------------------------------------------------- prompts


def _prompts(settings: BenchSettings, tokenizer) -> tuple[list[str], str]:
    count = settings.warmup + settings.requests
    if settings.dataset == "synthetic":
        return synthetic_prompts(tokenizer, count, settings.input_tokens, settings.seed), "synthetic"
    return dataset_prompts(settings.dataset, settings.data_dir, count)


def synthetic_prompts(tokenizer, count: int, input_tokens: int, seed: int) -> list[str]:
    """``count`` distinct prompts of exactly ``input_tokens`` tokens (special tokens included).

    Built from the vocabulary's own space-prefixed words: the tokenizer splits text at spaces
    before merging, so each word adds a known number of tokens and the length can be hit exactly.
    Distinct prompts keep a server's prefix cache from flattering the numbers.
    """
    words = _vocabulary_words(tokenizer)
    overhead = len(tokenizer("")["input_ids"])  # BOS etc., added by the server's tokenizer as well
    if input_tokens <= overhead:
        raise InputError(f"--input-tokens {input_tokens} leaves no room for text after the tokenizer's "
                         f"{overhead} special token(s).", fix=f"use at least {overhead + 1}")
    return [_exact_prompt(tokenizer, words, input_tokens, random.Random(f"{seed}:{i}")) for i in range(count)]


def _vocabulary_words(tokenizer) -> list[str]:
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marks = [t for t in tokens if t and re.fullmatch(r"[Ġ▁][a-z]{3,12}", t)]  # byte-level BPE / sentencepiece
    words = sorted({tokenizer.convert_tokens_to_string([t]) for t in marks})
    if len(words) < 50:
        raise InputError("the tokenizer has too few plain word tokens to build synthetic prompts.",
                         fix="benchmark with --dataset gsm8k instead")
    return words


def _exact_prompt(tokenizer, words: list[str], target: int, rng: random.Random) -> str:
    pieces = [rng.choice(words) for _ in range(target)]
    for _ in range(4 * target + 100):
        n = len(tokenizer("".join(pieces).lstrip())["input_ids"])
        if n == target:
            return "".join(pieces).lstrip()
        if n > target and len(pieces) == 1:  # the first word, without its space, may take several tokens
            pieces = [rng.choice(words)]
        elif n > target:
            pieces = pieces[: max(1, len(pieces) - (n - target))]
        else:
            pieces += [rng.choice(words) for _ in range(target - n)]
    raise StageFailed(f"could not build a prompt of exactly {target} tokens with this tokenizer.",
                      fix="use another --input-tokens, or --dataset gsm8k")


def dataset_prompts(name: str, data_dir: Path | None, count: int) -> tuple[list[str], str]:
    """The first ``count`` questions of the dataset's test split (cycled if it is shorter)."""
    from trtllm_pipeline.tasks import get_task

    data = get_task(name).load(data_dir)
    questions = [item.doc["question"] for item in data.items]
    if not questions:
        raise InputError(f"{name}: no questions found in {data.source}.")
    return [questions[i % len(questions)] for i in range(count)], data.source
