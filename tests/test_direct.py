"""The BLS's socket to the torch engine model (triton/direct.py): frames, one connection a request, ends early."""

from __future__ import annotations

import io
import socket
import threading
import uuid

import numpy as np
import pytest

from trtllm_pipeline.triton import direct


def _where() -> str:
    return f"\0trtllm-pipeline-test-{uuid.uuid4().hex}"


def test_a_frame_carries_numbers_flags_and_strings_exactly():
    arrays = {"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "streaming": np.array([[True]]),
              "temperature": np.array([[0.5]], dtype=np.float32), "seed": np.array([[2**63]], dtype=np.uint64),
              "logits": np.arange(12, dtype=np.float32).reshape(1, 1, 1, 12),
              "output_text": np.array([["é piece".encode()]], dtype=object)}
    header, back = direct.read_frame(io.BytesIO(direct.encode({"request_id": "bls-1", "flags": 1}, arrays)))
    assert header["request_id"] == "bls-1" and header["flags"] == 1
    assert set(back) == set(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        assert (back[name] == value).all()
    assert back["output_text"][0, 0].decode() == "é piece"


@pytest.mark.parametrize("cut", [2, 7, -3])
def test_a_frame_cut_short_is_a_protocol_error_and_an_empty_stream_is_the_end(cut):
    frame = direct.encode({}, {"ids": np.arange(4, dtype=np.int64)})
    with pytest.raises(direct.ProtocolError):
        direct.read_frame(io.BytesIO(frame[:cut]))
    assert direct.read_frame(io.BytesIO(b"")) is None


def test_a_frame_naming_its_dtypes_by_name_reads_as_one_naming_them_by_code():
    """Frames name dtypes by numpy's code ('<i4': the name costs ~4 us an array); an earlier engine's frames named
    them ('int32'), and read the same."""
    frame = direct.encode({"flags": 0}, {"output_ids": np.array([[[7]]], dtype=np.int32)})
    head = direct.json.dumps({"flags": 0, "arrays": [["output_ids", "int32", [1, 1, 1]]]}).encode()
    by_name = direct._LENGTH.pack(len(head)) + head + np.array([7], dtype=np.int32).tobytes()
    for data in (frame, by_name):
        _, arrays = direct.read_frame(io.BytesIO(data))
        assert arrays["output_ids"].dtype == np.int32 and arrays["output_ids"].tolist() == [[[7]]]


def test_a_tokens_response_is_the_frame_encode_makes_of_its_arrays():
    """direct.Tokens (a streaming row's token ids, its frame made without numpy or JSON) writes the bytes a Response
    of the same arrays does, for every subset of its two outputs, and reads back as them."""
    for ids in ([5], [1, 2, 3], [], [2**31 - 1]):
        for flags in (0, direct.FINAL):
            for has_ids, has_length in ((True, True), (True, False), (False, True), (False, False)):
                tokens = direct.Tokens(ids, has_ids, has_length)
                frame = tokens.frame(flags)
                assert frame == direct.Response(tokens.outputs).frame(flags)
                header, arrays = direct.read_frame(io.BytesIO(frame))
                assert header["flags"] == flags and set(arrays) == set(tokens.outputs)
                if has_ids:
                    assert arrays["output_ids"].dtype == np.int32 and arrays["output_ids"].tolist() == [[ids]]
                if has_length:
                    assert arrays["sequence_length"].tolist() == [[len(ids)]]


def test_frames_fed_in_any_chunks_come_out_whole_in_order_and_once():
    """FrameBuffer (the BLS's request thread reading its engine stream): several frames in one read come out
    together; a frame cut anywhere waits for its rest; what comes out equals read_frame's."""
    frames = [direct.Tokens([5]).frame(0), direct.Tokens([6, 7]).frame(0),
              direct.Response({"output_text": np.array([["é".encode()]], dtype=object)}).frame(0),
              direct.Response(error="engine lost", code="UNAVAILABLE").frame(direct.FINAL)]
    data = b"".join(frames)
    want = [direct.read_frame(io.BytesIO(f)) for f in frames]

    def same(got):
        assert [h for h, _ in got] == [h for h, _ in want]
        for (_, a), (_, b) in zip(got, want):
            assert set(a) == set(b) and all(a[k].dtype == b[k].dtype and (a[k] == b[k]).all() for k in a)

    buffer = direct.FrameBuffer()
    buffer.feed(data)
    same(buffer.take())
    assert buffer.take() == [] and not buffer.data
    for size in (1, 3, 7, 50):  # chunks cutting lengths, headers and arrays at every place
        buffer, got = direct.FrameBuffer(), []
        for at in range(0, len(data), size):
            buffer.feed(data[at: at + size])
            got += buffer.take()
        same(got)
        assert not buffer.data
    bad = direct.FrameBuffer()
    head = direct.json.dumps({"arrays": [["x", "complex128", [1]]]}).encode()
    bad.feed(direct._LENGTH.pack(len(head)) + head)
    with pytest.raises(direct.ProtocolError):
        bad.take()


def test_a_frame_naming_an_unknown_dtype_or_a_huge_array_is_refused():
    for arrays in ([["x", "complex128", [1]]], [["x", "float32", [1 << 40]]], [["x", "int8", [-2, -2]]],
                   [["x", ["int8"], [1]]]):
        head = direct.json.dumps({"arrays": arrays}).encode()
        with pytest.raises(direct.ProtocolError):
            direct.read_frame(io.BytesIO(direct._LENGTH.pack(len(head)) + head))


def test_a_request_and_its_responses_travel_on_one_connection_to_the_final_one():
    where, seen = _where(), []

    def on_request(request: direct.Request, sender: direct.Sender) -> None:
        seen.append((request.request_id(), request.requested_output_names(), request.input("input_ids").tolist(),
                     request.parameters()))
        for token in (7, 8):
            sender.send(direct.Response({"output_ids": np.array([[token]], dtype=np.int32)}))
        sender.send(None, direct.FINAL)

    listener = direct.Listener(where, on_request)
    try:
        sock = direct.open_stream(where, {"request_id": "bls-x", "outputs": ["output_ids"], "parameters": {"p": 1}},
                                  {"input_ids": np.array([[4, 5]], dtype=np.int32)})
        frames = list(direct.responses(sock))
    finally:
        listener.close()
    assert seen == [("bls-x", ["output_ids"], [[4, 5]], '{"p": 1}')]
    assert [f[1]["output_ids"].item() for f in frames[:2]] == [7, 8]
    assert frames[-1][0]["flags"] == direct.FINAL and frames[-1][1] == {}


def test_an_error_response_names_its_code_and_ends_the_stream():
    where = _where()

    def on_request(request, sender):
        sender.send(direct.Response(error="max_tokens must be at least 1", code="INVALID_ARG"), direct.FINAL)

    listener = direct.Listener(where, on_request)
    try:
        (header, _), = list(direct.responses(direct.open_stream(where, {}, {})))
    finally:
        listener.close()
    assert header["error"] == "max_tokens must be at least 1" and header["code"] == "INVALID_ARG"


def test_nothing_listening_is_none_and_a_connection_closed_early_is_a_connection_error():
    assert direct.open_stream(_where(), {}, {}) is None
    where, held = _where(), []
    listener = direct.Listener(where, lambda request, sender: held.append(sender))
    try:
        sock = direct.open_stream(where, {}, {})
        stream = direct.responses(sock)
        for _ in range(100):
            if held:
                break
            threading.Event().wait(0.02)
        held[0].conn.close()  # the engine's end goes away without a final response
        with pytest.raises(ConnectionError):
            list(stream)
    finally:
        listener.close()


def test_the_engine_hears_a_closed_connection_at_its_next_write():
    where, held, ready = _where(), [], threading.Event()

    def on_request(request, sender):
        held.append(sender)
        ready.set()

    listener = direct.Listener(where, on_request)
    try:
        sock = direct.open_stream(where, {}, {})
        assert ready.wait(5)
        sock.close()  # the BLS's client went away
        with pytest.raises(OSError):
            for _ in range(50):  # the first write may still land in the socket's buffer
                held[0].send(direct.Response({"output_ids": np.zeros((1, 1), np.int32)}))
                threading.Event().wait(0.01)
    finally:
        listener.close()


def test_the_address_is_the_repositorys_and_abstract(tmp_path):
    a, b = direct.address(tmp_path / "a"), direct.address(tmp_path / "b")
    assert a.startswith("\0") and a != b and a == direct.address(tmp_path / "a")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.bind(a)  # abstract: no file appears in the repository
    probe.close()
    assert not list(tmp_path.iterdir())
