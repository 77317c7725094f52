"""Which way a tp>1 checkpoint runs: ``merged`` (one process, shards reassembled) or ``distributed``.

``runtime.tp_mode: auto`` is distributed where every rank has a device of its own: on CPU always
(gloo; the ranks share the cores, so it is a correctness path there, not a speed-up), on CUDA when
torch sees at least tp GPUs (rank i on ``cuda:i``); else merged, with a notice saying why. A tp=1
checkpoint runs in this process (``merged`` and ``distributed`` are the same math there);
``distributed`` asks for the distributed code path anyway, a group of one rank (on CUDA: NCCL with
world size 1), so that every piece of it runs on a one-GPU machine.
"""

from __future__ import annotations

import torch

from trtllm_pipeline.config import TP_MODES
from trtllm_pipeline.errors import UnavailableError


def resolve_tp_mode(requested: str | None, tp: int, device: torch.device) -> tuple[str, str | None]:
    """(``merged`` | ``distributed``, a notice for the user or None)."""
    requested = requested or "auto"
    if requested not in TP_MODES:
        raise ValueError(f"tp_mode {requested!r} is not one of {TP_MODES}")
    if requested == "merged" or (tp == 1 and requested == "auto"):
        return "merged", None
    if tp == 1 or device.type != "cuda":
        return "distributed", None
    gpus = torch.cuda.device_count()
    if gpus >= tp:
        return "distributed", None
    if requested == "distributed":
        raise UnavailableError(f"runtime.tp_mode distributed runs one GPU per rank: this tp={tp} checkpoint needs {tp} "
                               f"GPUs and torch sees {gpus}.",
                               fix="use runtime.tp_mode merged (or auto) to run the shards merged on one GPU, or "
                                   "runtime.device cpu")
    return "merged", (f"tensor parallel: the checkpoint has tp={tp} but torch sees {gpus} GPU(s); running the "
                      f"{tp} shards merged on one device (runtime.tp_mode auto; distributed needs {tp} GPUs)")
