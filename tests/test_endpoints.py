"""endpoints: how each address is spelled where it is bound (tritonserver's flags) and where it is dialled (URLs,
gRPC targets). The served checks are tests/test_serve.py's (a real server on ::1)."""

from __future__ import annotations

from trtllm_pipeline.endpoints import client_host, host_port, openai_base_url, triton_endpoint_flags


def test_an_ipv6_literal_is_bracketed_where_dialled_and_spelled_per_endpoint_where_bound():
    assert host_port("127.0.0.1", 8001) == "127.0.0.1:8001"
    assert host_port("gpu-3.example.org", 80) == "gpu-3.example.org:80"
    assert host_port("::1", 8001) == "[::1]:8001" and openai_base_url("::1", 8003) == "http://[::1]:8003/v1"
    flags = triton_endpoint_flags(http_host="127.0.0.1", http_port=1, host="::1", grpc_port=2, metrics_port=3)
    # gRPC: brackets (bare, "::1:2" is unresolvable); HTTP and metrics (libevhtp): "ipv6:" (bare: 255.255.255.255)
    assert flags == ["--http-address=127.0.0.1", "--http-port=1", "--grpc-address=[::1]", "--grpc-port=2",
                     "--metrics-address=ipv6:::1", "--metrics-port=3"]
    every = triton_endpoint_flags(http_host="0.0.0.0", http_port=1, host="0.0.0.0", grpc_port=2, metrics_port=3)
    assert every[::2] == ["--http-address=0.0.0.0", "--grpc-address=0.0.0.0", "--metrics-address=0.0.0.0"]


def test_a_wildcard_is_dialled_at_its_loopback():
    # "::": evhtp's endpoints bound there take IPv6 clients only, so the project's own clients go to ::1
    assert [client_host(h) for h in ("0.0.0.0", "", "::", "::1", "10.0.0.5")] == [
        "127.0.0.1", "127.0.0.1", "::1", "::1", "10.0.0.5"]
