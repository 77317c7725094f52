"""The BLS's requests to an engine model with no socket of its own (TensorRT-LLM's), as gRPC streams to its own server.

Where the engine model has no socket (``triton/direct.py``), the BLS used to read its engine's responses through the
Python backend's BLS (``exec(decoupled=True)``), and Triton 2.51's stub has two defects there, both in the response
iterators that call returns: one frees an iterator without the GIL (the heap corruption the BLS's ``LINGER_S`` works
around), the other is a lock cycle between a thread whose ``exec()`` returned, the stub's response thread and a thread
reading another request's responses, which hangs the stub for good (docs/serving.md, "deadlock"). Neither can be
avoided from Python. So the BLS asks its own server over gRPC instead (``ModelStreamInfer`` on the server's gRPC
endpoint, which ``serve`` names in the server's environment: ``ADDRESS_ENV``): the request and its responses travel as
any client's, gRPC's own threads carry them, and nothing of the stub's BLS machinery runs. One channel a process, one
stream a request. ``TRTLLM_PIPELINE_BLS_LOOPBACK=0``, a server that names no address, or a stub environment without
``grpcio`` and ``tritonclient`` keep ``exec()``.

``stream`` yields what ``direct.FrameBuffer`` gives for the torch engine's socket: (header, arrays) per response, the
header ``{"flags": FINAL}`` on the last, ``{"error": ..., "code": ...}`` on an error; so the BLS reads both alike.
"""

from __future__ import annotations

import os
import threading
from typing import Iterator, Sequence

import numpy as np

from trtllm_pipeline.triton import direct

ADDRESS_ENV = "TRTLLM_PIPELINE_TRITON_GRPC"  # host:port of the server's own gRPC endpoint (serve sets it)
SWITCH_ENV = "TRTLLM_PIPELINE_BLS_LOOPBACK"
FINAL_PARAMETER = "triton_final_response"


class Loopback:
    """gRPC streams to the server at ``address`` (one channel, shared by the process's threads)."""

    def __init__(self, address: str):
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.address = address
        # no message size cap: an engine response with generation logits is vocab x 4 bytes a token
        self._channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                                ("grpc.max_send_message_length", -1)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def stream(self, model: str, outputs: list[str], tensors: dict[str, np.ndarray], request_id: str,
               parameters: dict[str, bool]) -> Iterator[tuple[dict, dict[str, np.ndarray]]]:
        """The responses to one request of ``model`` (``tensors`` its inputs by name) as (header, arrays). The request
        is on its way when this returns (gRPC's thread sends it); the responses are read in the caller's thread, and
        closing the iterator early cancels the call (the server then cancels the request)."""
        done = threading.Event()

        def requests():  # one request, the stream kept open until its last response: a half-close could end it early
            yield stream_request(model, tensors, request_id, outputs, parameters)
            done.wait()

        return self._responses(self._stub.ModelStreamInfer(requests()), outputs, done)

    def _responses(self, call, outputs: list[str], done: threading.Event):
        from tritonclient.grpc import InferResult

        try:
            for response in call:
                if response.error_message:
                    yield {"error": response.error_message, "code": "INTERNAL", "flags": direct.FINAL}, {}
                    return
                result = InferResult(response.infer_response)
                arrays = {name: array for name in outputs if (array := result.as_numpy(name)) is not None}
                final = response.infer_response.parameters.get(FINAL_PARAMETER)
                last = final is not None and final.bool_param
                yield ({"flags": direct.FINAL} if last else {}), arrays
                if last:
                    return
            raise ConnectionError(f"the gRPC stream to {self.address} ended before the request's last response")
        finally:
            done.set()
            call.cancel()  # (after the last response: nothing left to cancel)

    def close(self) -> None:
        self._channel.close()


def stream_request(model: str, tensors: dict[str, np.ndarray], request_id: str = "", outputs: Sequence[str] = (),
                   parameters: dict[str, bool] | None = None):
    """``tensors`` (input arrays by name; strings as object arrays of bytes) as the protobuf request of a gRPC stream
    (``ModelStreamInfer``), asking for Triton's empty final response (a decoupled model may end a request by a flag
    alone): the loopback's, and ``client.stream_request``'s for a caller on ``grpc.aio``."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype), shape=list(array.shape))
        request.raw_input_contents.append(serialize_byte_tensor(array).item() if array.dtype == object
                                          else array.tobytes())  # the contents: raw, in the inputs' order
    for name in outputs:
        request.outputs.add(name=name)
    for key, value in (parameters or {}).items():
        request.parameters[key].bool_param = value
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def connect() -> tuple[Loopback | None, str]:
    """The process's loopback to its server, or None and why not (the BLS then uses ``exec()``)."""
    if os.environ.get(SWITCH_ENV, "1").strip() == "0":
        return None, f"{SWITCH_ENV}=0"
    address = os.environ.get(ADDRESS_ENV, "").strip()
    if not address:
        return None, f"the server names no gRPC endpoint of its own (${ADDRESS_ENV})"
    try:
        return Loopback(address), f"gRPC to {address}"
    except ImportError as exc:
        return None, f"grpcio and tritonclient are not importable here ({exc})"
