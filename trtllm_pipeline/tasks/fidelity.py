"""Fidelity: how closely a build's next-token distributions follow a reference build's, over a fixed text.

What llama.cpp's ``perplexity --kl-divergence`` reports, named as it names them: for every scored
token, the KL divergence of the candidate's next-token distribution from the reference's
(``KL(P_ref || P_cand)``, natural log, over the whole vocabulary), whether the two put the same
token on top ("same top p", here **top-1 agreement**), and each model's negative log-likelihood of
the text's real next token, hence ``PPL(Q)``, ``PPL(base)`` and their ratio. On a small model
these separate formats where MMLU cannot: a few hundred questions move by chance, four thousand
tokens of full distributions do not.

The text set is fixed and comes from the evaluation data the user already passes (``--data-dir``
or the hub), never from a file of this repository's machine: MMLU test questions with their
correct answer and GSM8K test problems with their worked solution, in an order fixed by a hash of
each document's id, joined by blank lines and tokenized as one text (a data dir with ``fidelity/documents.jsonl``,
the subset ``tools/accuracy_subset.py`` writes, holds just the test rows of that text, ids and all). As llama.cpp
does, the token stream is cut into ``CHUNKS`` chunks of ``CHUNK_TOKENS`` tokens (the first token of each is the
tokenizer's BOS where it adds one) and only the second half of each chunk is scored, so every
scored token sees at least half a chunk of context: 16 x 255 = 4080 tokens.

Items are tokens (``<chunk>/<position>``): ``correct`` is top-1 agreement, so the results file's
``score`` is the agreement rate and the per-token KLD and NLLs sit in the items, from which the
gate and the report compute every statistic (``summarize``). The reference runs in the same
process (``eval`` opens it from ``evaluation.fidelity_reference`` or ``--reference``); a build
evaluated without one is its own reference (KLD 0, agreement 1) and its results give its PPL.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from trtllm_pipeline.errors import InputError, UnavailableError
from trtllm_pipeline.tasks import data
from trtllm_pipeline.tasks.base import Item, Task, TaskData
from trtllm_pipeline.tasks.model import LanguageModel
from trtllm_pipeline.tasks.subset import item_rank

CHUNK_TOKENS = 512  # llama.cpp's default context for perplexity and KL divergence
CHUNKS = 16  # 16 x 255 scored tokens
DOCUMENTS = 1000  # documents kept in the fixed order: far more text than CHUNKS chunks need
ORDER_SEED = "fidelity"  # the text's order never changes with evaluation.seed


def settings(evaluation, limit: int | None) -> dict[str, Any]:
    return {
        "format": "MMLU test question + correct answer, GSM8K test problem + solution; hash order; blank lines",
        "scoring": "KL(P_ref || P_cand) per token over the whole vocabulary, top-1 agreement, NLL of the next token",
        "chunk_tokens": CHUNK_TOKENS,
        "scored_from": CHUNK_TOKENS // 2,
        "chunks": CHUNKS,
        "limit": limit,  # chunks (a stratified subset of the CHUNKS)
        "seed": evaluation.seed,
    }


def load(data_dir) -> TaskData:
    """The chunk slots as items, and the ordered documents (``fewshot["documents"]``) they are cut from."""
    own = data.fidelity_rows(data_dir)  # a subset's own copy of the documents (tools/accuracy_subset.py)
    if own is None:
        mmlu_test, _, mmlu_source = data.mmlu_rows(data_dir)
        gsm8k_test, _, gsm8k_source = data.gsm8k_rows(data_dir)
        own = (mmlu_test, gsm8k_test, f"{mmlu_source} + {gsm8k_source}")
    mmlu_test, gsm8k_test, source = own
    items = [Item(id=f"chunk{i}", stratum="text", doc={"chunk": i}) for i in range(CHUNKS)]
    pool = [{"id": f"{task}/{item_id}", "text": document(task, row)}
            for task, item_id, row in ordered_rows(mmlu_test, gsm8k_test, source)]
    return TaskData(items=items, fewshot={"documents": pool}, source=source)


def ordered_rows(mmlu_test: list[dict], gsm8k_test: list[dict], source: str) -> list[tuple[str, str, dict]]:
    """(task, item id, row) of the ``DOCUMENTS`` test rows the text is made of, in its fixed order: a hash of each
    document's id ("mmlu/<subject>/<n>", "gsm8k/test/<n>"), whatever the rows' order or which others are there."""
    rows = [("mmlu", item_id, row) for item_id, row in
            zip(data.item_ids(mmlu_test, source, lambda row: row["subject"]), mmlu_test)]
    rows += [("gsm8k", item_id, row) for item_id, row in
             zip(data.item_ids(gsm8k_test, source, lambda row: "test"), gsm8k_test)]
    return sorted(rows, key=lambda r: item_rank(ORDER_SEED, f"{r[0]}/{r[1]}"))[:DOCUMENTS]


def document(task: str, row: dict) -> str:
    """A test row as text: the MMLU question and its correct answer, the GSM8K problem and its worked solution."""
    if task == "mmlu":
        answer = row["choices"][data.LETTERS.index(row["answer"])]
        return f"{row['question'].strip()}\nAnswer: {answer.strip()}"
    return f"{row['question'].strip()}\n{row['answer'].strip()}"


# --------------------------------------------------------------------------- the text


def token_stream(tokenizer, documents: Sequence[dict], needed: int) -> list[int]:
    """The first ``needed`` tokens of the documents joined by blank lines, tokenized as one text
    (without special tokens; BOS is each chunk's to add)."""
    count = 64
    while True:
        text = "\n\n".join(doc["text"] for doc in documents[:count])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # longer than the model takes
        if len(ids) >= needed + 1 or count >= len(documents):  # +1: the cut may split the last token
            break
        count *= 2
    if len(ids) < needed:
        raise InputError(f"the fidelity text set has {len(ids)} tokens; {needed} are needed.",
                         fix="pass the whole MMLU and GSM8K test splits (--data-dir)")
    return list(ids[:needed])


def chunks(tokenizer, documents: Sequence[dict]) -> list[list[int]]:
    """``CHUNKS`` token chunks of ``CHUNK_TOKENS``, each starting with BOS where the tokenizer adds one."""
    prefix = list(tokenizer("", add_special_tokens=True)["input_ids"])[:1]
    body = CHUNK_TOKENS - len(prefix)
    stream = token_stream(tokenizer, documents, CHUNKS * body)
    return [prefix + stream[i * body : (i + 1) * body] for i in range(CHUNKS)]


# --------------------------------------------------------------------------- scoring


def run(model: LanguageModel, items: Sequence[Item], task_data: TaskData, settings: dict, *, batch_size: int,
        input_limit: int, progress, reference: LanguageModel | None = None,
        reference_key: str | None = None) -> list[dict]:
    """One record per scored token of each selected chunk: the candidate (``model``) against the
    ``reference`` (None: the model itself) on the same tokens.

    ``reference_key`` identifies the reference build (its engine and runtime; the model itself when it is its own):
    the reference's log-probabilities are kept under it for the rest of the process (``_REFERENCE_MEMO``)."""
    import torch

    for who in (model, reference):
        if who is not None and not callable(getattr(who, "sequence_logprobs", None)):
            raise InputError("fidelity needs every position's log-probabilities, which a served model does not "
                             "return.", fix="evaluate fidelity in-process (without --url)")
    if input_limit < CHUNK_TOKENS:
        raise InputError(f"fidelity scores {CHUNK_TOKENS}-token chunks; this engine takes at most {input_limit} "
                         "input tokens.", fix=f"build with build.max_input_len >= {CHUNK_TOKENS}")
    text = chunks(model.tokenizer, task_data.fewshot["documents"])
    first = settings["scored_from"]
    records: list[dict] = []
    for item in items:
        tokens = text[item.doc["chunk"]]
        if reference is None:
            cand = ref = _reference_logprobs(model, tokens[:-1], first, reference_key)
        else:
            cand = _logprobs(model, tokens[:-1], first)
            ref = _reference_logprobs(reference, tokens[:-1], first, reference_key).to(cand.device)
        targets = torch.tensor(tokens[first + 1 :], device=cand.device)
        if ref.shape != cand.shape:
            raise InputError(f"the reference's vocabulary ({ref.shape[-1]} tokens) is not the candidate's "
                             f"({cand.shape[-1]}); fidelity compares builds of one model.")
        kld = (ref.exp() * (ref - cand)).sum(-1).clamp_min(0)  # rounding can give -1e-9 for equal rows
        nll = -cand.gather(-1, targets[:, None])[:, 0]
        nll_ref = -ref.gather(-1, targets[:, None])[:, 0]
        kld, nll, nll_ref, top, top_ref = (t.tolist() for t in (kld, nll, nll_ref, cand.argmax(-1), ref.argmax(-1)))
        targets = targets.tolist()
        for j in range(len(targets)):
            records.append({"id": f"{item.id}/{first + j}", "correct": top[j] == top_ref[j], "prediction": top[j],
                            "target": top_ref[j], "token": targets[j], "kld": round(kld[j], 7),
                            "nll": round(nll[j], 6), "nll_reference": round(nll_ref[j], 6)})
        progress.update(1)
    return records


# One reference's log-probabilities per chunk (16 x 255 x vocabulary floats: 0.8 GB for a 49k vocabulary), kept
# for the process: `make accuracy-table` and the demo score every candidate against one baseline in one process,
# and would otherwise compute the baseline again for each (half of every candidate's fidelity time). Keyed by the
# reference's engine and runtime identity (eval's `reference` record), so a rebuilt reference is never reused.
_REFERENCE_MEMO: dict[str, Any] = {"key": None, "chunks": {}}


def _reference_logprobs(model, tokens: list[int], first: int, key: str | None):
    if key is None:
        return _logprobs(model, tokens, first)
    if _REFERENCE_MEMO["key"] != key:
        _REFERENCE_MEMO.update(key=key, chunks={})
    chunk = (tuple(tokens), first)
    if chunk not in _REFERENCE_MEMO["chunks"]:
        _REFERENCE_MEMO["chunks"][chunk] = _logprobs(model, tokens, first)
    return _REFERENCE_MEMO["chunks"][chunk]


def _logprobs(model, tokens: list[int], first: int):
    try:
        return model.sequence_logprobs(tokens, first)
    except NotImplementedError as exc:
        raise UnavailableError(f"fidelity: {exc}.", fix="evaluate fidelity with the torch runtime "
                               "(build --runtime torch)") from None


# --------------------------------------------------------------------------- statistics


def _percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between order statistics, as llama.cpp's percentile (``values`` sorted)."""
    p = fraction * (len(values) - 1)
    low = int(p)
    return values[low] + (p - low) * (values[min(low + 1, len(values) - 1)] - values[low])


def _mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def summarize(records: Sequence[dict]) -> dict[str, Any]:
    """llama.cpp's statistics over the token records: mean KLD (± its standard error), its
    percentiles and maximum, top-1 agreement, PPL of each model, and the PPL ratio with its error
    (the ratio's uncertainty from the paired per-token differences of log-likelihood)."""
    kld = sorted(r["kld"] for r in records)
    nll = [r["nll"] for r in records]
    nll_ref = [r["nll_reference"] for r in records]
    kld_mean, kld_err = _mean_and_error(kld)
    log_ratio, log_ratio_err = _mean_and_error([a - b for a, b in zip(nll, nll_ref)])
    same = sum(1 for r in records if r["correct"])
    n = len(records)
    top1 = same / n
    return {
        "tokens": n,
        "kld_mean": kld_mean, "kld_mean_error": kld_err,
        "kld_median": _percentile(kld, 0.5), "kld_p99": _percentile(kld, 0.99), "kld_max": kld[-1],
        "top1": top1, "top1_error": math.sqrt(top1 * (1 - top1) / (n - 1)) if n > 1 else 0.0,
        "ppl": math.exp(sum(nll) / n), "ppl_reference": math.exp(sum(nll_ref) / n),
        "ppl_ratio": math.exp(log_ratio), "ppl_ratio_error": math.exp(log_ratio) * log_ratio_err,
    }


def subscores(records: Sequence[dict]) -> dict[str, dict[str, dict]]:
    return {"fidelity": {"all": summarize(records)}} if records else {}


def cell(results: dict, detail: bool = False) -> str:
    """How the report shows a fidelity result: KLD, agreement and the PPL ratio (detail: PPLs, p99, max)."""
    s = summarize(results["items"])
    text = f"KLD {s['kld_mean']:.4f}, top-1 {100 * s['top1']:.1f}%, PPL ratio {s['ppl_ratio']:.3f}"
    if detail:
        reference = (results.get("reference") or {}).get("config") or "itself"
        text += (f" (vs {reference}; KLD p99 {s['kld_p99']:.4f}, max {s['kld_max']:.3f}; PPL {s['ppl']:.3f} vs "
                 f"{s['ppl_reference']:.3f}; {s['tokens']} tokens)")
    return text


TASK = Task(name="fidelity", label="Fidelity", settings=settings, load=load, run=run, subscores=subscores,
            max_drop=100.0, demo_limits=(4, 2), reference=True, cell=cell,
            records_per_item=CHUNK_TOKENS - 1 - CHUNK_TOKENS // 2, unit="tokens")
