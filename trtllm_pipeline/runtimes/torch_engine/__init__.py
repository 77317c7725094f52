"""The torch engine: runs the exported TensorRT-LLM checkpoint in PyTorch, on CPU or CUDA.

``backend`` (how it is built, served and loaded), ``runtime`` (the scheduler and sampling behind
``Runtime``), ``executor`` (what runs the model: this process, or the tensor-parallel group in
``tp/``), ``model`` (the eager model, the numerical reference), ``sampling``, and ``cuda/`` (the fast
decode path's kernels and graphs).
"""
