"""Runtimes: the engines that execute a build, behind one interface (``base.Runtime``).

``tensorrt_llm``: TensorRT-LLM 1.2.x engines built by trtllm-build (NVIDIA GPUs, SM89+ for FP8).
``torch``: executes the exported TensorRT-LLM checkpoint itself in PyTorch, on CPU or CUDA; the
embedded default wherever TensorRT-LLM is not installed. Each is a backend (``backend.Backend``:
how it is built, served and loaded), registered in ``registry``; which one ran is always recorded.

This package's own names are ``base``'s, the interface; ``registry`` (which imports every
backend) is imported by name where a runtime is chosen or loaded.
"""

from trtllm_pipeline.runtimes.base import Completion, Runtime, SamplingParams, TextStream, TokenEvent

__all__ = ["Completion", "Runtime", "SamplingParams", "TextStream", "TokenEvent"]
