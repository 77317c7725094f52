# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last: the machine goes back after 30 idle seconds and the queue with it), the first
# with WAIT_S=15 carrying .whl_s1, the second .whl_s2 (SmolLM2's wheel in halves, for spec_eos on an H200: both there
# within its await). In order of need; what is cut is what comes last. Helpers must not use the device.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 35: prompt lookup on the real model on the goal's GPU (H100 2026-12-07f: grounded 2.18x at acceptance 3.81)
spec_eos() {
  await /tmp/smolw/ready 60
  [ -e /tmp/smolw/ready ] && part spec 240 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_TREE_NODES=0 \
    SPEC_PROFILE=0 SPEC_DRAFTING=device SPEC_ENDS=eos,ignore
}
# whether the w4a8_kernels part started with arguments ending in $1 ended with rc 0
kernels_passed() {
  grep -q "end w4a8_kernels rc=0 " <<< "$(sed -n "/$1\$/,/end w4a8_kernels/p" "$q/summary.txt")"
}
# 32: W4A8's lookup into FP8 wgmma, at batch 1 (quant_gemv_w4a8_mma: 1.92 instructions a weight against the
# warp-specialized dp4a kernel's 2.8) and at 2-64 rows with the rows as the MMA's N (quant_rows_w4a8_mma: 2.3 at 8
# rows against quant_gemm's GEMM's 6-9; from 17 rows its input made once and copied beside the weights, 2.6-3.0), all
# new and compiled on the CPU only: each 7B launch checked against float32 and quant_linear's kernel and timed beside
# today's, then, with those that passed, the step (batch 1 and 8 checked against eager) against the default on one
# machine (H100 2026-12-07h: 2.772 ms at batch 1, 5.130 / 8.111 / 9.802 at 8 / 32 / 64; INT4 4.439 at 8)
w4a8_mma() {
  part w4a8_kernels 200 W4A8_GEMV_VARIANTS=ws,mma
  part w4a8_kernels 150 W4A8_GEMV_ROWS=8
  part w4a8_kernels 150 W4A8_GEMV_ROWS=64
  local switches=() rows=0
  kernels_passed "W4A8_GEMV_VARIANTS=ws,mma" && switches+=(TRTLLM_PIPELINE_W4A8_MMA=1)
  if kernels_passed "W4A8_GEMV_ROWS=8"; then
    rows=1
    kernels_passed "W4A8_GEMV_ROWS=64" && switches+=(TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=64) \
      || switches+=(TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=16)
  fi
  if [ ${#switches[@]} -gt 0 ]; then
    part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq "${switches[@]}"
    part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq
  fi
  # the row kernel's two forms at 8-16 rows: each program staging its input, or the input made once a launch
  if [ $rows = 1 ]; then
    part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq "${switches[@]}" TRTLLM_PIPELINE_WGMMA_STAGED_ROWS=0
  fi
}
# 32: INT4-AWQ at 2-64 rows dequantized in registers into bfloat16 wgmma (quant_rows_int4_mma, new: compiled on the
# CPU only, 2.0 instructions a weight at 8 rows against the GEMM's 3.7; from 17 rows its input made once, 3.2 at 64):
# the rows_steps part's "wgmma" choice, its logits against eager at 8, 16 and 64 rows, beside today's choices (H100
# 2026-12-07h: batch 8 / 16 4.439 / 5.272 ms; batch 64 10.2-11.1 on earlier runs)
int4_rows() {
  part quant_gemm 240 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq
  # its two forms at 8-16 rows (the wgmma choice): each program staging its input, or the input made once a launch
  part quant_gemm 240 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq TRTLLM_PIPELINE_WGMMA_STAGED_ROWS=0
}
# 32: the INT8 formats on tensor cores at 1-64 rows (new: compiled on the CPU only): SmoothQuant's int8 weights straight
# from shared memory into int8 wgmma (quant_rows_int8_mma, no instruction a weight), weight-only's int8 made float16
# in registers (quant_rows_int8wo_mma, 1.25 a weight): each 7B launch at 1 and 64 rows against float32 and
# quant_linear's kernel, timed beside the dp4a GEMV (batch 1) and quant_gemm's GEMM (64 rows); then, where both
# passed, the step with it at every batch up to 64 against the default (H100 2026-12-07h: int8_sq 3.670 / 4.653 /
# 6.713 / 9.110 ms at 1 / 8 / 32 / 64, int8_wo 3.289 / 4.706 / 6.202 / 7.870; the goal: 2.5 at 1 and no slower than
# FP8 at 8-64)
int8_rows() {
  local fmt switch
  for fmt in int8_sq int8_wo; do
    part w4a8_kernels 150 W4A8_GEMV_VARIANTS=new,rows GEMV_FORMAT=$fmt
    part w4a8_kernels 150 W4A8_GEMV_ROWS=64 GEMV_FORMAT=$fmt
  done
  for fmt in int8_sq int8_wo; do
    switch=TRTLLM_PIPELINE_INT8_WGMMA_ROWS=64
    [ $fmt = int8_wo ] && switch=TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=64
    if kernels_passed "W4A8_GEMV_VARIANTS=new,rows GEMV_FORMAT=$fmt" \
        && kernels_passed "W4A8_GEMV_ROWS=64 GEMV_FORMAT=$fmt"; then
      part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=$fmt $switch
      part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=$fmt
    fi
  done
}
if on_h200; then
  # first the new kernels' checks (a few minutes; six kernels no GPU has run wait on them), then the table
  w4a8_mma
  int4_rows
  int8_rows
  # 31: the goal's rows on the goal's GPU (last there 2026-12-07: 128/2048 25,045 at 512 rows, 500/2000 20,443,
  # 1000/1000 14,901, 2048/2048 11,989, 2048/128 3,218; H100 since: 1000/1000 17,876, 500/2000 21,529, 2048/128
  # 3,403, 3,574 with fast accumulation)
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 \
    SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 \
    SKIP_BATCH1=1
  # 32: W4A8 batch 1 through the pipeline with its warp-specialized GEMV, the default since h100-2026-12-07h (2.667 ms
  # at context 128 on an H100; the goal: 1.8 on an H200)
  part w4a8_gemv 300 GEMV_BATCH=1 GEMV_CONTEXT=128,2048
  spec_eos
  # 31's "greedy outputs identical" with and without the prefix cache, in the batch-invariant mode (H100 2026-12-07e:
  # 100.0%, TTFT 9.8x, throughput 4.7x)
  part prefix 240 BATCH_INVARIANT=1 REQUESTS=256
  # 31: 128/2048 with fast accumulation (+5.0% at 2048/128 on an H100, h100-2026-12-07h)
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 \
    SKIP_BATCH1=1 TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
  # 32: the whole format table on the goal's GPU (H100 2026-12-07h: W4A8 2.772 ms at batch 1 with the new GEMV)
  part quant_gemm 420 KERNEL_SWEEP_S=200 QG_PARTS=kernels,steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16 QG_MS=8,64,2048
  part quant_gemm 300 KERNEL_SWEEP_S=120 QG_PARTS=kernels,steps QUANT_FORMATS=int8_wo,int8_sq,bf16 QG_MS=2048
else
  w4a8_mma
  int4_rows
  int8_rows
  # 32: prefill of 2,048 tokens by format with this machine's own table (the kernels part first: the steps take the
  # table it measures; 2026-12-07g/h's steps used the package's H200 table), after the fused prefill's pair fix
  part quant_gemm 420 KERNEL_SWEEP_S=200 QG_PARTS=kernels,steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16 QG_MS=8,64,2048
  # 32: the INT8 formats' prefill of 2,048 tokens from this machine's own table (int8_wo's was 70.8 ms against BF16's
  # ~47 on 2026-12-07h, 1.5x, through the GEMM: its table never measured the dequant kernel at M 2048)
  part quant_gemm 300 KERNEL_SWEEP_S=120 QG_PARTS=kernels,steps QUANT_FORMATS=int8_wo,int8_sq,bf16 QG_MS=2048
  # 32: W4A8's warp-specialized GEMV under Nsight Compute (ncu_quant's M 1 cases take it now)
  part ncu_quant 150
  # 32: INT8 SmoothQuant with its warp-specialized GEMV, on one machine (alone its GLU 63.5 -> 53.5 us, the rest a
  # little slower; the step with it 3.535 ms on 2026-12-07g against 3.670 without on -07h, two machines)
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=int8_sq TRTLLM_PIPELINE_INT8_WS=1
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=int8_sq TRTLLM_PIPELINE_INT8_WS=0
fi
