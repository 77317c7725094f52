"""cuda/int4pack.py: INT4-AWQ layers in torch's own INT4 kernel's terms (``torch._weight_int4pack_mm``). The CUDA op
cannot run here; its CPU twin (``*_for_cpu``: the same arithmetic, its own tiled layout) multiplies what ``pack``
makes, and the bytes the CUDA layout is made from are checked against int4mm.cu's reading of them."""

import pytest
import torch

from trtllm_pipeline.runtimes.torch_engine.cuda import int4pack
from trtllm_pipeline.runtimes.torch_engine.model import Linear, unpack_int4_rows


def test_nibble_bytes_hold_each_value_plus_8_with_the_even_k_index_high():
    # int4mm.cu's matrix_to_m16n8k16_Bint4_layout puts byte v's high nibble first (int32 v[0]) and its low second
    values = torch.tensor([[-8, 7, 0, 1], [3, -1, -8, -8]], dtype=torch.int8)
    assert int4pack.nibble_bytes(values).tolist() == [[0x0F, 0x89], [0xB7, 0x00]]


def test_scales_and_zeros_are_per_group_then_per_column_with_zero_points_of_zero():
    scales = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2)  # [N 3, groups 2]
    sz = int4pack.scales_and_zeros(scales)
    assert sz.shape == (2, 3, 2) and sz[..., 1].eq(0).all()
    assert sz[..., 0].tolist() == scales.t().tolist()


def _awq_linear(n: int, k: int, group: int, seed: int = 0) -> Linear:
    """An INT4-AWQ layer as the checkpoint holds it: row pairs in nibbles, per-group scales, a pre-quant scale."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int16)
    low, high = values[0::2] & 0xF, values[1::2] & 0xF
    tensors = {"p.weight": (low | (high << 4)).to(torch.uint8).view(torch.int8),
               "p.weights_scaling_factor": torch.rand(n, k // group, generator=gen) * 0.02 + 0.01,
               "p.prequant_scaling_factor": (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16)}
    return Linear(tensors, "p", torch.bfloat16, torch.device("cpu"), "int4_awq", group)


def test_packed_layer_multiplies_eagers_dequantized_weight():
    lin = _awq_linear(48, 256, 128)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    packed = int4pack.pack(unpack_int4_rows(lin.weight), lin.group_scales(), 128, lin.pre_quant_scale)
    y = int4pack.linear(x, packed)
    want = lin.quantize_input(x).float() @ lin._dequantize().t()  # float32 sums of eager's values
    assert y.shape == (5, 48) and y.dtype == torch.bfloat16
    assert float((y.float() - want).norm() / want.norm()) < 4e-3  # one BF16 rounding of the output
    assert torch.equal(y.float().argmax(1), want.argmax(1))


def test_shapes_torchs_kernel_does_not_take_are_refused_naming_its_limits():
    assert int4pack.supported(3584, 18944, 128)
    assert not int4pack.supported(3584, 576, 64)  # SmolLM2's K: not in 128-wide load tiles
    assert not int4pack.supported(3584, 3584, 8)  # the tiny test model's groups of 8
    with pytest.raises(ValueError, match="groups .* K a multiple of 128"):
        int4pack.pack(torch.zeros(8, 64, dtype=torch.int8), torch.ones(8, 1, dtype=torch.bfloat16), 64)
    with pytest.raises(ValueError, match="BF16 scales"):
        int4pack.pack(torch.zeros(8, 128, dtype=torch.int8), torch.ones(8, 1, dtype=torch.float16), 128)


def test_quant_weights_pack_as_their_layers_do_and_the_glus_pair_side_by_side():
    """``of_quant`` from the kernels' view of a layer (scales re-laid [groups, 2, N / 2]) multiplies as ``pack`` from
    the layer's own nibbles and scales; fc and gate: one call, fc's columns first."""
    fc, gate = _awq_linear(48, 256, 128, seed=2), _awq_linear(48, 256, 128, seed=3)
    gate.pre_quant_scale = fc.pre_quant_scale  # one input: the fused GLU's layers share it
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    one = int4pack.linear(x, int4pack.of_quant(fc.kernel_weight()))
    assert torch.equal(one, int4pack.linear(x, int4pack.pack(unpack_int4_rows(fc.weight), fc.group_scales(), 128,
                                                             fc.pre_quant_scale)))
    both = int4pack.linear(x, int4pack.of_quant(fc.kernel_weight(), gate.kernel_weight()))
    assert torch.equal(both[:, :48], one)
    assert torch.equal(both[:, 48:], int4pack.linear(x, int4pack.of_quant(gate.kernel_weight())))
    other = _awq_linear(48, 256, 128, seed=5)  # its own pre-quant scale: not one input
    with pytest.raises(ValueError, match="one pre-quant scale"):
        int4pack.of_quant(fc.kernel_weight(), other.kernel_weight())


def test_the_switch_takes_batch_2_to_n_and_refuses_what_is_not_a_batch(monkeypatch):
    from trtllm_pipeline.errors import InputError

    monkeypatch.delenv(int4pack.ROWS_ENV, raising=False)
    assert not any(int4pack.enabled(m) for m in (1, 2, 16))
    monkeypatch.setenv(int4pack.ROWS_ENV, "8")
    assert [m for m in (1, 2, 8, 9) if int4pack.enabled(m)] == [2, 8]
    monkeypatch.setenv(int4pack.ROWS_ENV, "many")
    with pytest.raises(InputError, match="INT4PACK_ROWS"):
        int4pack.enabled(2)
