"""Calibration data for post-training quantization, loaded with ``datasets``.

Sources: a hub dataset (TensorRT-LLM's recipe: ``abisee/cnn_dailymail`` 3.0.0, train, the first
512 ``article`` values), a local json/jsonl/parquet/csv/txt file or a directory of them, or
``builtin:random-tokens`` (seeded uniform token ids, for the built-in model on offline machines).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trtllm_pipeline.artifacts import file_sha256, fingerprint
from trtllm_pipeline.config import CalibrationSection, looks_like_a_path
from trtllm_pipeline.errors import InputError, UnavailableError

log = logging.getLogger(__name__)

RANDOM_TOKENS = "builtin:random-tokens"
_LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


def is_local(cal: CalibrationSection) -> bool:
    """A local file or directory; one that only looks like a path is an error, never a hub id to try."""
    if cal.dataset.startswith("builtin:"):
        return False
    if Path(os.path.expanduser(cal.dataset)).exists():
        return True
    if looks_like_a_path(cal.dataset):
        raise InputError(f"quantization.calibration.dataset: {cal.dataset} does not exist (a local path, so it is "
                         "not looked up on the hub).", fix="correct the path, or give a hub dataset id (org/name)")
    return False


def data_fingerprint(cal: CalibrationSection) -> dict[str, Any]:
    """What identifies the calibration data, for the quantize stage's cache key.

    Local files are hashed by content, so editing them re-quantizes. A hub dataset is identified
    by its id, subset and split (hashing it would mean downloading it on every cache check).
    """
    settings = cal.model_dump(mode="json") | {
        "subset": cal.resolved_subset,
        "text_column": cal.resolved_text_column,
    }
    if is_local(cal):
        path = Path(os.path.expanduser(cal.dataset)).resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        settings["content_sha256"] = fingerprint({str(f.relative_to(path.parent)): file_sha256(f) for f in files})
    return settings


def load_texts(cal: CalibrationSection) -> list[str]:
    """The first ``num_samples`` non-empty texts of the configured dataset."""
    import datasets

    datasets.disable_progress_bars()
    column = cal.resolved_text_column
    if is_local(cal):
        ds = _load_local(Path(os.path.expanduser(cal.dataset)), cal.split)
        where = cal.dataset
    else:
        where = f"{cal.dataset} ({cal.resolved_subset or 'default'}, {cal.split})"
        ds = _load_hub(cal)
    if column not in ds.column_names:
        raise InputError(
            f"quantization.calibration: {where} has no column {column!r}; it has {ds.column_names}.",
            fix=f"set quantization.calibration.text_column to one of {ds.column_names}",
        )
    texts = [t for t in ds[column][: cal.num_samples * 2] if isinstance(t, str) and t.strip()][: cal.num_samples]
    if not texts:
        raise InputError(f"quantization.calibration: {where} column {column!r} holds no text.",
                         fix="point quantization.calibration.dataset at data with text in it")
    if len(texts) < cal.num_samples:
        log.warning("calibration: %s has only %d texts (num_samples is %d); using them all",
                    where, len(texts), cal.num_samples)
    return texts


def _load_local(path: Path, split: str):
    import datasets

    try:
        if path.is_dir():
            return datasets.load_dataset(str(path), split=split)
        builder = _LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise InputError(
                f"quantization.calibration.dataset: {path} has an unknown extension.",
                fix=f"use one of {', '.join(_LOCAL_BUILDERS)}, or a directory of such files",
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"quantization.calibration.dataset: cannot read {path}: {exc}",
                         fix="check the file's format (one JSON object per line for jsonl)") from None


def _load_hub(cal: CalibrationSection):
    import datasets

    try:
        return datasets.load_dataset(cal.dataset, cal.resolved_subset, split=cal.split)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnavailableError(
            f"quantization.calibration: cannot load {cal.dataset} from the Hugging Face hub or the local "
            f"datasets cache ({type(exc).__name__}: {first}).",
            fix="give a local file or directory with a `text` column in quantization.calibration.dataset "
            "(json, jsonl, parquet, csv, txt), or builtin:random-tokens for smoke tests, or pre-fill the "
            "datasets cache and set HF_DATASETS_OFFLINE=1",
        ) from None


def calibration_batches(cal: CalibrationSection, tokenizer, vocab_size: int, special_ids: set[int]) -> list[dict]:
    """Model inputs (``input_ids`` and ``attention_mask`` tensors), ``batch_size`` rows each."""
    import torch

    if cal.dataset == RANDOM_TOKENS:
        gen = torch.Generator().manual_seed(cal.seed)
        allowed = torch.tensor([i for i in range(vocab_size) if i not in special_ids])
        ids = allowed[torch.randint(len(allowed), (cal.num_samples, cal.max_seq_len), generator=gen)]
        rows = [r for r in ids]
    elif cal.dataset.startswith("builtin:"):
        raise InputError(f"quantization.calibration.dataset: unknown built-in {cal.dataset!r}.",
                         fix=f"use {RANDOM_TOKENS}, a hub dataset id or a local file")
    else:
        texts = load_texts(cal)
        enc = tokenizer(texts, truncation=True, max_length=cal.max_seq_len, add_special_tokens=True)
        rows = [torch.tensor(r) for r in enc["input_ids"] if len(r) > 1]
    batches = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(rows), cal.batch_size):
        chunk = rows[start : start + cal.batch_size]
        width = max(len(r) for r in chunk)
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, r in enumerate(chunk):
            input_ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": mask})
    return batches
