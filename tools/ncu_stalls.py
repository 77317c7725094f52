"""Where each profiled kernel's warps waited: Nsight Compute's per-instruction stall samples, summed by reason and
the instructions that took the most, from ``ncu --import REPORT --page source --csv --print-source sass``.

    python tools/ncu_stalls.py quant-source.csv [--top 12] [--json OUT]

One block per profiled launch, in the report's order (``h200_run.sh ncu_quant``: three launches per kernel and
shape). A stall reason's share of all samples says what bounds a latency-bound kernel: ``long_sb`` a global or
local load's result awaited, ``barrier`` a CTA or warpgroup barrier, ``wait`` a fixed-latency dependency,
``selected`` issuing (not a stall).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
from pathlib import Path


def launches(path: Path) -> list[dict]:
    """[{kernel, rows: [{address, source, samples, stalls: {reason: n}}]}] of each launch in the CSV."""
    out: list[dict] = []
    header: list[str] = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                out.append({"kernel": row[1], "rows": []})
            elif row[0] == "Address":
                header = row
            elif out and row[0].startswith("0x") and header:
                cols = dict(zip(header, row))
                stalls = {k.removeprefix("stall_"): int(v or 0) for k, v in cols.items()
                          if k.startswith("stall_") and "(Not Issued)" not in k}
                out[-1]["rows"].append({"address": row[0], "source": cols.get("Source", "").strip(),
                                        "samples": int(cols.get("Warp Stall Sampling (All Samples)") or 0),
                                        "stalls": stalls})
    return out


def summary(launch: dict, top: int) -> dict:
    total = collections.Counter()
    for r in launch["rows"]:
        total.update(r["stalls"])
    n = sum(total.values()) or 1
    hot = sorted(launch["rows"], key=lambda r: -r["samples"])[:top]
    return {"kernel": launch["kernel"], "instructions": len(launch["rows"]), "samples": n,
            "reasons": {k: round(v / n, 4) for k, v in total.most_common() if v},
            "hot": [{"source": r["source"], "share": round(r["samples"] / n, 4),
                     "reasons": dict(collections.Counter(r["stalls"]).most_common(2))} for r in hot]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=12, help="the instructions with the most samples, per launch")
    ap.add_argument("--json", type=Path, help="also write the summaries here")
    args = ap.parse_args()
    rows = [summary(launch, args.top) for launch in launches(args.csv)]
    for i, r in enumerate(rows):
        reasons = ", ".join(f"{k} {v:.0%}" for k, v in list(r["reasons"].items())[:6])
        print(f"[{i}] {r['kernel']}: {r['instructions']} instructions, {r['samples']} samples: {reasons}")
        for h in r["hot"]:
            print(f"      {h['share']:6.1%}  {h['source'][:70]:70s} {h['reasons']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
