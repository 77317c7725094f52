"""``--limit``: a reproducible stratified subset of a task's items.

The same limit and seed select the same items on every run, runtime, config and data source:
each item's rank is a hash of the seed and its stable id, never a random state or file order.
Strata (MMLU subjects, GSM8K solution lengths) get seats in proportion to their size, so a
subset's score estimates the full score with less variance than a plain random sample, and
every stratum is represented once the limit allows it.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from trtllm_pipeline.tasks.base import Item


def item_rank(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def allocate(sizes: dict[str, int], limit: int) -> dict[str, int]:
    """Seats per stratum, summing to ``min(limit, total)``.

    One seat per stratum first when the limit covers them all, then the rest in proportion to the
    remaining sizes by largest remainder (Hamilton's method; ties broken by stratum name).
    """
    total = sum(sizes.values())
    limit = min(limit, total)
    seats = {s: 0 for s in sizes}
    if limit >= len(sizes):
        seats = {s: 1 if n else 0 for s, n in sizes.items()}
    room = {s: sizes[s] - seats[s] for s in sizes}
    left = limit - sum(seats.values())
    pool = sum(room.values())
    if left <= 0 or pool == 0:
        return seats
    shares = {s: left * room[s] / pool for s in sizes}
    for s in sizes:
        seats[s] += int(shares[s])
    left = limit - sum(seats.values())
    by_remainder = sorted(sizes, key=lambda s: (-(shares[s] - int(shares[s])), s))
    for s in by_remainder:
        if left == 0:
            break
        if seats[s] < sizes[s]:
            seats[s] += 1
            left -= 1
    return seats


def stratified_subset(items: Sequence[Item], limit: int | None, seed: int) -> list[Item]:
    """The first ``limit`` items by (stratum quota, hash rank), returned in the release's order."""
    if limit is None or limit >= len(items):
        return list(items)
    strata: dict[str, list[Item]] = {}
    for item in items:
        strata.setdefault(item.stratum, []).append(item)
    seats = allocate({s: len(members) for s, members in strata.items()}, limit)
    chosen: set[str] = set()
    for stratum, members in strata.items():
        ranked = sorted(members, key=lambda it: item_rank(seed, it.id))
        chosen.update(it.id for it in ranked[: seats[stratum]])
    return [it for it in items if it.id in chosen]
