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


def _stream(grpc, url, model, inputs, deadline, request_id=""):
    """(responses, seconds to the first, seconds to the last) of one streamed request; TimeoutError past deadline."""
    client = grpc.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    start, first, count = time.monotonic(), None, 0
    try:
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
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


def process_states() -> str:
    """Each process's state and kernel wait channel (a stub stuck in the driver shows as D)."""
    return subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:28,etime,args", "--cols", "220"], capture_output=True,
                          text=True).stdout


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
        try:
            dump = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            parts.append(f"==== pid {pid}: {cmd}\npy-spy did not return in 20 s")
            continue
        parts.append(f"==== pid {pid}: {cmd}\n{dump.stdout}{dump.stderr}")
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds each request may take")
    ap.add_argument("-o", "--output", help="a JSON file for the results")
    args = ap.parse_args()
    import tritonclient.grpc as grpc
    from tritonclient.utils import np_to_triton_dtype

    from trtllm_pipeline.triton.contract import PREPROCESSING_OUTPUTS

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
        pre = {engine: result.as_numpy(name) for name, engine in PREPROCESSING_OUTPUTS.items()}
        rows.append(("preprocessing infer", True, f"{ids.size} ids in {time.monotonic() - start:.2f} s"))
    except Exception as exc:
        ok = False
        rows.append(("preprocessing infer", False, str(exc)[:300]))
    if ok:
        steps.append(("tensorrt_llm stream", "tensorrt_llm", [
            _input(grpc, "input_ids", ids.astype(np.int32).reshape(1, -1), "INT32"),
            _input(grpc, "input_lengths", np.array([[ids.size]], dtype=np.int32), "INT32"),
            _input(grpc, "request_output_len", np.array([[8]], dtype=np.int32), "INT32"),
            _input(grpc, "streaming", np.array([[True]]), "BOOL")], ""))
        # the engine model with every input the BLS gives it (preprocessing's outputs, its flags, its request id)
        as_bls = [_input(grpc, k, v, np_to_triton_dtype(v.dtype)) for k, v in pre.items()]
        as_bls += [_input(grpc, "exclude_input_in_output", np.array([[True]]), "BOOL"),
                   _input(grpc, "streaming", np.array([[True]]), "BOOL")]
        steps.append(("tensorrt_llm as the BLS asks", "tensorrt_llm", as_bls, "bls-probe"))
    steps.append(("tensorrt_llm_bls stream", "tensorrt_llm_bls", [
        _input(grpc, "text_input", np.array([["Hello".encode()]], dtype=object), "BYTES"),
        _input(grpc, "max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
        _input(grpc, "stream", np.array([[True]]), "BOOL")], ""))
    for name, model, inputs, request_id in steps:
        try:
            count, first, last = _stream(grpc, args.url, model, inputs, args.deadline, request_id)
            rows.append((name, True, f"{count} responses, first {first:.3f} s, last {last:.3f} s"))
        except Exception as exc:
            ok = False
            rows.append((name, False, str(exc)[:300]))
            break
    if not ok and ids is not None:  # after a miss: is the engine model still alive?
        try:
            count, first, last = _stream(grpc, args.url, "tensorrt_llm", steps[0][2], args.deadline)
            rows.append(("tensorrt_llm stream again", True, f"{count} responses, first {first:.3f} s"))
        except Exception as exc:
            rows.append(("tensorrt_llm stream again", False, str(exc)[:300]))
    for name, good, detail in rows:
        print(f"{'ok ' if good else 'NO '} {name:26s} {detail}")
    if not ok:
        print(process_states())
        print(dump_stacks())
    if args.output:
        with open(args.output, "w") as f:
            json.dump([{"check": n, "ok": bool(g), "detail": d} for n, g, d in rows], f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
