"""Where a served process spends its time, from py-spy's raw (collapsed) samples: per file, the threads by share of
samples, then the functions holding most samples alone (self) and within them (inclusive).

    python benchmarks/spy_top.py RESULTS/spy-*.txt      # what `h200_run.sh served` (phase spy) recorded
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

TOP = 12


def _frame(frame: str) -> str:
    """``send (triton_python_backend_utils.py:123)`` -> ``send (triton_python_backend_utils.py)``: lines apart."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def summarise(path: Path) -> list[str]:
    threads, own, within = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";") if f]
        if frames and frames[0].startswith(("thread ", "process ")):
            threads[frames[0]] += n
            frames = frames[1:]
        total += n
        if frames:
            own[frames[-1]] += n
        for frame in set(frames):
            within[frame] += n
    if not total:
        return [f"## {path.name}: no samples"]
    lines = [f"## {path.name}: {total} samples"]
    lines += [f"  thread {100 * n / total:5.1f}%  {name}" for name, n in threads.most_common(6)]
    lines += [f"  self   {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(TOP)]
    lines += [f"  within {100 * n / total:5.1f}%  {name}" for name, n in within.most_common(TOP)]
    return lines


def main(paths: list[str]) -> int:
    for path in paths:
        print("\n".join(summarise(Path(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
