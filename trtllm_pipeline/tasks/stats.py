"""Statistics for accuracy results: intervals for one score, and the paired comparison of two runs.

Plain Python (no scipy): exact binomial tails with integer arithmetic, so p-values are exact for
any number of items. Accuracy is a proportion of items; comparing two builds on the *same* items
is a paired design, where only the discordant items (right in one run, wrong in the other) carry
information about the difference.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion; sensible at 0 and n, unlike the Wald interval."""
    if n <= 0:
        return (math.nan, math.nan)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The exact ends at 0 and n (the formula gives them up to rounding).
    return (0.0 if correct == 0 else centre - half, 1.0 if correct == n else centre + half)


def binomial_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact (integer sums, one correctly rounded division)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    total, term = 0, 1  # term = C(n, i), updated in place: one small multiplication per step
    for i in range(k + 1):
        total += term
        term = term * (n - i) // (i + 1)
    return total / (1 << n)


def mcnemar_exact_p(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value: are ``lost`` and ``gained`` discordant counts unequal?

    Under "no difference" each discordant item is equally likely to go either way, so the smaller
    count is Binomial(lost + gained, 1/2); the two-sided p doubles its lower tail (capped at 1).
    """
    n = lost + gained
    if n == 0:
        return 1.0
    return min(1.0, 2 * binomial_cdf_half(min(lost, gained), n))


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Baseline vs candidate on the same ``n`` items; drops are in points (percentage points)."""

    n: int
    baseline_correct: int
    candidate_correct: int
    lost: int  # right in the baseline, wrong in the candidate
    gained: int  # wrong in the baseline, right in the candidate
    drop: float  # baseline minus candidate accuracy, points; positive = the candidate is worse
    drop_ci95: tuple[float, float]
    p_value: float  # exact McNemar, two-sided

    @property
    def baseline_score(self) -> float:
        return self.baseline_correct / self.n

    @property
    def candidate_score(self) -> float:
        return self.candidate_correct / self.n


def compare_paired(baseline: Sequence[bool], candidate: Sequence[bool], z: float = Z95) -> PairedComparison:
    """Paired comparison of per-item correctness, item i of one run against item i of the other.

    The interval for the drop is Agresti and Min's adjusted Wald interval for a difference of
    paired proportions (half an observation added to each cell of the 2x2 table): close to the
    nominal 95% even with few discordant items, where the plain Wald interval collapses to a
    single point when the runs agree on every item.
    """
    if len(baseline) != len(candidate):
        raise ValueError("paired comparison needs the same number of items on both sides")
    n = len(baseline)
    if n == 0:
        raise ValueError("paired comparison needs at least one item")
    lost = sum(1 for b, c in zip(baseline, candidate) if b and not c)
    gained = sum(1 for b, c in zip(baseline, candidate) if c and not b)
    m = n + 2
    p_lost, p_gained = (lost + 0.5) / m, (gained + 0.5) / m
    diff = p_lost - p_gained
    half = z * math.sqrt(max(0.0, p_lost + p_gained - diff * diff) / m)
    return PairedComparison(
        n=n,
        baseline_correct=sum(map(bool, baseline)),
        candidate_correct=sum(map(bool, candidate)),
        lost=lost,
        gained=gained,
        drop=100.0 * (lost - gained) / n,
        drop_ci95=(100.0 * max(-1.0, diff - half), 100.0 * min(1.0, diff + half)),
        p_value=mcnemar_exact_p(lost, gained),
    )


def summarize(flags: Sequence[bool]) -> dict:
    """``{n, score, ci95}`` of per-item correctness flags (Wilson interval)."""
    n, k = len(flags), sum(map(bool, flags))
    return {"n": n, "score": k / n if n else math.nan, "ci95": list(wilson_interval(k, n))}
