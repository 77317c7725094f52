"""Tensor parallelism of the torch runtime on this machine's CPUs: per-rank memory and ms/token, TP 1/2/4.

For each config, one ``trtllm-pipeline bench --in-process`` (the command is recorded in the output):
the runtime with ``--tp-mode`` (default auto: tp=1 in one process, tp>1 one process per rank over gloo),
decode steps timed at each ``--batch`` after a ``--context``-token prompt, then each rank's resident
memory (RSS after the runs, and the weight bytes it holds, from ``describe()``). On a CPU the ranks
share the same cores, so more ranks are slower, not faster: this measures that the distributed path
spreads memory and what it costs, not a speed-up (that needs one GPU per rank).

    python benchmarks/tp_cpu.py --engines-dir engines -o benchmarks/results/tp-tiny-cpu-2core.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = ("tiny-qwen2-fp8-tp1", "tiny-qwen2-fp8-tp2", "tiny-qwen2-fp8-tp4")
MIB = 2**20


def command(config: str, engines_dir: Path, out: Path, args) -> list[str]:
    return ["trtllm-pipeline", "bench", "--in-process", "-c", f"build_configs/{config}.yaml",
            "--engines-dir", str(engines_dir), "--batch", args.batch, "--context", args.context,
            "--output-tokens", str(args.output_tokens), "--tp-mode", args.tp_mode, "-o", str(out)]


def summarize(config: str, data: dict, cmd: list[str]) -> dict:
    rt = data["runtime"]
    rss = {r["rank"]: r["rss_bytes"] for r in data.get("rss_after", [])}
    ranks = [{"rank": r["rank"], "pid": r["pid"],
              "weight_mib": round(sum(v for k, v in r["memory"].items() if k != "kv_cache") / MIB, 3),
              "kv_cache_mib": round(r["memory"]["kv_cache"] / MIB, 3),
              "rss_after_mib": round(rss[r["rank"]] / MIB, 1) if rss.get(r["rank"]) else None}
             for r in rt["ranks"]]
    return {"config": config, "command": " ".join(cmd), "tp_mode": rt["tp_mode"], "world_size": rt["world_size"],
            "weight_format": rt["weight_format"], "dtype": rt["dtype"], "ranks": ranks,
            "decode": [{"batch": r["batch"], "context": r["context"], "ms_per_step": round(r["decode_ms"], 3),
                        "ms_per_token": round(r["decode_ms"] / r["batch"], 3), "p90_ms": round(r["decode_ms_p90"], 3),
                        "prefill_ms": round(r["prefill_ms"], 1)} for r in data["runs"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines-dir", type=Path, default=Path("engines"))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--batch", default="1,4")
    p.add_argument("--context", default="128")
    p.add_argument("--output-tokens", type=int, default=80)
    p.add_argument("--tp-mode", default="auto", help="auto: TP 1 in this process, TP 2 and 4 one process per rank")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            subprocess.run([str(bin_dir / "trtllm-pipeline"), "build", "-c", f"build_configs/{config}.yaml",
                            "--engines-dir", str(args.engines_dir), "--runtime", "torch"], check=True, env=env)
            out = Path(tmp) / f"{config}.json"
            cmd = command(config, args.engines_dir, out, args)
            subprocess.run([str(bin_dir / cmd[0]), *cmd[1:]], check=True, env=env)
            results.append(summarize(config, json.loads(out.read_text()), cmd))
    machine = {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor() or platform.machine(),
               "python": platform.python_version()}
    import torch

    machine["torch"] = torch.__version__
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "note": "ranks share the CPU cores: a correctness target, "
                                       "not a speed-up", "results": results}, indent=2) + "\n")
    for r in results:
        ms = ", ".join(f"b{d['batch']}: {d['ms_per_token']} ms/token" for d in r["decode"])
        mem = ", ".join(f"rank {k['rank']}: {k['weight_mib']} MiB weights, RSS {k['rss_after_mib']} MiB"
                        for k in r["ranks"])
        print(f"{r['config']} ({r['tp_mode']}, {r['world_size']} processes): {ms}; {mem}")


if __name__ == "__main__":
    main()
