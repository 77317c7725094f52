"""Triton model repositories for a build: TensorRT-LLM's ``inflight_batcher_llm`` layout.

``contract`` states TensorRT-LLM's tensor contract; ``repository`` writes the models every runtime
shares and the ``tensorrt_llm`` model a backend supplies (``trtllm_repo`` for TensorRT-LLM's C++
backend, ``torch_repo`` for the torch runtime); ``python_models/`` holds the Python-backend model
files Triton runs, ``tensors`` and ``torch_server`` the code they run.
"""
