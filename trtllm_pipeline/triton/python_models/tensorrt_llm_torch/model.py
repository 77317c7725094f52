"""Triton ``tensorrt_llm`` for the torch runtime: a decoupled model over ``TorchModelServer``.

It loads the build's engine with the runtime its build manifest names, from the build config
that deploy wrote beside this model, and serves TensorRT-LLM's tensor contract.
"""

try:  # the serving process's module path, before any package import (runtimes/torch_engine/backend.py)
    import serving_sys_path  # noqa: F401
except ImportError:  # a server this project did not start (TensorRT-LLM's container)
    pass

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from trtllm_pipeline.console import setup_logging
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.triton import direct, health, stops, torch_repo
from trtllm_pipeline.triton.tensors import string_parameters
from trtllm_pipeline.triton.torch_server import TorchModelServer


class TritonPythonModel:
    def initialize(self, args):
        # the runtime's progress (KV pool, each batch bucket compiled and captured) into the server's log: a slow
        # start says where its time goes
        setup_logging(0)
        params = string_parameters(json.loads(args["model_config"]))
        repository = Path(args["model_repository"]).parent
        cfg = torch_repo.read_build_config(Path(args["model_repository"]))
        # A GPU instance group: the GPU Triton gave this instance (the runtime compiles and captures its decode
        # graphs here, before Triton reports the model ready).
        device = {"device": f"cuda:{args['model_instance_device_id']}"} if args.get("model_instance_kind") == "GPU" else {}
        health.clear(repository, stubs=False)  # (the other models, loading beside it, have recorded theirs)
        self.server = TorchModelServer(load_runtime(cfg, params["engines_dir"], **device), pb_utils,
                                       exclude_input_in_output=params["exclude_input_in_output"] == "true",
                                       stop_address=stops.address(repository), repository=str(repository),
                                       direct_address=direct.address(repository),
                                       model_name=cfg.name)
        health.mark_alive(repository)  # a crash of this process then shows as the engine lost (health.lost)

    def execute(self, requests):
        for request in requests:
            self.server.enqueue(request)
        return None

    def finalize(self):
        self.server.close()
