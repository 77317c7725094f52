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
# 32: every format's decode step (batch 1 / 8 / 32 / 64, context 2048) and prefill on one machine, with the defaults
# the H100 measured on 2026-12-08 (the wgmma row kernels: SmoothQuant and weight-only at 2-64, W4A8 at 2-8 with its
# GLU at 128 rows; SmoothQuant's batch 1 on the warp-specialized GEMV; weight-only's prefill through the dequant kernel)
step_table() {
  part quant_gemm 300 QG_PARTS=steps QUANT_FORMATS=int4_awq,w4a8_awq,int8_sq,int8_wo,fp8,bf16
}
# 32: the 4-bit row kernels' staged form with its input loaded one K tile ahead (TRTLLM_PIPELINE_WGMMA_PREFETCH=1,
# built 2026-12-08 on the CPU: the load was at the top of every tile, its latency exposed); the kernels' variant
# "rows-prefetch", then the steps with it (the step table's W4A8 row and rows_steps' "table" column the baselines)
prefetch_4bit() {
  part w4a8_kernels 150 W4A8_GEMV_ROWS=8
  part w4a8_kernels 150 W4A8_GEMV_ROWS=8 GEMV_FORMAT=int4_awq
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq TRTLLM_PIPELINE_WGMMA_PREFETCH=1
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq
  part quant_gemm 240 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq TRTLLM_PIPELINE_WGMMA_PREFETCH=1
}
# 32: the 4-bit row kernels where the H100 found them slow (2026-12-08): W4A8's wide form at 64 rows took twice the
# GEMM's time (10.0 against 5.1 ms of launches; qkv as slow with one K split as with three: its made input now timed
# alone, "made-input", and Nsight Compute's stall counters on its GLU and proj); INT4's wide form is new since (each
# weight scaled in registers, 128 rows a program; "rows-offset" the form timed then, whose 8-row crash, a misaligned
# copy of its 8-column row sums, is fixed), checked and timed at 64 rows, then in the step at 32 and 64 and from 8
# rows (STAGED_ROWS=0)
rows_4bit() {
  part w4a8_kernels 150 W4A8_GEMV_ROWS=64
  part ncu_quant 240 NCU_MS=64 TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=64 TRTLLM_PIPELINE_INT4_WGMMA_ROWS=64
  part w4a8_kernels 150 W4A8_GEMV_ROWS=64 GEMV_FORMAT=int4_awq
  part quant_gemm 240 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq TRTLLM_PIPELINE_WGMMA_STAGED_ROWS=0
  # W4A8 at 16 rows (the default stops at 8: 16 never ran; its GLU at 128 rows there) and the staged / made A/B at 8
  part w4a8_kernels 150 W4A8_GEMV_ROWS=16
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq TRTLLM_PIPELINE_WGMMA_STAGED_ROWS=0
}
if on_h200; then
  # the goal's GPU: issue 32's step table, then issue 31's throughput rows (last there 2026-12-07: 128/2048 25,045 at
  # 512 rows, 500/2000 20,443, 1000/1000 14,901, 2048/2048 11,989, 2048/128 3,218; H100 since: 1000/1000 17,876,
  # 500/2000 21,529, 2048/128 3,403, 3,574 with fast accumulation)
  step_table
  part throughput 600 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048 2048/128" \
    REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 \
    SKIP_BATCH1=1
  # 32: W4A8 batch 1 through the pipeline (2.667 ms at context 128 on an H100; the goal: 1.8 on an H200)
  part w4a8_gemv 300 GEMV_BATCH=1 GEMV_CONTEXT=128,2048
  spec_eos
  # 31's "greedy outputs identical" with and without the prefix cache, in the batch-invariant mode (H100 2026-12-07e:
  # 100.0%, TTFT 9.8x, throughput 4.7x)
  part prefix 240 BATCH_INVARIANT=1 REQUESTS=256
  prefetch_4bit
  rows_4bit
  # 31: 2048/128 and 128/2048 with fast accumulation, the numerics of TensorRT-LLM's FP8 GEMMs (its cublas_scaled_mm
  # sets CUBLASLT_MATMUL_DESC_FAST_ACCUM: switches.fp8_fast_accum; +5.0% at 2048/128 on an H100, h100-2026-12-07h)
  part throughput 240 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 \
    SKIP_BATCH1=1 TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 \
    SKIP_BATCH1=1 TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
else
  prefetch_4bit
  rows_4bit
  step_table
  # 32: the defaults against the switches off, on one machine (each 2026-12-08 A/B was one run)
  part quant_gemm 200 QG_PARTS=steps QUANT_FORMATS=int8_sq,int8_wo,w4a8_awq TRTLLM_PIPELINE_INT8_WGMMA_ROWS=0 \
    TRTLLM_PIPELINE_INT8WO_WGMMA_ROWS=0 TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=0 TRTLLM_PIPELINE_INT8_WS=0
  # 32: weight-only at batch 1 on the warp-specialized GEMV (SmoothQuant's default now; weight-only's 3.353 against the
  # register kernel's 3.206 ms, two machines)
  part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=int8_wo TRTLLM_PIPELINE_INT8_WS=1
fi
