"""Whether this process can run the fast path (Triton, and a CUDA device or Triton's interpreter), and the decode
step's batch-size switches for kernels not yet on by default."""

from __future__ import annotations

import importlib.util
import os

from trtllm_pipeline.errors import InputError


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


def set_carveout(modules, percent: int) -> int:
    """The preferred shared-memory carveout (percent of the SM's maximum; -1: the driver's choice, by each
    kernel's needs) of every kernel compiled so far from the Triton functions of ``modules``. A property of
    the compiled function: later launches and CUDA-graph replays of it take it. Returns how many were set
    (none under Triton's interpreter, which compiles nothing)."""
    import ctypes

    import triton

    fns = {id(f): f for m in modules for f in vars(m).values() if isinstance(f, triton.runtime.jit.JITFunction)}
    kernels = [k for fn in fns.values() for cache in fn.device_caches.values() for k in cache[0].values()]
    if not kernels:
        return 0
    cuda = ctypes.CDLL("libcuda.so.1")
    preferred_carveout = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    for k in kernels:
        k._init_handles()
        err = cuda.cuFuncSetAttribute(ctypes.c_void_p(k.function), preferred_carveout, ctypes.c_int(percent))
        if err:
            raise RuntimeError(f"cuFuncSetAttribute(carveout={percent}) on {k.name}: CUDA error {err}")
    return len(kernels)


STAGED_ROWS_ENV = "TRTLLM_PIPELINE_WGMMA_STAGED_ROWS"
STAGED_PREFETCH_ENV = "TRTLLM_PIPELINE_WGMMA_PREFETCH"


def switch(env: str, default: bool, meaning: str) -> bool:
    """A 0/1 switch: ``$env`` 1 (``meaning``: what 1 does) or 0, unset ``default``; an InputError naming both values
    where it holds anything else."""
    value = os.environ.get(env, "").strip()
    if value not in ("0", "1", ""):
        raise InputError(f"{env}={value!r}: 1 {meaning}, 0 does not.", fix=f"set {env} to 0 or 1, or unset it")
    return value == "1" if value else default


def staged_prefetch(default: bool = False) -> bool:
    """Whether the 4-bit row kernels' staged form loads each K tile's input rows one tile ahead, in flight during the
    tile before (W4A8's also issues a tile's two MMA chains before one wait; INT4's always does), from
    ``$TRTLLM_PIPELINE_WGMMA_PREFETCH``; off by default until a GPU has timed it."""
    return switch(STAGED_PREFETCH_ENV, default, "loads the staged row kernels' input one K tile ahead")


def staged_rows(default: int = 16) -> int:
    """Up to how many rows the 4-bit wgmma row kernels stage their input in every program (``default``; beyond, the
    input is made once a launch): ``$TRTLLM_PIPELINE_WGMMA_STAGED_ROWS`` (0-16) for the A/B of the two forms."""
    value = os.environ.get(STAGED_ROWS_ENV, "").strip() or str(default)
    if not value.isdigit() or int(value) > default:
        raise InputError(f"{STAGED_ROWS_ENV}={value!r} is not a row count the wgmma row kernels stage.",
                         fix=f"set it to 0 (the input always made once) up to {default}, or unset it")
    return int(value)


def rows_switch(env: str, max_rows: int, kernel: str, m: int, lowest: int = 2, default: int = 0) -> bool:
    """Whether ``$env`` (a batch size N; 0: off; unset: ``default``) asks for ``kernel`` at decode batch ``m``
    (``lowest``..N); an InputError naming the range where it holds no such batch size."""
    value = os.environ.get(env, "").strip() or str(default)
    if not value.isdigit() or int(value) > max_rows:
        raise InputError(f"{env}={value!r} is not a batch size {kernel} takes.",
                         fix=f"set it to a batch size from 0 (off) to {max_rows}, or unset it")
    return lowest <= m <= int(value)
