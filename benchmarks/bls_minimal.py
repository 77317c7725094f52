"""Does a Python-backend BLS call into a decoupled model answer on this machine? Without this project's models.

A repository of three tiny Python models, served by the tritonserver that `serve` uses (nvidia-pytriton's, with
the stub environment `serve` prepares where numpy is 2):
  ``echo_cpu`` / ``echo_gpu``: decoupled, send N responses (one INT32 each) then the final flag; instance groups
  KIND_CPU and KIND_GPU (the latter only where a GPU is); ``echo_torch_*``: the same with CUDA work in the stub and the
  responses sent from a thread of the model's own, as the torch engine model does (GPU only); ``echo_extra``: that,
  sending an output besides the one the BLS asks for (the stub then prunes it: this crashed 2.51's stub);
  ``bls``: decoupled, calls the model named in its input with ``exec(decoupled=True)`` and forwards each response.
Each case is asked over gRPC with a deadline; a table says which answered. Exit 0 when all did.

    python benchmarks/bls_minimal.py [--deadline 20]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ECHO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# As the torch engine model does: CUDA work in the stub, responses sent from a thread of the model's own.
ECHO_TORCH = '''
import queue
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

EXTRA = False


class TritonPythonModel:
    def initialize(self, args):
        self.x = torch.ones(1024, device="cuda")
        self.work = queue.Queue()
        threading.Thread(target=self.loop, daemon=True).start()

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            self.work.put((request.get_response_sender(), n))
        return None

    def loop(self):
        while True:
            sender, n = self.work.get()
            for i in range(n):
                value = int((self.x * i).sum().item())
                outputs = [pb_utils.Tensor("OUT", np.array([value], np.int32))]
                if EXTRA:  # an output the BLS did not ask for (the stub prunes it from the response)
                    outputs.append(pb_utils.Tensor("EXTRA", np.array([b"piece"], dtype=object)))
                sender.send(pb_utils.InferenceResponse(outputs))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

BLS = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request, request.get_response_sender()), daemon=True).start()
        return None

    def run(self, request, sender):
        target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy().reshape(-1)[0].decode()
        n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
        call = pb_utils.InferenceRequest(model_name=target, requested_output_names=["OUT"],
                                         inputs=[pb_utils.Tensor("N", n)])
        for response in call.exec(decoupled=True):
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=response.error()),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.as_numpy())]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def _config(name: str, kind: str, inputs: list[tuple[str, str]]) -> str:
    ins = "".join(f'input [{{ name: "{n}" data_type: {t} dims: [1] }}]\n' for n, t in inputs)
    extra = 'output [{ name: "EXTRA" data_type: TYPE_STRING dims: [1] }]\n' if "extra" in name else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy {{ decoupled: true }}\n'
            f'{ins}output [{{ name: "OUT" data_type: TYPE_INT32 dims: [1] }}]\n{extra}'
            f'instance_group [{{ count: 1 kind: {kind} }}]\n')


def write_repo(root: Path, gpu: bool) -> list[str]:
    models = {"echo_cpu": (ECHO, "KIND_CPU", [("N", "TYPE_INT32")]),
              "bls": (BLS, "KIND_CPU", [("TARGET", "TYPE_STRING"), ("N", "TYPE_INT32")])}
    if gpu:
        models["echo_gpu"] = (ECHO, "KIND_GPU", [("N", "TYPE_INT32")])
        models["echo_torch_gpu"] = (ECHO_TORCH, "KIND_GPU", [("N", "TYPE_INT32")])
        models["echo_torch_cpu"] = (ECHO_TORCH, "KIND_CPU", [("N", "TYPE_INT32")])
    models["echo_extra"] = (ECHO_TORCH.replace("EXTRA = False", "EXTRA = True")
                            .replace('device="cuda"', 'device="cuda" if torch.cuda.is_available() else "cpu"'),
                            "KIND_CPU", [("N", "TYPE_INT32")])
    for name, (code, kind, inputs) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text("import serving_sys_path  # noqa: F401\n" + code)
        (root / name / "config.pbtxt").write_text(_config(name, kind, inputs))
    return sorted(models)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(grpc, url: str, model: str, inputs: dict, deadline: float) -> str:
    client = grpc.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    tensors = []
    for name, array in inputs.items():
        t = grpc.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    start, count = time.monotonic(), 0
    try:
        client.async_stream_infer(model, tensors, enable_empty_final_response=True)
        while True:
            try:
                result, error = got.get(timeout=max(0.01, deadline - (time.monotonic() - start)))
            except queue.Empty:
                return f"NO: {count} responses, then nothing for {deadline:.0f} s"
            if error is not None:
                return f"NO: error {error}"
            count += 1
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return f"ok: {count} responses in {time.monotonic() - start:.3f} s"
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, default=20.0)
    args = ap.parse_args()
    import tritonclient.grpc as grpc

    from trtllm_pipeline import machine
    from trtllm_pipeline.runtimes.torch_engine.backend import python_backend_dir
    from trtllm_pipeline.triton import stub_env

    binary = machine.tritonserver_binaries()["pytriton"]
    gpu = bool(machine.gpus())
    work = Path(tempfile.mkdtemp(prefix="bls-minimal-"))
    names = write_repo(work / "repo", gpu)
    env = dict(os.environ)
    stub = stub_env.ensure(stub_env.wheels_dir()) if stub_env.needed() else None
    if stub is not None:
        env["PATH"] = os.pathsep.join([str(stub.bin), env["PATH"]])
    python_backend_dir(binary, work, keep_first=stub.site_packages if stub else None)
    grpc_port = _free_port()
    cmd = [binary, f"--model-repository={work / 'repo'}", f"--backend-directory={work / 'backends'}",
           "--http-port=0", "--allow-http=false", "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
           "--allow-metrics=false", "--disable-auto-complete-config",
           *(["--log-verbose=1"] if os.environ.get("BLS_VERBOSE") else [])]
    log = open(work / "tritonserver.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"127.0.0.1:{grpc_port}"
    rows = []
    try:
        client = grpc.InferenceServerClient(url)
        for _ in range(120):
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"tritonserver exited: {(work / 'tritonserver.log').read_text()[-3000:]}")
            time.sleep(0.5)
        n = np.array([3], np.int32)
        for name in [m for m in names if m.startswith("echo")]:
            rows.append((f"{name} direct", ask(grpc, url, name, {"N": n}, args.deadline)))
            rows.append((f"bls -> {name}", ask(grpc, url, "bls", {"TARGET": np.array([name.encode()], dtype=object),
                                                                  "N": n}, args.deadline)))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"tritonserver {binary}, GPU: {gpu}, stub environment: {stub.site_packages if stub else 'none'}")
    for case, result in rows:
        print(f"  {case:24s} {result}")
    bad = [r for r in rows if not r[1].startswith("ok")]
    if bad:
        print((work / "tritonserver.log").read_text()[-4000:])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
