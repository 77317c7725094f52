"""trtllm-pipeline: a Hugging Face checkpoint to an FP8 TensorRT-LLM service on NVIDIA GPUs.

Every stage is a plain function (``quantize.quantize``, ``build.build``, ...) taking the one
``config.BuildConfig`` object; ``cli`` is a thin click layer over them. The layers, the
interfaces and where to add a backend, a task or a stage: docs/architecture.md.
"""

__version__ = "0.1.0"
