"""TensorRT-LLM's glue: pre-flight, the ``trtllm-build`` command line, the engine runtime, and the
PyTorch-backend deployment (``pytorch_*``). Written against TensorRT-LLM 1.2.x's interfaces and checked
by contract tests; where TensorRT-LLM is absent each path says so and exits 3.
"""
