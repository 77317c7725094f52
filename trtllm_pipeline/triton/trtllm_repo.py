"""The TensorRT-LLM runtime's ``tensorrt_llm`` model: TensorRT-LLM's C++ backend (``tensorrtllm``) on the engine.

Every parameter this build decides is filled in; the tensor contract is ``contract.TRTLLM_INPUTS``
and ``TRTLLM_OUTPUTS``, with the model-dtype inputs set to the build's dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_pipeline.triton import model_config as mc
from trtllm_pipeline.triton.contract import TRTLLM_INPUTS, TRTLLM_OUTPUTS, dynamic_batching
from trtllm_pipeline.triton.model_config import tensor
from trtllm_pipeline.triton.repository import model_datatype

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

# The executor worker TensorRT-LLM's backend ships at this path in the NGC trtllm container.
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


def model_config(cfg: "BuildConfig", *, engine_dir: Path) -> dict[str, Any]:
    """TensorRT-LLM's C++ backend on the engine, with every parameter this build decides filled."""
    dtype = model_datatype(cfg)
    fill = {"encoder_input_features": dtype, "prompt_embedding_table": dtype}
    inputs = [tensor(name, kind or fill[name], dims, scalar="s" in flags, optional="o" in flags,
                     ragged="r" in flags) for name, kind, dims, flags in TRTLLM_INPUTS]
    return {
        "name": "tensorrt_llm", "backend": "tensorrtllm", "max_batch_size": cfg.serving.max_batch_size,
        "model_transaction_policy": {"decoupled": True},  # streaming needs it (tensorrtllm_backend#626)
        "dynamic_batching": dynamic_batching(cfg),
        "input": inputs,
        "output": [tensor(name, kind, dims) for name, kind, dims in TRTLLM_OUTPUTS],
        # The backend places the engine on the GPUs itself; Triton's instance is a CPU one.
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": mc.parameters({
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": engine_dir,
            "max_beam_width": cfg.build.max_beam_width,
            "batch_scheduler_policy": "guaranteed_no_evict",
            "kv_cache_free_gpu_mem_fraction": cfg.runtime.kv_cache_free_gpu_mem_fraction,
            "enable_kv_cache_reuse": cfg.runtime.enable_kv_cache_reuse,
            "exclude_input_in_output": cfg.serving.exclude_input_in_output,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "executor_worker_path": EXECUTOR_WORKER,
        }),
    }
