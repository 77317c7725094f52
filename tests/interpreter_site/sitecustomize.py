"""Put on PYTHONPATH by the tensor-parallel fast-path test: the worker processes a distributed runtime
starts run the kernels through Triton's interpreter too, so they need the same rounding fixes
(``triton_interpreter``) as the leader. Python imports this module at every start-up."""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton_interpreter  # noqa: F401  (tests/ is on the path too)
