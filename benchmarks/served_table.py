"""The served table of `benchmarks/h200_run.sh served` (issue 30): gRPC and OpenAI against in-process, one call.

    python benchmarks/served_table.py RESULTS_DIR      # prints markdown; reads what the run wrote there

Rows: each served load level (TTFT p50, ITL p50/p99, output tokens/s, and the server's own view of the level: ms
and tokens per step, the share of steps chained, the eager forwards' share of the time, the engine's mean TTFT)
beside the in-process figure of the same batch (ms/step, its graph's replay, tokens/s) and the served/in-process
ratios the issue's goals name, the last also against the in-process batch's whole run (its prefill included, as a
served load's tokens/s is); then the start-up times (cold, warm) and the soak's
figures. A file the run did not write is left out, never guessed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _served_levels(out: Path) -> list[tuple[str, dict]]:
    levels = []
    for name, protocol in (("served-grpc-c1.json", "gRPC"), ("served-grpc.json", "gRPC"),
                           ("served-openai-c1.json", "OpenAI"), ("served-openai-c32.json", "OpenAI")):
        data = _load(out / name)
        for entry in (data or {}).get("summary", []):
            levels.append((protocol, entry))
    return levels


def _inprocess(out: Path, name: str) -> dict[int, dict]:
    data = _load(out / name) or {}
    return {run["batch"]: run for run in data.get("runs", [])}


def _client(client: dict) -> str:
    """The busiest client process's CPU share of the level's wall time, and how many sent it (``bench``'s
    ``--client-processes``; one before it existed)."""
    return f"{_fmt(client.get('cpu_share'), '.2f')} ({client.get('processes', 1)})"


def table(out: Path) -> list[str]:
    inproc = _inprocess(out, "inprocess-fp8-c128.json")
    # front ms: the client's mean TTFT less the engine's (the way to the engine and the first token's way back:
    # BLS, Triton, the client; H100 2026-12-05e: 5.5 ms at c=1, 98 at c=64); then its parts the server counts, means:
    # Triton's queue for the BLS, the BLS's execute() to the request sent on the engine's socket, the socket to the
    # engine queueing it (its listener); what the client waited beyond these and the engine's TTFT is the way back
    lines = ["| protocol | concurrency | TTFT p50 ms | engine TTFT mean ms | front ms | Triton queue ms "
             "| BLS to socket ms | socket to engine ms | client CPU share (processes) | ITL p50 ms "
             "| ITL p99 ms | tokens/s "
             "| server ms/step | server tokens/step | chained steps | eager share | in-process ms/step "
             "| served ITL / in-process | served tok/s / in-process | served tok/s / in-process whole |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    itl_by = {"gRPC": {}, "OpenAI": {}}  # ITL p50 by protocol and concurrency: the OpenAI front's share (goal 5%)
    for protocol, entry in _served_levels(out):
        c = entry.get("concurrency")
        ref = inproc.get(c, {})
        itl, rate = entry["itl_ms"].get("p50"), entry.get("output_tokens_per_s")
        server = entry.get("server") or {}  # the server's own step counters (bench/server_steps.py)
        if itl is not None and protocol in itl_by:
            itl_by[protocol][c] = itl
        ratio_itl = itl / ref["decode_ms"] if itl and ref.get("decode_ms") else None
        ratio_rate = rate / ref["tokens_per_s"] if rate and ref.get("tokens_per_s") else None
        ratio_whole = rate / ref["whole_tokens_per_s"] if rate and ref.get("whole_tokens_per_s") else None
        chained = server["chained_steps"] / server["steps"] if "chained_steps" in server else None
        engine_ttft = server.get("engine_ttft_ms_mean")
        front = entry["ttft_ms"]["mean"] - engine_ttft if engine_ttft and entry["ttft_ms"].get("mean") else None
        lines.append(f"| {protocol} | {c} | {_fmt(entry['ttft_ms'].get('p50'), '.1f')} | "
                     f"{_fmt(engine_ttft, '.1f')} | {_fmt(front, '.1f')} | "
                     f"{_fmt(server.get('triton_queue_ms_mean'), '.1f')} | "
                     f"{_fmt(server.get('bls_submit_ms_mean'), '.1f')} | "
                     f"{_fmt(server.get('engine_socket_ms_mean'), '.1f')} | "
                     f"{_client(entry.get('client') or {})} | {_fmt(itl, '.3f')} | "
                     f"{_fmt(entry['itl_ms'].get('p99'), '.3f')} | {_fmt(rate, '.0f')} | "
                     f"{_fmt(server.get('ms_per_step'), '.3f')} | {_fmt(server.get('tokens_per_step'), '.1f')} | "
                     f"{_fmt(chained, '.0%')} | {_fmt(server.get('eager_share'), '.0%')} | "
                     f"{_fmt(ref.get('decode_ms'), '.3f')} | {_fmt(ratio_itl, '.3f')} | {_fmt(ratio_rate, '.3f')} | "
                     f"{_fmt(ratio_whole, '.3f')} |")
    both = sorted(set(itl_by["gRPC"]) & set(itl_by["OpenAI"]))
    if both:  # (the OpenAI levels run on the second, warm start: same build, same machine)
        lines += ["", "OpenAI front's ITL p50 against gRPC's: " + ", ".join(
            f"c={c} {itl_by['OpenAI'][c]:.3f} / {itl_by['gRPC'][c]:.3f} ms = {itl_by['OpenAI'][c] / itl_by['gRPC'][c]:.3f}"
            for c in both)]
    lines += ["", "| in-process batch | ms/step | graph replay ms | tokens/s | whole-batch tokens/s | prefill ms |",
              "|---|---|---|---|---|---|"]
    for batch, run in sorted(inproc.items()):
        lines.append(f"| {batch} | {_fmt(run['decode_ms'], '.3f')} | {_fmt(run.get('graph_replay_ms'), '.3f')} | "
                     f"{_fmt(run['tokens_per_s'], '.0f')} | {_fmt(run.get('whole_tokens_per_s'), '.0f')} | "
                     f"{_fmt(run['prefill_ms'], '.1f')} |")
    ready = {kind: (out / f"ready-{kind}.txt").read_text().strip() for kind in ("cold", "warm")
             if (out / f"ready-{kind}.txt").is_file()}
    if ready:
        lines += ["", "start-up, `serve --detach` to ready: " + ", ".join(f"{k} {v} s" for k, v in ready.items())]
    soak = _load(out / "soak.json")
    if soak:
        s, m, d = soak.get("soak", {}), soak.get("malformed", {}), soak.get("disconnects", {})
        lines += ["", f"soak (64 streams, ~20% malformed, disconnects): {s.get('valid_served')} of "
                      f"{s.get('valid_requests')} valid requests served ({s.get('valid_lost')} lost); malformed "
                      f"{m.get('refused_4xx_with_message')} of {m.get('requests')} refused with a 4xx; "
                      f"{d.get('freed')} of {d.get('count')} disconnects freed, steps to free "
                      f"{json.dumps(d.get('steps_to_free'))}; p99 latency soak/baseline "
                      f"{_fmt(soak.get('p99_request_latency_ratio_soak_vs_baseline'))}; "
                      f"ready after: {soak.get('server_ready_after')}"]
    return lines


if __name__ == "__main__":
    print("\n".join(table(Path(sys.argv[1]))))
