"""Serving cost from a measured output-token throughput and a GPU price.

A deployment is ``gpus`` GPUs (the build's tp * pp) rented at ``gpu_hour_usd`` each and kept busy
around the clock at the measured throughput (the load level that produced it: the numbers hold
for that concurrency, and a deployment that idles costs more per token). Then

  usd per 1M output tokens = gpus * gpu_hour_usd / (tokens/s * 3600) * 1e6
  usd per request          = gpus * gpu_hour_usd / 3600 * (request tokens / tokens/s)
  requests per day         = tokens/s * 86400 / request tokens

The reference recipe's estimate has this shape: ~1,700-token reasoning requests, ~90,000 of them a
day per deployment, about one cent each.

DEFAULT_GPU_HOUR_USD is an assumption, never a measurement: 10 USD per GPU-hour is the order of
hyperscaler on-demand list prices for H200 (8-GPU instances near 80 USD/hour in 2025); specialist
clouds and reservations are 2-3x cheaper. Pass your own price (--gpu-hour-usd).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_pipeline.errors import InputError

DEFAULT_GPU_HOUR_USD = 10.0
REFERENCE_REQUEST_TOKENS = 1700  # a reasoning request of R1-Distill-Qwen in the reference recipe
SECONDS_PER_DAY = 86_400


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    output_tokens_per_s: float
    gpus: int
    gpu_hour_usd: float
    request_output_tokens: int

    @property
    def deployment_hour_usd(self) -> float:
        return self.gpus * self.gpu_hour_usd

    @property
    def usd_per_1m_output_tokens(self) -> float:
        return self.deployment_hour_usd / (self.output_tokens_per_s * 3600) * 1e6

    @property
    def usd_per_request(self) -> float:
        return self.deployment_hour_usd / 3600 * self.request_output_tokens / self.output_tokens_per_s

    @property
    def requests_per_day(self) -> float:
        return self.output_tokens_per_s * SECONDS_PER_DAY / self.request_output_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_hour_usd": self.gpu_hour_usd,
            "gpus": self.gpus,
            "request_output_tokens": self.request_output_tokens,
            "usd_per_1m_output_tokens": round(self.usd_per_1m_output_tokens, 4),
            "usd_per_request": round(self.usd_per_request, 6),
            "requests_per_day": round(self.requests_per_day),
        }


def estimate(output_tokens_per_s: float | None, *, gpus: int, gpu_hour_usd: float = DEFAULT_GPU_HOUR_USD,
             request_output_tokens: int = REFERENCE_REQUEST_TOKENS) -> CostEstimate | None:
    """The cost at a measured throughput; None when nothing was measured (never a zero cost)."""
    if gpu_hour_usd <= 0:
        raise InputError(f"--gpu-hour-usd must be positive, got {gpu_hour_usd}.", fix="pass a price such as 3.5")
    if gpus < 1:
        raise InputError(f"the GPU count must be at least 1, got {gpus}.", fix="pass --gpus 1 or more")
    if request_output_tokens < 1:
        raise InputError(f"the request length must be at least 1 token, got {request_output_tokens}.")
    if not output_tokens_per_s or output_tokens_per_s <= 0:
        return None
    return CostEstimate(output_tokens_per_s, gpus, gpu_hour_usd, request_output_tokens)
