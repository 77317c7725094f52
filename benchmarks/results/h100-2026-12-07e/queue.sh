# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last). In order of need; what is cut is what comes last. Helpers must not use the
# device: their calls hold the machine and spend this session's budget.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 31: runtime.batch_invariant's GEMM against cuBLAS, rows bit-equal at every M; then the shared-prefix workload in
# that mode: greedy outputs with the prefix cache against without (the goal's "identical"; 2.5% of requests in the
# default mode on the H100, 2026-12-07), decode steps from cuda/row_graphs' CUDA graphs (the default)
invariant() {
  part invariant_gemm 120
  part prefix 240 BATCH_INVARIANT=1 REQUESTS=256
}
# 31: the default mode's shared-prefix run, its later chunks now through the paged kernel (TTFT and throughput against
# the last prefix runs')
prefix_default() { part prefix 150 REQUESTS=512; }
if on_h200; then
  # the batch-invariant mode end to end on the tiny FP8 model first (its decode graphs really captured here): outputs
  # equal? The prefix run below relies on it.
  part invariant 90
  # 31: the goal's rows on the goal's GPU with everything since its last run there (2026-12-07, before: 128/2048
  # 25,045 at 512 rows, 500/2000 20,443, 1000/1000 14,901, 2048/2048 11,989, 2048/128 3,218; H100 since: 1000/1000
  # 17,876, 500/2000 21,529, 2048/128 3,293, each above or near TensorRT-LLM's H200 rows)
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  # 31's "greedy outputs identical" with and without the prefix cache, in the batch-invariant mode
  part prefix 240 BATCH_INVARIANT=1 REQUESTS=256
  # 2048/128 with two prompts a step (chunks of 4,096: H100 2026-12-07b 3,061 -> 3,207 against chunks of 2,048; the
  # step is its prompts' GEMMs, and the decode rows' weights are read once for two prompts instead of one)
  # cuBLAS's FP8 GEMMs with fast accumulation (TRTLLM_PIPELINE_FP8_FAST_ACCUM=1, as TensorRT-LLM's and vLLM's
  # Hopper FP8 GEMMs run): each prefill shape's time and error both ways, then the 2048/128 row with it (that
  # row's step is 64% its prompt's FP8 GEMMs, at ~59% of the FP8 peak on the H100)
  part fp8_fast_accum 60
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 PREFILL_CHUNK=4096 TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  # 32: Nsight Compute's stall reasons for INT4-AWQ's M 8 GEMM (28% of the byte roof) against batch 1's GEMV (~65%)
  part ncu_int4 120
  # the paged prefill attention kernel (53de2aa) against float64, bit-equal however a prompt is chunked
  part paged_prefill 60
  part invariant_gemm 120
  prefix_default
else
  # the paged prefill attention kernel (53de2aa: later chunks and single-token rows of an eager step, by default)
  # against float64 and bit-equal however a prompt is chunked; an H100 ran an earlier version of it, not this one
  part paged_prefill 60
  # runtime.batch_invariant end to end on the tiny FP8 model (its decode graphs really captured here): outputs equal?
  part invariant 90
  # 32: Nsight Compute's stall reasons for INT4-AWQ's M 8 GEMM (28% of the byte roof) against batch 1's GEMV (~65%)
  part ncu_int4 120
  # 31: cuBLAS's FP8 GEMMs with fast accumulation at the prefill shapes, then 2048/128 with it (3,293 without)
  part fp8_fast_accum 60
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1 TRTLLM_PIPELINE_FP8_FAST_ACCUM=1
  invariant
  prefix_default
  # an 8k prompt admitted in chunks beside running decodes (its later chunks: the kernel's case): the worst gap
  part throughput 200 LOAD_VARIANT=-fp8kv LENGTHS=none SKIP_BATCH1=1 TRTLLM_PIPELINE_PAGED_PREFILL=none
  part throughput 200 LOAD_VARIANT=-fp8kv LENGTHS=none SKIP_BATCH1=1 TRTLLM_PIPELINE_PAGED_PREFILL=later
  # prefill_probe's later chunk over a long cached prefix, by the two paths
  part prefill 150 TRTLLM_PIPELINE_PAGED_PREFILL=none
  part prefill 150 TRTLLM_PIPELINE_PAGED_PREFILL=later
  # 32: INT4-AWQ's prefill of 2,048 tokens by kernel (1.41x BF16's on 2026-12-06e against the goal's 1.3x, where its
  # dequant path should add ~6 ms of scratch traffic to BF16's 47.6, not ~20)
  part prefill 240 PREFILL_FORMAT=int4-awq
  # the FP8 pool's key tile at load: the sweep, with 128-key tiles unpipelined and at 8 warps (2026-12-07d: cut while
  # compiling at 90 s)
  part attention 180 ATTN_KV=fp8 ATTN_BATCHES=256,512 ATTN_CONTEXTS=2048
fi
# the batch-invariant mode's decode steps eager (TRTLLM_PIPELINE_INVARIANT_GRAPHS=0) against the graphs above: speed,
# and the same outputs
part prefix 240 BATCH_INVARIANT=1 TRTLLM_PIPELINE_INVARIANT_GRAPHS=0 REQUESTS=256
