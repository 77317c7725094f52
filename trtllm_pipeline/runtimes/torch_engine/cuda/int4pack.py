"""INT4-AWQ through torch's own INT4 kernel (``torch._weight_int4pack_mm``, gpt-fast's "tinygemm"): a candidate
beside quant_gemm's kernels at decode sizes (issue 32), timed by ``benchmarks/quant_gemm.py`` before any step takes it.

What torch's CUDA kernel is (aten/src/ATen/native/cuda/int4mm.cu, pytorch 05f814fe): ``mma.sync`` m16n8k16 on BF16,
the weight's nibbles made BF16 in registers (the nibble minus 8, times its group's scale, plus its zero: one
``fma.bf16x2``), one block of 8 warps per 8 output columns and 16 input rows, the warps splitting K, the weight read
straight into registers by 16-byte loads (8 inner k tiles). Its inputs: BF16 ``x`` [M, K] contiguous, groups of 32 to
256, K a multiple of 16 x the inner k tiles, scales and zeros [K / group, N, 2]. Its weight layout is made once on the
device (``torch._convert_weight_to_int4pack``) from [N, K / 2] bytes holding the nibbles unsigned (value + 8), the
even K index in the high nibble.

ModelOpt's AWQ is symmetric: zero 0 and the scales eager multiplies by (``Linear.group_scales``, the compute dtype),
so the weight it multiplies is eager's dequantized copy's values exactly; the pre-quant scale multiplies the input
first, rounded to the compute dtype as ``quant_gemm.quantize_input`` does. Sums in float32, one BF16 rounding out.
The CPU has its own layout and op (``*_for_cpu``, the same arithmetic): tests check the bytes and scales there.

The decode step takes it for INT4-AWQ at batch 2..N only under ``$TRTLLM_PIPELINE_INT4PACK_ROWS=N`` (``enabled``;
off by default until a GPU has timed it): the step then holds each INT4 linear twice, its checkpoint layout (batch 1's
GEMV, prefill) and torch's (``of_quant``, made before any graph is captured).
"""

from __future__ import annotations

import dataclasses

import torch

from trtllm_pipeline.runtimes.torch_engine.cuda.support import rows_switch
from trtllm_pipeline.runtimes.torch_engine.model import unpack_int4_rows

INNER_K_TILES = 8  # 16-byte weight loads: K a multiple of 8 x 16
GROUPS = (32, 64, 128, 256)
ROWS_ENV = "TRTLLM_PIPELINE_INT4PACK_ROWS"
MAX_ROWS = 256


def enabled(m: int) -> bool:
    """Whether ``$TRTLLM_PIPELINE_INT4PACK_ROWS`` asks for torch's INT4 kernel at decode batch ``m`` (2..N)."""
    return rows_switch(ROWS_ENV, MAX_ROWS, "torch's INT4 kernel", m)


def supported(n: int, k: int, group: int) -> bool:
    """Where torch's kernel takes a linear's shape: a group size it was built for, K in whole load tiles, N in 8s."""
    return group in GROUPS and k % (16 * INNER_K_TILES) == 0 and k % group == 0 and n % 8 == 0


def nibble_bytes(values: torch.Tensor) -> torch.Tensor:
    """INT4 values [N, K] (-8..7) -> [N, K / 2] uint8 as ``torch._convert_weight_to_int4pack`` reads them: each
    value + 8, the even K index in the high nibble."""
    u = (values.to(torch.int16) + 8).to(torch.uint8)
    return (u[:, ::2] << 4) | u[:, 1::2]


def scales_and_zeros(scales: torch.Tensor) -> torch.Tensor:
    """Group scales [N, K / group] -> torch's [K / group, N, 2] (scale, zero 0) in the same dtype."""
    s = scales.t()
    return torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous()


@dataclasses.dataclass
class Packed:
    """One linear (or several side by side in N, sharing their input) in torch's INT4 layout."""

    weight: torch.Tensor  # int32, torch's tiled layout
    scales_zeros: torch.Tensor  # [K / group, N, 2], the compute dtype
    group: int
    n: int
    pre_quant_scale: torch.Tensor | None  # [K], the compute dtype


def pack(values: torch.Tensor, scales: torch.Tensor, group: int, pre_quant_scale: torch.Tensor | None = None
         ) -> Packed:
    """``values`` [N, K] int8 (-8..7) and ``scales`` [N, K / group] (the compute dtype) on the device -> ``Packed``;
    ValueError naming what torch's kernel does not take."""
    n, k = values.shape
    if not supported(n, k, group) or scales.dtype != torch.bfloat16:
        raise ValueError(f"int4pack: torch's INT4 kernel takes BF16 scales, groups {GROUPS}, K a multiple of "
                         f"{16 * INNER_K_TILES} and N of 8; got N {n} K {k} group {group} {scales.dtype}")
    u8 = nibble_bytes(values)
    if values.device.type == "cuda":
        weight = torch.ops.aten._convert_weight_to_int4pack(u8.contiguous(), INNER_K_TILES)
    else:  # the CPU's layout (its op unpacks the same values: tests)
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu((values.to(torch.int32) + 8).contiguous(),
                                                                     INNER_K_TILES)
    return Packed(weight, scales_and_zeros(scales), group, n, pre_quant_scale)


def linear(x: torch.Tensor, p: Packed) -> torch.Tensor:
    """``x`` [M, K] (BF16) times the packed weight: [M, N] in BF16."""
    if p.pre_quant_scale is not None:
        x = x * p.pre_quant_scale
    x = x.contiguous()
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, p.weight, p.group, p.scales_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, p.weight, p.group, p.scales_zeros)


def of_quant(*qs) -> Packed:
    """INT4-AWQ ``quant_linear.QuantWeight``s sharing one input (the GLU's fc and gate: side by side in N, fc first)
    in torch's layout: their nibbles and the compute-dtype group scales their kernels multiply by."""
    pqs = qs[0].pqs
    if any(q.fmt != "int4_awq" for q in qs) or any(
            (q.pqs is None) != (pqs is None) or q.pqs is not None and not torch.equal(q.pqs, pqs) for q in qs):
        raise ValueError("int4pack: INT4-AWQ layers with one pre-quant scale only")
    values = torch.cat([unpack_int4_rows(q.weight) for q in qs])
    # QuantWeight's scales: float32 [groups, 2, N / 2], [g, j, r] row 2r + j's: the compute dtype's values
    scales = torch.cat([q.scales.permute(2, 1, 0).reshape(q.n, -1) for q in qs]).to(torch.bfloat16)
    return pack(values, scales, qs[0].group, pqs)


def of_inputs(*qs) -> list[Packed]:
    """Layers that share an input (the GLU's fc and gate) in torch's layout: side by side in one ``Packed`` where
    their pre-quant scales agree (one call), else one each (one call each, fc first)."""
    try:
        return [of_quant(*qs)]
    except ValueError:  # pre-quant scales of their own
        return [of_quant(q) for q in qs]


def fc_gate(x: torch.Tensor, packs: list[Packed], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GLU's two outputs [M, n] from ``of_inputs``' packs: one call's halves, or two calls'."""
    ys = [linear(x, p) for p in packs]
    return (ys[0][:, :n], ys[0][:, n:]) if len(ys) == 1 else (ys[0], ys[1])
