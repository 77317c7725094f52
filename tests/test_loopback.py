"""triton/loopback.connect: where the BLS's gRPC stream to its own server can be had, and why not where it cannot (the
BLS then keeps exec(); its streams themselves run in test_engine_crash, both ways, against a real server)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import free_ports

from trtllm_pipeline.triton import loopback


def test_connect_needs_the_servers_address_and_can_be_switched_off(monkeypatch):
    monkeypatch.delenv(loopback.ADDRESS_ENV, raising=False)
    monkeypatch.delenv(loopback.SWITCH_ENV, raising=False)
    found, why = loopback.connect()
    assert found is None and loopback.ADDRESS_ENV in why
    monkeypatch.setenv(loopback.ADDRESS_ENV, "127.0.0.1:1")  # nothing listens: a channel connects on first use only
    found, why = loopback.connect()
    assert isinstance(found, loopback.Loopback) and why == "gRPC to 127.0.0.1:1"
    found.close()
    monkeypatch.setenv(loopback.SWITCH_ENV, "0")
    assert loopback.connect() == (None, f"{loopback.SWITCH_ENV}=0")


def test_a_stream_to_a_server_that_is_gone_fails_instead_of_waiting():
    (port,) = free_ports(1)
    lb = loopback.Loopback(f"127.0.0.1:{port}")
    try:
        with pytest.raises(grpc.RpcError):
            list(lb.stream("tensorrt_llm", ["output_ids"], {"input_ids": np.zeros((1, 1), np.int32)}, "r1", {}))
    finally:
        lb.close()
