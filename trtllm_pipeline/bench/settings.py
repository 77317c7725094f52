"""What one ``bench`` run measures: its load levels and settings, checked before anything is sent."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trtllm_pipeline.errors import InputError

DATASETS = ("synthetic", "gsm8k")


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
    client_processes: int | None = None  # None: ``client_processes.auto_processes`` per level

    def check(self) -> None:
        if not self.levels:
            raise InputError("no load level given.", fix="pass --concurrency 1,4,8 and/or --request-rate 2,4")
        if any(lv.concurrency is not None and lv.concurrency < 1 for lv in self.levels):
            raise InputError("--concurrency values must be at least 1.")
        if any(lv.request_rate is not None and lv.request_rate <= 0 for lv in self.levels):
            raise InputError("--request-rate values must be positive (requests per second).")
        if self.input_tokens < 2 or self.output_tokens < 1 or self.requests < 1 or self.warmup < 0:
            raise InputError("--input-tokens must be >= 2, --output-tokens >= 1, --requests >= 1, --warmup >= 0.")
        if self.client_processes is not None and self.client_processes < 1:
            raise InputError("--client-processes must be at least 1.")
        if self.dataset not in DATASETS:
            raise InputError(f"unknown dataset {self.dataset!r}.", fix=f"use one of {', '.join(DATASETS)}")


def load_levels(concurrency: list[int] | None, request_rate: list[float] | None) -> tuple[LoadLevel, ...]:
    """Closed-loop levels first, then open-loop ones; concurrency 1 when neither is given."""
    levels = [LoadLevel(concurrency=c) for c in (concurrency or ([] if request_rate else [1]))]
    return tuple(levels + [LoadLevel(request_rate=r) for r in request_rate or []])
