"""Triton model repositories for a build: TensorRT-LLM's ``inflight_batcher_llm`` layout.

``repository`` writes the five models for either runtime; ``torch_repo`` holds what differs for the
torch runtime; ``python_models/`` holds the Python-backend model files Triton runs.
"""
