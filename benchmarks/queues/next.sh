# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last), the first with WAIT_S=15 carrying .whl_s1, the second .whl_s2 (SmolLM2's
# wheel in halves, for spec_eos on an H200: both there within its await). In order of need; what is cut is what
# comes last. Helpers must not use the device: their calls hold the machine and spend this session's budget.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 32: INT4-AWQ steps at batch 1/8/16 with the GEMMs' input scaled by the norm before them (the default since
# 2026-12-07, switches.fold_pqs_enabled), then the same with the scales in the GEMMs' K loop
# (TRTLLM_PIPELINE_FOLD_PQS=0: the A/B). H100 2026-12-07f, in the loop: 2.144 / 4.454 / 5.300 ms; ncu there: the GLU
# at M 8 57.7 -> 49.4 us with its input scaled beforehand (~0.25 ms a step expected at batch 8; goal 1.9 on an
# H200). Batch 1 without the GEMV's tiled weight copy now (off by default since: 2.141 against 2.102 ms there)
int4_steps() {
  part quant_gemm 200 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq
  part quant_gemm 200 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq TRTLLM_PIPELINE_FOLD_PQS=0
}
# 31: 2048/128 with and without cuBLAS's fast FP8 accumulation on one machine (H100s: 3,583 with it on 2026-12-07e,
# 3,319 without on 2026-12-07f, different machines; the GEMM benchmark found 0.95-1.06x a layer)
accum_ab() {
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1 \
    TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
}
# 35: prompt lookup on the real model on the goal's GPU (H100 2026-12-07f: grounded 2.18x at acceptance 3.81 with
# requests ending at the end id, 1.80x forced to 128 tokens; a SmolLM2 step is the host's, ~0.72 ms on the H100)
spec_eos() {
  await /tmp/smolw/ready 60
  [ -e /tmp/smolw/ready ] && part spec 240 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_TREE_NODES=0 \
    SPEC_PROFILE=0 SPEC_DRAFTING=device SPEC_ENDS=eos,ignore
}
if on_h200; then
  # 31: the goal's rows on the goal's GPU with everything since its last run there (2026-12-07, before: 128/2048
  # 25,045 at 512 rows, 500/2000 20,443, 1000/1000 14,901, 2048/2048 11,989, 2048/128 3,218; H100 since: 1000/1000
  # 17,876, 500/2000 21,529, 2048/128 3,319-3,583)
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  spec_eos
  int4_steps
  # 31's "greedy outputs identical" with and without the prefix cache, in the batch-invariant mode (H100 2026-12-07e:
  # 100.0%, TTFT 9.8x, throughput 4.7x)
  part prefix 240 BATCH_INVARIANT=1 REQUESTS=256
  accum_ab
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  # the same with fast accumulation (from 128 rows a step's FP8 linears are cuBLAS's: 25,045 before against
  # TensorRT-LLM's 26,221, whose Hopper FP8 GEMMs accumulate so)
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1 \
    TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
  # 32: the whole format table on the goal's GPU (H100 2026-12-07f: W4A8 3.567 / 4.729 / 7.906 / 10.271 ms at batch
  # 1 / 8 / 32 / 64, INT4 2.102 / 4.404 / 8.898 / 11.053; prefill INT4 1.28x BF16, W4A8 1.33x)
  part quant_gemm 420 KERNEL_SWEEP_S=200 QG_PARTS=kernels,steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16 QG_MS=8,64,2048
else
  int4_steps
  # 32: the format table's steps, prefill and peaks after the fused prefill's pair fix and with the tiled copy off
  # (H100 2026-12-07f: prefill INT4 1.28x, W4A8 1.33x BF16's; peaks 16.31 / 13.77 GiB)
  part quant_gemm 300 QG_PARTS=steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16
  accum_ab
  # 32: the M 8 GEMMs' stalls with the input scaled beforehand, now the step's way (ncu_quant's "no pre-quant scales"
  # cases are the kernel the step runs)
  part ncu_quant 150
fi
