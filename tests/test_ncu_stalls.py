"""tools/ncu_stalls.py: Nsight Compute's source page (CSV) read into stall shares by reason and instruction."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ncu_stalls.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "stall_long_sb", "stall_barrier", "stall_selected", "stall_long_sb (Not Issued)"]


def _report(path: Path) -> None:
    """Two launches as ncu writes them: a kernel-name line, the header, one line per SASS instruction."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "_w4_gemm_kernel", ""])
        w.writerow(HEADER)
        w.writerow(["0x10", "      STS.U16 [R169+0xa000], R16", "60", "59", "58", "0", "2", "58"])
        w.writerow(["0x20", "      HGMMA.64x16x16.F32.BF16 R24, R68", "30", "10", "0", "10", "20", "0"])
        w.writerow(["0x30", "      BAR.SYNC.DEFER_BLOCKING 0x0", "10", "10", "0", "10", "0", "0"])
        w.writerow(["Kernel Name", "_ws_gemv_kernel", ""])
        w.writerow(HEADER)
        w.writerow(["0x40", "      @!P1  BRA 0x7f", "5", "5", "5", "0", "0", "5"])


def test_stall_shares_by_reason_and_the_hottest_instructions(tmp_path):
    src, out = tmp_path / "source.csv", tmp_path / "stalls.json"
    _report(src)
    proc = subprocess.run([sys.executable, str(TOOL), str(src), "--top", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    gemm, gemv = json.loads(out.read_text())
    assert gemm["kernel"] == "_w4_gemm_kernel" and gemm["instructions"] == 3 and gemm["samples"] == 100
    # "(Not Issued)" columns are a subset of the others, not more samples
    assert gemm["reasons"] == {"long_sb": 0.58, "barrier": 0.2, "selected": 0.22}
    assert [h["source"] for h in gemm["hot"]] == ["STS.U16 [R169+0xa000], R16", "HGMMA.64x16x16.F32.BF16 R24, R68"]
    assert gemm["hot"][0]["share"] == 0.6 and gemm["hot"][0]["reasons"] == {"long_sb": 58, "selected": 2}
    assert gemv["reasons"] == {"long_sb": 1.0} and len(gemv["hot"]) == 1
    assert "[0] _w4_gemm_kernel: 3 instructions, 100 samples: long_sb 58%" in proc.stdout
