"""The tests' shim over Triton's interpreter (tests/triton_interpreter.py) changes speed, not values: the two GPU
instructions it runs as numpy operations give exactly what the kernels' own interpreter emulations give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent


def test_the_shims_dp4a_and_prmt_are_the_kernels_emulations_exactly():
    path = [str(TESTS / "interpreter_site"), str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    proc = subprocess.run([sys.executable, str(TESTS / "interpreter_shim_check.py")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["mismatches"] == {"dp4a_uu": 0, "dp4a_us": 0, "dp4a_su": 0, "dp4a_ss": 0, "prmt": 0}, r
    # each run took the path it is there to check, on outputs that vary (not a constant that both would give)
    assert r["native_ran"] == ["_dp4a.<locals>.dp4a", "_prmt.<locals>.prmt"] and r["emulated_ran"] == ["dp4a", "prmt"]
    assert r["distinct_outputs"] > 1000
