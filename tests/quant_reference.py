"""ModelOpt's fake-quantized model of a config: the reference the exported checkpoints and the runtime are checked against.

The model is calibrated with the quantize stage's own code and then exported to TensorRT-LLM like the
stage does (the export re-smooths fused layers in place: q/k/v and gate/up share one AWQ pre-quant
scale afterwards), so its fake-quantized weights are the ones the checkpoint stores. ModelOpt 0.47's
NVFP4 fake quantization runs only on CUDA (``dynamic_block_quantize_op`` asserts a CUDA amax); on a CPU
its NVFP4 quantizers are given a backend that quantizes and dequantizes with ModelOpt's own
``NVFP4QTensor`` (the exporter's code: per-block E4M3 scales of the block amax / 6 in units of the
global scale amax / (6 * 448), values rounded to E2M1).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from trtllm_pipeline import quantize
from trtllm_pipeline.model.source import resolve_model

CPU_NVFP4 = "trtllm-pipeline-cpu-nvfp4"


def _cpu_nvfp4(inputs: torch.Tensor, quantizer) -> torch.Tensor:
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    global_scale = quantizer.amax.float().reshape(()) / (6.0 * 448.0)
    flat = inputs.reshape(-1, inputs.shape[-1])
    q, block_scale, _ = NVFP4QTensor.quantize(flat.float(), 16, weights_scaling_factor_2=global_scale)
    out = q.dequantize(dtype=torch.float32, scale=block_scale, double_scale=global_scale, block_sizes={-1: 16})
    return out.reshape(inputs.shape).to(inputs.dtype)


def use_cpu_nvfp4(model) -> None:
    from modelopt.torch.quantization.nn.modules.tensor_quantizer import register_quant_backend

    register_quant_backend(CPU_NVFP4, _cpu_nvfp4)
    for _, module in model.named_modules():
        if getattr(module, "is_enabled", False) and getattr(module, "num_bits", None) == (2, 1):
            module.backend = CPU_NVFP4


def fake_quantized_model(cfg, dtype: str = "float32"):
    """(model, tp=1 export dir): ModelOpt's calibrated, exported, fake-quantized model of ``cfg``.

    Calibrated in the dtype the quantize stage calibrates in here (float32 on a CPU) and exported in the config's,
    as the stage does (the export is the stage's tp=1 checkpoint, bit for bit), then run in ``dtype``: float32
    isolates the formats' math.
    """
    model_dir = resolve_model(cfg.model).model_dir
    model, tokenizer = quantize._load(model_dir, quantize.calibration_dtype(cfg), "cpu")
    model = quantize._calibrate(cfg, model, tokenizer, "cpu")
    out = Path(tempfile.mkdtemp(prefix="fake-quant-export-"))
    single = cfg.model_copy(update={"parallelism": cfg.parallelism.model_copy(update={"tp": 1})})
    single._name, single._path = cfg.name, cfg.path
    quantize._export_trtllm(single, model, resolve_model(cfg.model), out)
    # The checkpoint stores pre-quant scales in its dtype: the reference carries the stored values.
    checkpoint_dtype = getattr(torch, cfg.dtype)
    with torch.no_grad():
        for _, module in model.named_modules():
            pqs = getattr(module, "_pre_quant_scale", None)
            if isinstance(pqs, torch.Tensor):
                pqs.copy_(pqs.to(checkpoint_dtype).to(pqs.dtype))
    model = model.to(getattr(torch, dtype))
    if cfg.quantization.format == "nvfp4":
        use_cpu_nvfp4(model)
    return model.eval(), out


def fake_quantized_weight(module) -> torch.Tensor:
    """What the module's forward multiplies with: its weight through its weight quantizer, float32."""
    with torch.no_grad():
        return module.weight_quantizer(module.weight).float()


HF_TO_TRTLLM_LINEARS = {"self_attn.o_proj": "attention.dense", "mlp.gate_proj": "mlp.fc", "mlp.up_proj": "mlp.gate",
                        "mlp.down_proj": "mlp.proj"}


def carry_exported_weights(model, export_dir: Path) -> None:
    """Give the reference the exported checkpoint's weights, de-quantized, with its weight quantizers off.

    ModelOpt's exporter rounds ``w / scale`` where its fake quantizer rounds ``w * (1 / scale)``: on exact
    ties (a few in ten thousand bf16 weights) they pick neighbouring steps. The checkpoint is what runs,
    so the reference carries it (as the FP8 test gives its reference the exported FP8 weights); the
    weights themselves are checked against the fake quantizer in test_formats, ties counted.
    """
    from trtllm_pipeline import checkpoint
    from trtllm_pipeline.runtimes.torch_engine.model import Linear

    config, tensors = checkpoint.load_checkpoint(export_dir)
    layout = checkpoint.CheckpointLayout(config)
    fmt = checkpoint.FORMAT_NAMES[layout.quant_algo]
    q_rows, kv_rows = layout.heads * layout.head_size, layout.kv_heads * layout.head_size
    rows = {"q_proj": slice(0, q_rows), "k_proj": slice(q_rows, q_rows + kv_rows),
            "v_proj": slice(q_rows + kv_rows, q_rows + 2 * kv_rows)}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            targets = {f"self_attn.{x}": ("attention.qkv", rows[x]) for x in rows}
            targets.update({src: (trt, slice(None)) for src, trt in HF_TO_TRTLLM_LINEARS.items()})
            for src, (trt, sl) in targets.items():
                module = layer.get_submodule(src)
                weight = Linear(tensors, f"transformer.layers.{i}.{trt}", torch.float32, torch.device("cpu"), fmt,
                                layout.group_size).dequantized[sl]
                module.weight.copy_(weight.to(module.weight.dtype))
                module.weight_quantizer.disable()
