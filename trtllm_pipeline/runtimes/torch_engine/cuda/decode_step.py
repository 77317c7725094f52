"""One decode step of ``Qwen2Engine`` as a fixed sequence of fused Triton kernels.

Per layer, eight launches and no other work: the QKV linear (split-K partials), attention (bias,
rotary, cache write and flash-decoding over the live length), the split combine (quantized for
attention.dense), attention.dense (partials), the residual add + post-attention RMSNorm, the fused
fc/gate linear with its SiLU gate (quantized for mlp.proj), mlp.proj (partials), and the residual add
+ the next layer's input RMSNorm. Then the final norm's output goes through lm_head into float32
logits, whose argmax (the greedy token) is taken inside the step too (``greedy``). The INT4 GEMVs at batch 1
add their split-K partials into int64 accumulators instead (``fixed_sum``), which the next kernel reads as
one exact row and a later GEMV clears; on Hopper their QKV GEMV also makes its own input from the residual and
mlp.proj's sums (the input RMSNorm folded in, its 1 / rms applied by attention: ``gemv_input.NormFold``), so
those layers have seven launches. Every buffer is allocated once
per batch size (``StepBuffers``), so the whole step can be captured in a CUDA graph and replayed with
new tokens, positions and block tables copied into its inputs.

Weights are the engine's own tensors (no copy); the math and its rounding points are the eager
model's (but where a norm is folded into a GEMV: ``gemv_input.NormFold`` says what it rounds otherwise), so the
two agree up to accumulation order (checked in ``benchmarks/gpu_fast_path.py`` and,
through Triton's interpreter, in the CPU tests). BF16 and FP8 linears run ``linear``'s kernels; INT4-AWQ,
W4A8-AWQ, INT8 SmoothQuant and INT8 weight-only run the kernel ``quant_gemm.choose`` picks per shape and batch
from its measured table (quant_gemv's GEMV, quant_gemm's tensor-core GEMM or quant_linear's dot kernel), which read
the checkpoint's packed
tensors and apply the pre-quant scale and activation quantizer to their input themselves (so for these
formats every activation buffer stays in the compute dtype, and an unfused mlp.fc / mlp.gate pair runs as
one GLU launch); NVFP4 is refused (eager emulation runs it).

Tensor parallel (one rank of ``runtimes/torch_engine/tp``'s ``ShardedQwen2Engine``, which carries the group's ``comm``):
the same kernels over the rank's heads and slices, plus the eager shard's exchanges as collectives in the
step (captured in the CUDA graph with it): the vocabulary-parallel embedding's all-reduce, after
attention.dense and mlp.proj the rank's partial sum reduced over its splits, rounded to the compute dtype
and all-reduced (as ``RowParallelLinear`` does) before the residual add, and the lm_head slices
all-gathered into the whole logits on every rank (rank 0 samples from them).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from trtllm_pipeline.runtimes.torch_engine import switches
from trtllm_pipeline.runtimes.torch_engine.cuda import (attention, fixed_sum, gemv_input, greedy, int4pack, linear,
                                           norm, prefill, quant_gemm, quant_gemv, quant_gemv_int8_ws, quant_gemv_w4a8,
                                           quant_gemv_w4a8_mma, quant_gemv_w4a8_ws, quant_gemv_ws, quant_linear,
                                           quant_rows_int4_mma, quant_rows_int8_mma, quant_rows_int8wo_mma,
                                           quant_rows_w4a8_mma, support)
from trtllm_pipeline.runtimes.torch_engine.cuda.support import interpreting
from trtllm_pipeline.runtimes.torch_engine.model import quantize_fp8


@dataclasses.dataclass
class _Linear:
    weight: torch.Tensor  # [N, K], FP8 or the compute dtype (a 4/8-bit format's: as ``quant`` reads it)
    scale: torch.Tensor | None  # activation scale x weight scale (FP8), applied to the float32 sum
    in_inv: torch.Tensor | None  # 1 / activation scale: how the producer quantizes this layer's input
    bias: torch.Tensor | None
    quant: quant_linear.QuantWeight | None = None  # INT4 / INT8 formats: their kernels take the input as is
    a_scale: torch.Tensor | None = None  # FP8: the activation and weight scales apart (cuBLAS takes them so)
    w_scale: torch.Tensor | None = None
    fast_accum: bool = False  # cuBLAS's FP8 GEMM: the module's (switches.fp8_fast_accum)

    @property
    def out_features(self) -> int:
        return self.quant.n if self.quant is not None else self.weight.shape[0]

    def rows(self, start: int, stop: int) -> "_Linear":
        """Output rows [start, stop): mlp.fc and mlp.gate of one fused matrix."""
        if self.quant is not None:
            return dataclasses.replace(self, quant=self.quant.rows(start, stop))
        return dataclasses.replace(self, weight=self.weight[start:stop])


@dataclasses.dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: _Linear
    dense: _Linear
    fc: _Linear
    gate: _Linear
    proj: _Linear
    fc_gate: _Linear | None = None  # fc and gate as the one matrix they are rows of (cuBLAS's GLU: one GEMM)


@dataclasses.dataclass
class StepBuffers:
    """The static inputs, scratch and outputs of one decode step at one batch size."""

    batch: int
    # [4, B] int64: each row's token, position, block-table row and the token its argmax may not take (-1: none; the
    # end id before min_tokens), one copy per step
    inputs: torch.Tensor
    block_tables: torch.Tensor  # [S, W] int64: the block tables on the device (``graphs.DecodeGraphs`` keeps them)
    residual: torch.Tensor  # [B, hidden], compute dtype
    normed: torch.Tensor  # [B, hidden], FP8 or compute dtype: input of QKV / fc+gate
    partials: torch.Tensor  # [S, B, max(qkv, hidden)] float32 split-K partial sums
    attn_o: torch.Tensor  # [B, heads, splits, D] float32
    attn_lse: torch.Tensor  # [B, heads, splits] float32
    attn_out: torch.Tensor  # [B, heads * D]: input of attention.dense
    act: torch.Tensor  # [B, intermediate]: input of mlp.proj
    final: torch.Tensor  # [B, hidden] compute dtype: input of lm_head
    logits: torch.Tensor  # [B, vocab] float32
    greedy: torch.Tensor  # [B] int64: argmax of the logits, computed inside the step
    configs: dict[str, linear.LinearConfig]
    tp: "_TpBuffers | None" = None  # tensor parallel: the collectives' buffers
    # INT4 GEMV inputs as their producers prepare them (gemv_input), per layer by consumer (qkv, fc, gate, dense,
    # proj): one buffer per consumer, each layer's view carrying that layer's pre-quant scale
    prepared: list[dict[str, gemv_input.Prepared]] = dataclasses.field(default_factory=list)
    counters: torch.Tensor | None = None  # int32 zeros: the GEMV's split counters (its last program per tile sums)
    # the INT4 GEMVs' int64 accumulators (fixed_sum), by output: "qkv" [B, qkv width], "hidden" [B, hidden]
    # (attention.dense's), "mlp" (mlp.proj's: "hidden" itself unless the next QKV GEMV folds the norm in)
    sums: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # per layer, the input RMSNorm folded into its QKV GEMV (gemv_input.NormFold; None for layer 0, whose input is
    # the embedding's norm). Empty: the norm kernel runs them all (``DecodeStep._fold_norms``).
    folds: list[gemv_input.NormFold | None] = dataclasses.field(default_factory=list)
    # with folds: the residual stream's second buffer (the add before attention writes it, the one after reads it)
    residual_new: torch.Tensor | None = None
    # per consumer ("qkv", "glu") and layer: the pre-quant scales the norm before it multiplies its input by, so that
    # its quant_gemm GEMM takes none: (the consumer's, or mlp.fc's; mlp.gate's where it differs, written to
    # ``normed2``) (``DecodeStep._scaled_inputs``; None or absent: the GEMM applies its own)
    scaled_inputs: dict[str, list[tuple[torch.Tensor, torch.Tensor | None] | None]] = dataclasses.field(
        default_factory=dict)
    normed2: torch.Tensor | None = None  # [B, hidden] compute dtype: mlp.gate's input where its scale is its own
    glu_workspace: torch.Tensor | None = None  # float32: a split GLU's fc and gate partials (GEMV or GEMM)
    glu_counters: torch.Tensor | None = None  # int32 zeros: a split GLU GEMM's output tiles' counters
    argmax: greedy.Greedy | None = None  # the greedy token's kernel's scratch (GREEDY_KERNEL)
    # a verify step's requests' decode bucket (``DecodeStep.verify_buffers``): the attention's key splits and tile are
    # that batch's, so that each row attends as a 1-token step of it does; None: this step's rows
    attention_rows: int | None = None
    # 2: a speculative verify step, whose rows include several positions of one request: attention runs twice, the
    # first pass writing every row's K/V into the cache (its outputs discarded), the second reading them back for
    # the later positions (one launch's programs never see each other's writes: ``attention``'s docstring)
    attention_passes: int = 1
    # a tree verify step's extra inputs ([1 + attention.TREE_WORDS, B] int64, ``attention.decode_attention``'s
    # ``tree``: each row's virtual position and the slot shifts of the positions before it); None: every step that has
    # no tree row (its kernels unchanged)
    tree: torch.Tensor | None = None

    @property
    def tokens(self) -> torch.Tensor:  # the token each row feeds back
        return self.inputs[0]

    @property
    def positions(self) -> torch.Tensor:  # where each row's token goes in the cache
        return self.inputs[1]

    @property
    def table_rows(self) -> torch.Tensor:  # which row of ``block_tables`` holds each row's KV blocks
        return self.inputs[2]

    @property
    def ban(self) -> torch.Tensor:  # the token each row's greedy argmax skips (-1: none)
        return self.inputs[3]


@dataclasses.dataclass
class _TpBuffers:
    """A tensor-parallel rank's extra buffers (static, so the collectives can be captured in the graph)."""

    summed: torch.Tensor  # [B, hidden] float32: a row-parallel linear's partials summed over the splits
    reduced: torch.Tensor  # [1, B, hidden] compute dtype: that sum rounded, then all-reduced over the ranks
    local_logits: torch.Tensor  # [B, vocab / tp] float32: this rank's lm_head rows
    gathered: list[torch.Tensor]  # every rank's local_logits, rank order
    padded_logits: torch.Tensor  # [B, padded vocab] float32: the gathered slices side by side


# the modules of the layer kernels that DecodeStep.pin_carveout pins a shared-memory carveout on
CARVEOUT_MODULES = (norm, attention, quant_gemv, quant_gemv_ws, quant_gemv_w4a8_ws, quant_gemv_w4a8_mma,
                    quant_gemv_int8_ws, quant_rows_int4_mma, quant_rows_int8_mma, quant_rows_int8wo_mma,
                    quant_rows_w4a8_mma)
# the greedy token by greedy.argmax under PDL (False: torch.argmax, a launch PDL does not overlap)
GREEDY_KERNEL = True
# The input RMSNorm of layers 1.. made by their warp-specialized QKV GEMV's programs, its 1 / rms applied by
# attention (gemv_input.NormFold): one launch fewer a layer, for the eager rounding of the normed input (H200, 7B
# INT4-AWQ step: 1.648-1.651 ms against 1.697-1.701, runs 118 and 120; False: the norm kernel, the benchmark's
# variant "nofold")
FOLD_INPUT_NORM = True
# From this many rows a step's BF16 and FP8 linears (and lm_head) run cuBLAS: this module's kernels keep all of a
# step's rows in one tile, which streams the weights at batch 1-64 but leaves the tensor cores idle beyond (H200,
# random 7B FP8 at 256 rows: GLU 11.2 ms and the other linears 7.0 ms of a 22 ms step, where torch._scaled_mm
# takes 30 + 35 + 11 + 10 us a layer at M 256: benchmarks/quant_gemm.py)
LIBRARY_MIN_BATCH = 128


class Unsupported(Exception):
    """The fast path cannot run this engine; the message says why (the eager path runs instead)."""


class DecodeStep:
    """The kernels of one decode step over ``engine``'s weights and KV cache.

    ``pdl``: launch each kernel while the previous one drains (programmatic dependent launch, SM90+), which hides
    the launch gaps inside a CUDA graph; on by default where supported. ``split_sum``: how the INT4 GEMV's split-K
    partials reach the next kernel: "fixed", added exactly into int64 accumulators (``fixed_sum``; one rank only),
    "last", summed in split order by each row tile's last program (tensor parallel's default), or "none", every
    split's row (the benchmark's comparisons). ``carveout``: the shared-memory carveout pinned on the layer kernels
    when the INT4 GEMVs take copy-engine tiles (percent; "auto": ``quant_gemv.carveout`` of the step's configs;
    None: the driver's choice per kernel).
    """

    def __init__(self, engine, sm_count: int | None = None, *, pdl: bool | None = None, split_sum: str = "fixed",
                 carveout: int | str | None = "auto"):
        device = engine.device
        if device.type != "cuda" and not interpreting():
            raise Unsupported("the engine is not on a CUDA device")
        if engine.dtype not in (torch.bfloat16, torch.float16):
            raise Unsupported(f"compute dtype {engine.dtype} (the fast path runs bfloat16 or float16)")
        d = engine.head_dim
        if d < 16 or d & (d - 1):
            raise Unsupported(f"head_dim {d} is not a power of two >= 16")
        self.engine = engine
        self.dtype = engine.dtype
        self.comm = engine.comm if getattr(engine, "tp_size", 1) > 1 else None
        self.layers = [self._layer(layer) for layer in engine.layers]
        self.fold_pqs = switches.fold_pqs_enabled()
        self._unscaled_views: dict[int, tuple[quant_linear.QuantWeight, _Linear]] = {}  # (``_unscaled``)
        self.fp8 = self.layers[0].qkv.scale is not None
        self.quant = self.layers[0].qkv.quant is not None
        fp8_cores = self.fp8 or self.quant and self.layers[0].qkv.quant.fmt == "w4a8_awq"
        if fp8_cores and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
            raise Unsupported("FP8 weights or activations need FP8 tensor cores (SM89 or newer)")
        if device.type == "cuda":
            sm_count = sm_count or torch.cuda.get_device_properties(device).multi_processor_count
        self.sm_count = sm_count or 4
        self.pdl = linear.pdl_supported(device) if pdl is None else pdl and linear.pdl_supported(device)
        if split_sum not in ("fixed", "last", "none"):
            raise ValueError(f"split_sum {split_sum!r}: fixed, last or none")
        # a rank's partials go to its all-reduce as float32 rows (_all_reduce)
        self.split_sum = "last" if split_sum == "fixed" and self.comm is not None else split_sum
        self.carveout = carveout
        # Between ranks' collectives the launches are ordinary stream order (not measured with PDL yet).
        self.pdl = self.pdl and self.comm is None
        self.hidden = engine.embedding.shape[1]
        # an FP8 KV cache's scale and its inverse, one [1] view each per layer (made once: graphs keep pointers)
        self.kv_scales = [{} if engine.kv_scale is None else
                          {"kv_scale": engine.kv_scale[i : i + 1], "kv_inv": engine.kv_inv[i : i + 1],
                           "kv_unit": engine.kv_unit_scale} for i in range(len(engine.layers))]
        self.qkv_width = self.layers[0].qkv.out_features
        self.intermediate = self.layers[0].fc.out_features
        self.vocab = engine.lm_head.shape[0]
        # torch's INT4 kernel's copies of the INT4-AWQ linears (id of the QuantWeight, or of the GLU's fc): made here,
        # never under a graph's capture, and only where its switch is on
        self.packs = self._int4_packs() if self.quant and int4pack.enabled(2) else {}
        self._logits_store: torch.Tensor | None = None  # every bucket's logits: views of this (``_logits``)

    def _int4_packs(self) -> dict[int, list[int4pack.Packed]]:
        """Per INT4-AWQ linear (the id of its QuantWeight; the GLU: of its fc's) its copies in torch's layout: one,
        or the GLU's fc and gate apart where their pre-quant scales differ (two inputs)."""
        first = self.layers[0]
        if first.qkv.quant.fmt != "int4_awq" or self.dtype != torch.bfloat16:
            return {}
        packs = {}
        for layer in self.layers:
            for lin in (layer.qkv, layer.dense, layer.proj):
                if int4pack.supported(lin.quant.n, lin.quant.k, lin.quant.group):
                    packs[id(lin.quant)] = [int4pack.of_quant(lin.quant)]
            fc, gate = layer.fc.quant, layer.gate.quant
            if int4pack.supported(fc.n, fc.k, fc.group):
                packs[id(fc)] = int4pack.of_inputs(fc, gate)
        return packs

    def _layer(self, layer: dict) -> _Layer:
        qkv = _linear(layer["qkv"])  # first: it names a weight format without kernels here
        fc_gate = layer["fc_gate"]
        if not hasattr(fc_gate, "weight"):  # a _Pair: fc and gate with input scales of their own
            if qkv.quant is None:
                raise Unsupported("mlp.fc and mlp.gate have different scales (no fused gate kernel for them)")
            fc, gate = _linear(fc_gate.first), _linear(fc_gate.second)  # the quant GLU takes them apart
        else:
            both = _linear(fc_gate)
            half = both.out_features // 2
            fc, gate = both.rows(0, half), both.rows(half, 2 * half)
        dense, proj = _linear(layer["dense"]), _linear(layer["proj"])
        if any(lin.bias is not None or getattr(module, "reduced_bias", None) is not None
               for lin, module in ((dense, layer["dense"]), (proj, layer["proj"]))):
            raise Unsupported("attention.dense or mlp.proj has a bias (the residual kernels add none)")
        fused = both if hasattr(fc_gate, "weight") and both.quant is None else None
        return _Layer(layer["input_norm"], layer["post_norm"], qkv, dense, fc, gate, proj, fused)

    def buffers(self, batch: int, block_tables: torch.Tensor) -> StepBuffers:
        e, dev = self.engine, self.engine.device
        act_dtype = torch.float8_e4m3fn if self.fp8 else self.dtype
        wbytes = self.layers[0].qkv.weight.element_size()
        heads, d = e.heads, e.head_dim
        first = self.layers[0]
        configs = {
            "qkv": self._config(first.qkv, batch, self.qkv_width, self.hidden, wbytes),
            "dense": self._config(first.dense, batch, self.hidden, heads * d, wbytes),
            "glu": self._config(first.fc, batch, self.intermediate, self.hidden, wbytes, glu=True),
            "proj": self._config(first.proj, batch, self.hidden, self.intermediate, wbytes),
            "lm_head": linear.pick_config(batch, self.vocab, self.hidden, e.lm_head.element_size(), self.sm_count,
                                          splits=1),
        }
        if batch >= LIBRARY_MIN_BATCH and self.comm is None and not self.quant:
            configs = {name: dataclasses.replace(c, splits=1, library=True) for name, c in configs.items()}
        if switches.tiled_weights_enabled(quant_gemv_ws.TILED_WEIGHTS):
            self._tile_weights(configs)
        self._w4a8_tables(configs)
        max_splits = max(c.splits for c in configs.values())
        splits = attention.pick_splits(batch, e.kv_heads, self.sm_count)

        def empty(*shape, dtype=torch.float32):
            return torch.empty(shape, dtype=dtype, device=dev)

        tp = self._tp_buffers(batch) if self.comm is not None else None
        consumers = {"qkv": ("qkv", first.qkv), "fc": ("glu", first.fc), "gate": ("glu", first.gate),
                     "dense": ("dense", first.dense), "proj": ("proj", first.proj)}
        shared = {name: quant_gemv.prepared_input(lin.quant, batch) for name, (cfg, lin) in consumers.items()
                  if configs[cfg].gemv}
        prepared = [{name: dataclasses.replace(p, pqs=getattr(layer, name).quant.pqs) for name, p in shared.items()}
                    for layer in self.layers]
        tiles = [quant_gemv.row_tiles(lin.quant, configs[cfg]) for cfg, lin in consumers.values() if configs[cfg].gemv]
        counting = tiles and self.split_sum != "none"
        counters = torch.zeros(max(tiles), dtype=torch.int32, device=dev) if counting else None
        glu = configs["glu"]
        split_glu = first.fc.quant is not None and glu.gemm and glu.splits > 1  # quant_gemm's GLU, split K
        glu_counters = (torch.zeros(quant_gemm.glu_counters(first.fc.quant, batch, glu), dtype=torch.int32, device=dev)
                        if split_glu else None)
        sums = {}
        folding = False
        if self.split_sum == "fixed" and all(configs[c].gemv for c in ("qkv", "dense", "glu", "proj")):
            # (the GEMVs clear them too: every one of them has to run the GEMV kernel)
            sums = {"qkv": fixed_sum.accumulator(batch, self.qkv_width, device=dev),
                    "hidden": fixed_sum.accumulator(batch, self.hidden, device=dev)}
            folding = self._folding(configs, batch)
            sums["mlp"] = fixed_sum.accumulator(batch, self.hidden, device=dev) if folding else sums["hidden"]
        glu_ws = None  # a split GLU's partials: the GEMV's (with its counters) or quant_gemm's
        if counters is not None and glu.gemv and glu.splits > 1:
            glu_ws = empty(quant_gemv.glu_workspace(first.fc.quant, glu))
        elif split_glu:
            glu_ws = empty(quant_gemm.glu_workspace(first.fc.quant, batch, glu))
        # the whole vocabulary's logits: this engine's lm_head, or (TP) the ranks' slices gathered, padding cut
        logits = self._logits(batch) if tp is None else tp.padded_logits[:, : self.engine.vocab]
        tokens = torch.zeros(batch, dtype=torch.long, device=dev)

        scaled = self._scaled_inputs(configs)
        buf = StepBuffers(
            batch=batch,
            inputs=torch.cat([torch.zeros((3, batch), dtype=torch.long, device=dev),
                              torch.full((1, batch), -1, dtype=torch.long, device=dev)]),
            block_tables=block_tables,
            residual=empty(batch, self.hidden, dtype=self.dtype),
            normed=empty(batch, self.hidden, dtype=act_dtype),
            partials=empty(max_splits, batch, max(self.qkv_width, self.hidden)),
            attn_o=empty(batch, heads, splits, d),
            attn_lse=empty(batch, heads, splits),
            attn_out=empty(batch, heads * d, dtype=act_dtype),
            act=empty(batch, self.intermediate, dtype=act_dtype),
            final=empty(batch, self.hidden, dtype=self.dtype),
            logits=logits,
            greedy=tokens,
            configs=configs,
            tp=tp,
            prepared=prepared,
            counters=counters,
            sums=sums,
            scaled_inputs=scaled,
            normed2=empty(batch, self.hidden, dtype=act_dtype) if any(
                s is not None and s[1] is not None for s in scaled.get("glu", [])) else None,
            glu_workspace=glu_ws,
            glu_counters=glu_counters,
            argmax=greedy.Greedy.empty(tokens) if GREEDY_KERNEL else None,
        )
        if folding:
            self._fold_norms(buf)
        return buf

    def _scaled_inputs(self, configs: dict[str, linear.LinearConfig]
                       ) -> dict[str, list[tuple[torch.Tensor, torch.Tensor | None] | None]]:
        """Per consumer (qkv, glu) whose quant_gemm GEMM this batch takes, each layer's pre-quant scales for the norm
        before it to apply (``norm.residual_rmsnorm``'s ``scale_out``, ``scale_out2``): the GEMM's own product and
        rounding, made once a row instead of once a K tile and program from a [BLOCK_K] 16-bit load the compiler
        cannot pipeline (ncu, H100 2026-12-07f: the INT4 GLU at M 8 57.7 -> 49.4 us). mlp.fc and mlp.gate each
        have their own scale in this project's AWQ checkpoints: the norm writes mlp.gate's input apart (INT4 GEMMs,
        which read a second input; an INT8 GLU keeps them in its GEMM unless the two are equal)."""
        if not self.fold_pqs or not self.quant:
            return {}
        out = {}
        if configs["qkv"].gemm and not configs["qkv"].library:
            out["qkv"] = [None if layer.qkv.quant.pqs is None else (layer.qkv.quant.pqs, None) for layer in self.layers]
        glu = configs["glu"]
        if glu.gemm and not glu.library and not glu.lut_mma:  # (the wgmma rows kernels read one input, not two)
            out["glu"] = self._glu_scale_pairs
        return {name: scales for name, scales in out.items() if any(s is not None for s in scales)}

    def _unscaled(self, lin: _Linear) -> _Linear:
        """``lin`` for an input its producer already multiplied by its pre-quant scale: made once per weight view
        (a step run without graphs calls this every step; ``_tile_weights`` may replace ``lin.quant`` between)."""
        made = self._unscaled_views.get(id(lin))
        if made is None or made[0] is not lin.quant:
            made = self._unscaled_views[id(lin)] = (
                lin.quant, dataclasses.replace(lin, quant=dataclasses.replace(lin.quant, pqs=None)))
        return made[1]

    @functools.cached_property
    def _glu_scale_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor | None] | None]:
        """Each layer's ``_glu_scales`` (compared on the device once, not per bucket)."""
        return [_glu_scales(layer.fc.quant, layer.gate.quant) for layer in self.layers]

    def _logits(self, batch: int) -> torch.Tensor:
        """Float32 [batch, vocab] for a bucket's logits: the first rows of one buffer that every bucket shares (made
        by the largest, which ``DecodeGraphs.prepare`` asks for first). A step's logits are read before the next step
        launches, or never (a step chained on it reads only its argmax), and one step runs at a time, so the buckets
        need not hold their own: at 1,024 rows they were 1.16 GiB of the random 7B's 152k-word logits (the issue's
        memory goal is 2 GiB over weights and KV pool). ``decode``'s logits are a view valid until the next call."""
        store = self._logits_store
        if store is None or store.shape[0] < batch:
            store = self._logits_store = torch.empty(batch, self.vocab, device=self.engine.device)
        return store[:batch]

    def verify_buffers(self, buf: StepBuffers, requests: int) -> StepBuffers:
        """``buf`` (a bucket's decode buffers) for a verify step of ``requests`` requests (their decode bucket): two
        attention passes with that batch's key splits and tile, and attention scratch of their own. The BF16 and FP8
        linears' sums do not depend on the rows a step has (up to a tile's: 16), so each verify row then computes
        exactly what a 1-token step of that batch would, and greedy speculation keeps plain decoding's tokens (the 4-
        and 8-bit formats' kernels may still change with the rows: quant_gemm's table). Before, a lone SmolLM2
        request's verify rows split its keys 16 or 2 ways against a 1-token step's 32 (H100: its FP8 outputs parted
        from plain decoding's, 2026-12-06b; Triton's interpreter, a 400-token context: rows up to 0.08 of a logit from
        the 1-token steps')."""
        if requests == buf.batch:
            return dataclasses.replace(buf, attention_passes=2)
        e = self.engine
        splits = attention.pick_splits(requests, e.kv_heads, self.sm_count)
        o = torch.empty((buf.batch, e.heads, splits, e.head_dim), dtype=torch.float32, device=e.device)
        lse = torch.empty((buf.batch, e.heads, splits), dtype=torch.float32, device=e.device)
        return dataclasses.replace(buf, attention_passes=2, attention_rows=requests, attn_o=o, attn_lse=lse)

    def attention_of(self, buf: StepBuffers) -> tuple[int, attention.LaunchShape]:
        """How ``buf``'s step splits and tiles each row's keys: its key splits and ``attention.launch_shape`` (of its
        ``attention_rows``). Two steps alike here attend a row's keys alike, bit for bit (``graphs._tree_bucket``)."""
        e = self.engine
        rows = buf.attention_rows or buf.batch
        return buf.attn_o.shape[2], attention.launch_shape(rows, e.kv_dtype == torch.float8_e4m3fn, e.kv_unit_scale)

    def _folding(self, configs: dict[str, linear.LinearConfig], batch: int) -> bool:
        """Whether this batch's step folds its input norms into the QKV GEMVs (FOLD_INPUT_NORM: the
        warp-specialized INT4 GEMVs at batch 1, one rank)."""
        return FOLD_INPUT_NORM and batch == 1 and self.comm is None and all(
            quant_gemv.int4_ws(configs[c]) for c in ("qkv", "dense", "glu", "proj"))

    def _fold_norms(self, buf: StepBuffers) -> None:
        """The input RMSNorms inside the QKV GEMVs (``StepBuffers.folds``). The residual stream alternates between
        two buffers so that no program overwrites what another still reads: the embedding's norm and each QKV
        GEMV (layers 1..: ``residual`` plus mlp.proj's sums) write ``residual_new``, and the post-attention norm
        reads it back into ``residual``."""
        dev = self.engine.device
        buf.residual_new = torch.empty_like(buf.residual)
        qkv_sumsq = torch.empty(buf.configs["qkv"].splits, dtype=torch.float32, device=dev)
        buf.folds = [None]
        for layer in self.layers[1:]:
            buf.folds.append(gemv_input.NormFold(buf.sums["mlp"], buf.residual, buf.residual_new,
                                                 _norm_scale(layer.input_norm, layer.qkv), qkv_sumsq))

    def _tile_weights(self, configs: dict[str, linear.LinearConfig]) -> None:
        """The warp-specialized GEMVs' weights re-laid tile by tile for their row tiles (once per engine and
        tile: ``quant_gemv_ws.tile_weights``; a copy of each INT4 weight on the device)."""
        for layer in self.layers:
            for name, cfg in (("qkv", "qkv"), ("dense", "dense"), ("fc", "glu"), ("gate", "glu"), ("proj", "proj")):
                lin = getattr(layer, name)
                if quant_gemv.int4_ws(configs[cfg]) and lin.quant is not None:
                    lin.quant = quant_gemv_ws.tile_weights(lin.quant, configs[cfg].block_n // 2)

    def _w4a8_tables(self, configs: dict[str, linear.LinearConfig]) -> None:
        """The W4A8 table-lookup GEMVs' tables, once per engine, for the linears whose config takes one
        (``quant_gemv_w4a8.with_tables``: per group and row 8 bytes and a float32 power of two; the wgmma kernel's:
        ``quant_gemv_w4a8_mma.with_tables``, 8 bytes)."""
        for layer in self.layers:
            for name, cfg in (("qkv", "qkv"), ("dense", "dense"), ("fc", "glu"), ("gate", "glu"), ("proj", "proj")):
                lin = getattr(layer, name)
                if configs[cfg].w4a8 and lin.quant is not None:
                    tables = quant_gemv_w4a8_mma if configs[cfg].lut_mma else quant_gemv_w4a8
                    lin.quant = tables.with_tables(lin.quant)

    def _tp_buffers(self, batch: int) -> _TpBuffers:
        dev = self.engine.device
        return _TpBuffers(summed=torch.empty(batch, self.hidden, device=dev),
                          reduced=torch.empty(1, batch, self.hidden, dtype=self.dtype, device=dev),
                          local_logits=torch.empty(batch, self.vocab, device=dev),
                          gathered=[torch.empty(batch, self.vocab, device=dev) for _ in range(self.comm.size)],
                          padded_logits=torch.empty(batch, self.vocab * self.comm.size, device=dev))

    def weight_bytes(self) -> int:
        """Bytes of weights one step at batch 1 reads: the kernels' tensors (packed, with their scales as its
        kernels read them), lm_head and norms."""
        e = self.engine
        tensors = [e.lm_head, e.final_norm]
        size = 0
        for layer in self.layers:
            tensors += [layer.input_norm, layer.post_norm]
            for lin in (layer.qkv, layer.dense, layer.fc, layer.gate, layer.proj):
                if lin.quant is None:
                    size += lin.weight.numel() * lin.weight.element_size()
                else:
                    ws = quant_gemv_ws.SCALES_16BIT and quant_linear.pick_config(lin.quant, 1, self.sm_count).ws
                    size += lin.quant.nbytes(scales16=ws)
                tensors += [lin.bias] if lin.bias is not None else []
        return size + sum(t.numel() * t.element_size() for t in tensors)

    def pin_carveout(self, buf: StepBuffers) -> None:
        """Pin ``carveout`` on the layer kernels (norm, attention, the GEMV; compiled by a first ``run``)
        when this batch's GEMVs take copy-engine tiles, so that no SM has to change its L1 / shared-memory
        split between them (``quant_gemv.carveout``). lm_head's kernel keeps the driver's choice: it runs
        once per step, and its tiles want more shared memory. Call before capturing the step."""
        percent = quant_gemv.carveout(buf.configs.values()) if self.carveout == "auto" else self.carveout
        if percent is not None and any(c.tma for c in buf.configs.values()):
            support.set_carveout(CARVEOUT_MODULES, percent)

    def _config(self, lin: _Linear, batch: int, n: int, k: int, wbytes: int, glu: bool = False) -> linear.LinearConfig:
        if lin.quant is not None:  # the GEMV, the GEMM or the dot kernel, as quant_gemm's measured table says
            q = lin.quant
            cfg = quant_gemm.choose(q, batch, self.sm_count, glu=glu)
            # ``$TRTLLM_PIPELINE_INT4PACK_ROWS=N``: torch's INT4 kernel (``int4pack``, this step's copies: ``library``)
            # for every INT4-AWQ linear at batch 2..N, before all but quant_mma_int4's switch (off unless set)
            asked = q.fmt == "int4_awq" and not cfg.mma and int4pack.enabled(batch)
            if asked and int4pack.supported(q.n, q.k, q.group):
                if id(q) not in self.packs:
                    raise Unsupported(f"{int4pack.ROWS_ENV}: torch's INT4 kernel takes bfloat16 INT4-AWQ engines only "
                                      f"(this one: {self.dtype})")
                return linear.LinearConfig(batch, 8, 16 * int4pack.INNER_K_TILES, library=True)
            return cfg
        return linear.pick_config(batch, n, k, wbytes, self.sm_count, glu=glu)

    def _partials(self, x: torch.Tensor, lin: _Linear, out: torch.Tensor, cfg: linear.LinearConfig,
                  buf: StepBuffers, prepared: gemv_input.Prepared | None = None,
                  sums: torch.Tensor | None = None, clear: torch.Tensor | None = None,
                  fold: gemv_input.NormFold | None = None) -> torch.Tensor:
        """Launch one linear into ``out`` (split-K partials); returns what its consumer reads: the INT4 GEMV's
        accumulators ``sums`` (split_sum "fixed", the GEMV setting the accumulators ``clear`` to zero too), or
        its partials summed into the first split ("last"); ``fold``: the norm before it made by its programs."""
        if lin.quant is None and cfg.library:
            # cuBLAS's output, rounded to the compute dtype as eager's, is what its consumer reads: one split, which
            # fixed_sum.summed adds to float32 exactly as the float32 copy of it. Copying it into the partials cost
            # 3 launches a layer (0.8 ms of an 18.5 ms 512-row FP8 step on an H100, 2026-12-07)
            return _library_linear(x, lin, self.dtype)[None]
        if cfg.library:  # INT4-AWQ by torch's INT4 kernel (int4pack), the bias added to its rounded output
            y = out[0, :, : lin.quant.n]
            y.copy_(int4pack.linear(x, self.packs[id(lin.quant)][0]))
            if lin.bias is not None:
                y.add_(lin.bias)
            return out[:1]
        if lin.quant is None:
            linear.linear_partials(x, lin.weight, lin.scale, out, cfg, self.pdl)
            return out
        if cfg.gemm:
            quant_gemm.launch(x, lin.quant, None, out, cfg, self.dtype, self.pdl)
            return out
        if not cfg.gemv:
            quant_linear.quant_partials(x, lin.quant, out, cfg, self.dtype, self.pdl)
            return out
        if sums is not None:
            quant_linear.quant_partials(prepared or x, lin.quant, sums, cfg, self.dtype, self.pdl, clear=clear,
                                        fold=fold)
            return sums
        quant_linear.quant_partials(prepared or x, lin.quant, out, cfg, self.dtype, self.pdl, counters=buf.counters)
        return out[:1] if buf.counters is not None else out

    def _glu(self, x: torch.Tensor, layer: _Layer, out: torch.Tensor, cfg: linear.LinearConfig, buf: StepBuffers,
             prep: dict[str, gemv_input.Prepared], x2: torch.Tensor | None = None):
        if layer.fc.quant is not None and cfg.gemm:  # (x2: mlp.gate's own input, its pre-quant scale applied)
            quant_gemm.launch(x, layer.fc.quant, layer.gate.quant, out, cfg, self.dtype, self.pdl,
                              counters=buf.glu_counters, workspace=buf.glu_workspace, x2=x2)
        elif layer.fc.quant is not None and cfg.library:  # torch's INT4 kernel on fc and gate (int4pack)
            fc, gate = int4pack.fc_gate(x, self.packs[id(layer.fc.quant)], layer.fc.quant.n)
            torch.mul(F.silu(fc), gate, out=out)  # eager's rounding: silu(fc), then times gate
        elif layer.fc.quant is not None:
            fc, gate = prep.get("fc"), prep.get("gate")
            gemv = dict(x2=gate, prepare_out=prep.get("proj"), counters=buf.counters, workspace=buf.glu_workspace,
                        clear=buf.sums.get("mlp")) if fc and gate else {}
            quant_linear.quant_glu(fc or x, layer.fc.quant, layer.gate.quant, out, cfg, self.dtype, self.pdl, **gemv)
        elif cfg.library and layer.fc_gate is not None:  # one GEMM, then eager's silu(fc) * gate rounding in one
            # kernel, FP8 for mlp.proj (H200, 256 rows: the two GEMMs and six elementwise passes took ~0.8 ms a step)
            prefill.silu_gate(_library_linear(x, layer.fc_gate, self.dtype), out, layer.proj.in_inv)
        elif cfg.library:  # eager's math: silu(fc) * gate in the compute dtype, quantized for mlp.proj
            y = F.silu(_library_linear(x, layer.fc, self.dtype)) * _library_linear(x, layer.gate, self.dtype)
            out.copy_(y if layer.proj.in_inv is None else quantize_fp8(y, layer.proj.in_inv))
        else:
            linear.glu(x, layer.fc.weight, layer.gate.weight, layer.fc.scale, layer.proj.in_inv, out, cfg,
                       self.dtype, self.pdl)

    def run(self, buf: StepBuffers) -> None:
        """Launch the step for ``buf``'s tokens, slots and positions; logits land in ``buf.logits``."""
        e, cfg, dt, pdl = self.engine, buf.configs, self.dtype, self.pdl
        n = len(self.layers)
        if self.comm is not None and e.parallel_embedding:  # this rank's vocabulary rows, summed over the ranks
            rows = e.embedding.shape[0]
            local = buf.tokens - self.comm.rank * rows
            outside = ((local < 0) | (local >= rows))[:, None]
            torch.index_select(e.embedding, 0, local.clamp(0, rows - 1), out=buf.residual)
            buf.residual.masked_fill_(outside, 0)
            self.comm.all_reduce(buf.residual)
            # no partials to add (a zero-row view: a real pointer, never read)
            norm.residual_rmsnorm(buf.residual, buf.tp.reduced[:0], self.layers[0].input_norm, buf.normed,
                                  self.layers[0].qkv.in_inv, e.eps, dt, prepared=_inputs(buf, 0, "qkv"),
                                  scale_out=_scale(buf, "qkv", 0)[0], pdl=pdl)
        else:
            norm.residual_rmsnorm(buf.residual, None, self.layers[0].input_norm, buf.normed,
                                  self.layers[0].qkv.in_inv, e.eps, dt, tokens=buf.tokens, embedding=e.embedding,
                                  prepared=_inputs(buf, 0, "qkv"), x_out=buf.residual_new,
                                  scale_out=_scale(buf, "qkv", 0)[0], pdl=pdl)
        for i, layer in enumerate(self.layers):
            prep = buf.prepared[i] if buf.prepared else {}
            qkv = buf.partials[: cfg["qkv"].splits]
            # Each accumulator is cleared by a launch between its last reader and its next writer (fixed_sum): the
            # hidden ones (read by the norm before) by QKV's GEMV and the GLU's, the QKV ones (read by attention)
            # by dense's.
            # With the norms folded in (buf.folds), mlp.proj's accumulators are their own ("mlp"): the QKV GEMV reads
            # them, the GLU clears them.
            fold = buf.folds[i] if buf.folds else None
            qkv_lin = self._unscaled(layer.qkv) if _scale(buf, "qkv", i)[0] is not None else layer.qkv
            qkv = self._partials(buf.normed, qkv_lin, qkv, cfg["qkv"], buf, prep.get("qkv"), buf.sums.get("qkv"),
                                 clear=buf.sums.get("hidden"), fold=fold)
            for attention_pass in range(buf.attention_passes):
                # (cuBLAS added QKV's bias before its rounding, as eager does; a verify step's passes before the last
                # only write the rows' keys and values, which the last reads)
                attention.decode_attention(qkv, None if cfg["qkv"].library else layer.qkv.bias, e.cos, e.sin, e.cache_k[i], e.cache_v[i], buf.positions,
                                           buf.table_rows, buf.block_tables, buf.attn_o, buf.attn_lse, buf.attn_out, layer.dense.in_inv,
                                           heads=e.heads, kv_heads=e.kv_heads, compute=dt,
                                           prepared=prep.get("dense"), norm_sumsq=fold and fold.sumsq,
                                           hidden=self.hidden, eps=e.eps, pdl=pdl, tree=buf.tree,
                                           write_only=attention_pass + 1 < buf.attention_passes,
                                           shape_rows=buf.attention_rows, **self.kv_scales[i])
            dense = buf.partials[: cfg["dense"].splits]
            dense = self._partials(buf.attn_out, layer.dense, dense, cfg["dense"], buf, prep.get("dense"),
                                   buf.sums.get("hidden"), clear=buf.sums.get("qkv"))
            dense = self._all_reduce(dense, buf)
            folded = buf.residual_new is not None
            glu_scales = _scale(buf, "glu", i)
            gate_in = buf.normed2 if glu_scales[1] is not None else None
            norm.residual_rmsnorm(buf.residual_new if folded else buf.residual, dense, layer.post_norm, buf.normed,
                                  layer.fc.in_inv, e.eps, dt, prepared=_inputs(buf, i, "fc", "gate"),
                                  x_out=buf.residual if folded else None, scale_out=glu_scales[0],
                                  out2=gate_in, scale_out2=glu_scales[1], pdl=pdl)
            glu_layer = layer if glu_scales[0] is None else dataclasses.replace(
                layer, fc=self._unscaled(layer.fc), gate=self._unscaled(layer.gate))
            self._glu(buf.normed, glu_layer, buf.act, cfg["glu"], buf, prep, x2=gate_in)
            proj = buf.partials[: cfg["proj"].splits]
            # mlp.proj's prepared input is the GLU kernel's (when both run the GEMV)
            proj_in = prep.get("proj") if "fc" in prep else None
            proj = self._partials(buf.act, layer.proj, proj, cfg["proj"], buf, proj_in, buf.sums.get("mlp"))
            proj = self._all_reduce(proj, buf)
            last = i + 1 == n
            following = None if last else self.layers[i + 1]
            if not last and buf.folds and buf.folds[i + 1] is not None:
                continue  # the next QKV GEMV adds and normalizes itself
            norm.residual_rmsnorm(buf.residual, proj, e.final_norm if last else following.input_norm,
                                  buf.final if last else buf.normed, None if last else following.qkv.in_inv,
                                  e.eps, dt, prepared=() if last else _inputs(buf, i + 1, "qkv"),
                                  scale_out=None if last else _scale(buf, "qkv", i + 1)[0], pdl=pdl)
        if cfg["lm_head"].library:  # eager's logits: the compute dtype's product, then float32
            buf.logits.copy_(F.linear(buf.final, e.lm_head))
        elif self.comm is None:
            linear.linear_partials(buf.final, e.lm_head, None, buf.logits, cfg["lm_head"], pdl)
        else:  # this rank's vocabulary rows; every rank gathers all of them (buf.logits views the result)
            linear.linear_partials(buf.final, e.lm_head, None, buf.tp.local_logits, cfg["lm_head"], pdl)
            self.comm.all_gather(buf.tp.gathered, buf.tp.local_logits)
            torch.cat(buf.tp.gathered, dim=-1, out=buf.tp.padded_logits)
        if buf.argmax is not None:
            greedy.argmax(buf.logits, buf.argmax, pdl, ban=buf.ban)
        else:
            greedy.argmax_torch(buf.logits, buf.greedy, buf.ban)

    def _all_reduce(self, partials: torch.Tensor, buf: StepBuffers) -> torch.Tensor:
        """A row-parallel linear's output as the next kernel reads it: its split-K partials (one rank), or
        (TP) this rank's sum, rounded to the compute dtype as the eager shard's output is, all-reduced."""
        if self.comm is None:
            return partials
        torch.sum(partials[:, :, : self.hidden], dim=0, out=buf.tp.summed)
        buf.tp.reduced[0].copy_(buf.tp.summed)
        return self.comm.all_reduce(buf.tp.reduced)


def _library_linear(x: torch.Tensor, lin: _Linear, dtype: torch.dtype) -> torch.Tensor:
    """``x W^T + b`` by cuBLAS in the compute dtype, as the eager model's linear computes it (FP8: its
    ``torch._scaled_mm`` of the quantized input, activation and weight scales per tensor)."""
    if lin.scale is None:
        return F.linear(x, lin.weight, lin.bias)
    return torch._scaled_mm(x, lin.weight.t(), scale_a=lin.a_scale, scale_b=lin.w_scale, bias=lin.bias,
                            out_dtype=dtype, use_fast_accum=lin.fast_accum)


def _inputs(buf: StepBuffers, layer: int, *names: str) -> tuple[gemv_input.Prepared, ...]:
    """The prepared inputs of layer ``layer``'s consumers ``names`` that run the INT4 GEMV, for their producer
    to write (none where the consumers take the producer's output as is)."""
    prep = buf.prepared[layer] if buf.prepared else {}
    return tuple(prep[n] for n in names if n in prep)


def _scale(buf: StepBuffers, consumer: str, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The pre-quant scales layer ``layer``'s norm applies for ``consumer`` (``StepBuffers.scaled_inputs``; None,
    None: none, its GEMM applies them)."""
    scales = buf.scaled_inputs.get(consumer)
    return scales[layer] if scales and scales[layer] is not None else (None, None)


def _glu_scales(fc, gate) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """mlp.fc's and mlp.gate's pre-quant scales for the norm to apply (gate's None where they are equal), or None
    where their GEMM keeps them: either has none, or they differ and the GEMM (INT8's) reads one input."""
    if fc.pqs is None or gate.pqs is None:
        return None
    if torch.equal(fc.pqs, gate.pqs):
        return fc.pqs, None
    return (fc.pqs, gate.pqs) if fc.int4 else None


def _norm_scale(weight: torch.Tensor, lin: _Linear) -> torch.Tensor:
    """A folded norm's input scale for ``lin``: the norm's weight times its pre-quant scale, float32."""
    pqs = lin.quant.pqs
    return (weight.float() * (pqs.float() if pqs is not None else 1.0)).contiguous()


def _linear(module) -> _Linear:
    """The fast path's view of a ``torch_engine/model.Linear`` (whose FP8 weights are FP8 values; the 4/8-bit formats'
    tensors as the checkpoint stores them, their scales re-laid once for quant_linear's kernels)."""
    fmt = getattr(module, "format", "none")
    if fmt in quant_linear.FORMATS:  # the layer's own kernel view (its prefill GEMMs read the same tensors)
        return _Linear(module.weight, None, None, module.bias, module.kernel_weight())
    if fmt == "nvfp4":
        raise Unsupported("nvfp4 weights (no fast kernels: Hopper has no FP4 tensor cores, and the eager path "
                          "emulates them)")
    if fmt not in ("none", "fp8"):
        raise Unsupported(f"{module.format} weights (no fast kernels for them yet)")
    if not module.fp8:
        return _Linear(module.weight, None, None, module.bias)
    return _Linear(module.weight, (module.a_scale * module.w_scale).reshape(1), module.a_inv.reshape(1), module.bias,
                   a_scale=module.a_scale, w_scale=module.w_scale, fast_accum=module.fast_accum)
