"""A stand-in for ``tensorrt_llm_bls`` on the engine model's direct socket (``triton/direct.py``), for
``served_host_probe --path direct``: in a process of its own (the BLS's stub is one: it must not take the engine's
GIL), it sends N streaming engine requests as the BLS does (``direct.open_stream``: its header, the engine inputs the
BLS makes from preprocessing's outputs) and reads each one's responses in a thread of its own, as the BLS's
``watched`` does (``direct.responses``: the frames read and decoded as ``_socket_item`` decodes them), to each
stream's final frame. It does not detokenize: the BLS's text is the BLS's CPU, not the engine's, and here the two
would share two cores.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid

import numpy as np

from trtllm_pipeline.triton import direct
from trtllm_pipeline.triton.contract import BLS_ID_PREFIX, BLS_PARAMETER

ENGINE_OUTPUTS = ["output_ids", "sequence_length", "generation_logits"]  # what the BLS asks the engine for


def engine_inputs(prompt: list[int], max_tokens: int) -> dict[str, np.ndarray]:
    """The engine request's tensors as the BLS sends them (preprocessing's outputs, the client's sampling inputs,
    ``exclude_input_in_output`` and ``streaming`` set by the BLS); no end id: every request runs its max_tokens."""
    return {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[-1]], dtype=np.int32),
        "pad_id": np.array([[0]], dtype=np.int32),
        "stop_words_list": np.array([[[0], [-1]]], dtype=np.int32),  # preprocessing's empty word lists
        "bad_words_list": np.array([[[0], [-1]]], dtype=np.int32),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "runtime_top_k": np.array([[0]], dtype=np.int32),
        "runtime_top_p": np.array([[0.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[True]]),
        "streaming": np.array([[True]]),
    }


def _read(sock, counts: list[int], index: int, errors: list[str]) -> None:
    frames = tokens = 0
    try:
        for header, arrays in direct.responses(sock):
            if "error" in header:
                errors.append(str(header["error"]))
                continue
            if "output_ids" in arrays:  # as the BLS's _socket_item, then its TextStream's input
                length = int(arrays["sequence_length"].reshape(-1)[0])
                tokens += len(arrays["output_ids"].reshape(-1)[:length].tolist())
                frames += 1
    except Exception as exc:  # the probe reports it
        errors.append(f"{type(exc).__name__}: {exc}")
    counts[2 * index], counts[2 * index + 1] = frames, tokens


def run(where: str, prompts: list[list[int]], max_tokens: int, results) -> None:
    """Open a stream per prompt at ``where``, read them all to their end; send the totals on ``results`` (a pipe)."""
    counts, errors, threads = [0] * (2 * len(prompts)), [], []
    start = time.process_time()
    for i, prompt in enumerate(prompts):
        header = {"request_id": f"{BLS_ID_PREFIX}{uuid.uuid4().hex}", "outputs": ENGINE_OUTPUTS,
                  "parameters": {BLS_PARAMETER: True}}
        sock = direct.open_stream(where, header, engine_inputs(prompt, max_tokens))
        if sock is None:
            errors.append(f"nothing listens at {where!r}")
            break
        thread = threading.Thread(target=_read, args=(sock, counts, i, errors), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    # frames: those that carried tokens
    results.send({"frames": sum(counts[0::2]), "tokens": sum(counts[1::2]), "cpu_s": time.process_time() - start,
                  "errors": errors[:5]})


def start(where: str, prompts: list[list[int]], max_tokens: int):
    """The reader in a new process (spawned: nothing of the engine's process carried over); returns it and the
    end of the pipe its totals come on."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=False)
    process = context.Process(target=run, args=(where, prompts, max_tokens, theirs), name="bls-reader", daemon=True)
    process.start()
    theirs.close()
    return process, ours
