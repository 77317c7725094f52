"""Which model of a running deployment answers: each in turn, with a deadline, and stacks when one does not.

A served request that never returns says nothing about where it waits. This asks, over gRPC: the server's and
each model's readiness, ``preprocessing`` alone (a plain infer), ``tensorrt_llm`` alone (a stream of token ids),
then ``tensorrt_llm_bls`` (the whole chain). On the first that misses its deadline it dumps the Python stacks of
the tritonserver process and of every Python-backend stub with ``py-spy`` (when installed), so the log shows
which thread waits on what. Exit 0 when all answered, 1 otherwise.

    python benchmarks/serve_probe.py --url 127.0.0.1:8001 [--deadline 30] [-o probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import time

import numpy as np


def _input(grpc, name, array, datatype):
    tensor = grpc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _stream(grpc, url, model, inputs, deadline):
    """(responses, seconds to the first, seconds to the last) of one streamed request; TimeoutError past deadline."""
    client = grpc.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    start, first, count = time.monotonic(), None, 0
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            left = deadline - (time.monotonic() - start)
            if left <= 0:
                raise TimeoutError(f"{model}: {count} responses, then nothing for {deadline:.0f} s")
            try:
                result, error = got.get(timeout=left)
            except queue.Empty:
                continue
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            first = first if first is not None else time.monotonic() - start
            count += 1
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return count, first, time.monotonic() - start
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def dump_stacks() -> str:
    """py-spy's dump of the server and its stubs; and SIGUSR1 to each stub, which writes its threads' stacks
    into the server's log (``serving_sys_path``), for where py-spy may not attach."""
    pids = subprocess.run(["pgrep", "-f", "tritonserver|triton_python_backend_stub"], capture_output=True,
                          text=True).stdout.split()
    parts = []
    for pid in pids:
        if b"triton_python_backend_stub" in open(f"/proc/{pid}/cmdline", "rb").read():
            os.kill(int(pid), signal.SIGUSR1)
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy is not installed: stacks in the server's log only (SIGUSR1)"
    for pid in pids:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:160]
        dump = subprocess.run([spy, "dump", "--pid", pid, "--native"], capture_output=True, text=True, timeout=60)
        parts.append(f"==== pid {pid}: {cmd}\n{dump.stdout}{dump.stderr}")
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds each request may take")
    ap.add_argument("-o", "--output", help="a JSON file for the results")
    args = ap.parse_args()
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(args.url)
    rows = [("server ready", client.is_server_ready(), "")]
    for model in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        rows.append((f"{model} ready", client.is_model_ready(model), ""))
    ok, ids = True, None
    steps = []
    start = time.monotonic()
    try:  # preprocessing alone: a plain, non-decoupled model
        result = client.infer("preprocessing", [
            _input(grpc, "QUERY", np.array([["Hello".encode()]], dtype=object), "BYTES"),
            _input(grpc, "REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32), "INT32")],
            client_timeout=args.deadline)
        ids = result.as_numpy("INPUT_ID")
        rows.append(("preprocessing infer", True, f"{ids.size} ids in {time.monotonic() - start:.2f} s"))
    except Exception as exc:
        ok = False
        rows.append(("preprocessing infer", False, str(exc)[:300]))
    if ok:
        steps.append(("tensorrt_llm stream", "tensorrt_llm", [
            _input(grpc, "input_ids", ids.astype(np.int32).reshape(1, -1), "INT32"),
            _input(grpc, "input_lengths", np.array([[ids.size]], dtype=np.int32), "INT32"),
            _input(grpc, "request_output_len", np.array([[8]], dtype=np.int32), "INT32"),
            _input(grpc, "streaming", np.array([[True]]), "BOOL")]))
    steps.append(("tensorrt_llm_bls stream", "tensorrt_llm_bls", [
        _input(grpc, "text_input", np.array([["Hello".encode()]], dtype=object), "BYTES"),
        _input(grpc, "max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
        _input(grpc, "stream", np.array([[True]]), "BOOL")]))
    for name, model, inputs in steps:
        try:
            count, first, last = _stream(grpc, args.url, model, inputs, args.deadline)
            rows.append((name, True, f"{count} responses, first {first:.3f} s, last {last:.3f} s"))
        except Exception as exc:
            ok = False
            rows.append((name, False, str(exc)[:300]))
            break
    for name, good, detail in rows:
        print(f"{'ok ' if good else 'NO '} {name:26s} {detail}")
    if not ok:
        print(dump_stacks())
    if args.output:
        with open(args.output, "w") as f:
            json.dump([{"check": n, "ok": bool(g), "detail": d} for n, g, d in rows], f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
