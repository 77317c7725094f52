"""cuda/draft_kernels.py's one-launch after_step and fill_inputs give DeviceDrafts' torch results exactly (every state
tensor, out, tokens and positions), through Triton's interpreter on the CPU: random seeded cases of every k and n-gram
range, padding spans, full histories, spans as a strided view (tests/draft_kernels_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")  # the test extra installs it; the kernels' module needs it to import

TESTS = Path(__file__).resolve().parent
STEPS = 30  # after_step calls per (k, min_n, max_n): 12 configurations, a fill_inputs case every fourth call


def test_draft_kernels_match_device_drafts_torch_methods():
    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, str(TESTS / "draft_kernels_check.py"), str(STEPS)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["mismatches"] == [] and r["mismatch_count"] == 0
    assert r["cases"] >= 12 * STEPS + 12 * (STEPS // 4)
    # the cases reached what they are there for: drafts found and not, drafts all kept and some rejected, appends past
    # a full history, padding spans
    assert all(r["coverage"][key] > 0 for key in ("found", "not_found", "all_accepted", "some_rejected",
                                                   "overflowed", "padding")), r["coverage"]
