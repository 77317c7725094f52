"""Per-tensor fingerprints of a checkpoint's safetensors (name, dtype, shape, float64 sum and sum of absolutes), so
that checkpoints made on two machines can be compared without moving them (issue 33: the SmolLM2 BF16 build made on
the H200 answers wrong where the one made here answers right).

    python benchmarks/tensor_sums.py CHECKPOINT_DIR -o sums.json [--against other_sums.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors import safe_open


def fingerprints(directory: Path) -> dict[str, list]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                x = t.double() if t.is_floating_point() else t.to(dtype=__import__("torch").float64)
                out[f"{path.name}:{name}"] = [str(t.dtype), list(t.shape), float(x.sum()), float(x.abs().sum())]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", type=Path)
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--against", type=Path, help="another run's JSON: the tensors that differ are printed")
    args = ap.parse_args()
    sums = fingerprints(args.directory)
    print(f"{len(sums)} tensors in {args.directory}")
    if args.output:
        args.output.write_text(json.dumps(sums, indent=0))
    if args.against:
        other = json.loads(args.against.read_text())
        differ = [k for k in sorted(set(sums) | set(other)) if sums.get(k) is None or other.get(k) is None or
                  sums[k][:2] != other[k][:2] or
                  any(abs(a - b) > 1e-3 * max(1.0, abs(b)) for a, b in zip(sums[k][2:], other[k][2:]))]
        print(f"{len(differ)} differ" + "".join(f"\n  {k}: {sums.get(k)} vs {other.get(k)}" for k in differ[:40]))


if __name__ == "__main__":
    main()
