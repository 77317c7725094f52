"""Whether this process can run the fast path: Triton, and a CUDA device or Triton's interpreter."""

from __future__ import annotations

import importlib.util
import os


def interpreting() -> bool:
    """Triton's interpreter runs the kernels on the CPU (the CI tests use it; it is slow)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device_type: str = "cuda") -> tuple[bool, str]:
    """(usable, why not): the fast path needs a CUDA device (or the interpreter) and Triton."""
    import torch

    if importlib.util.find_spec("triton") is None:
        return False, "Triton is not installed"
    if device_type == "cuda" and torch.cuda.is_available() or interpreting():
        return True, ""
    return False, "no CUDA device"
