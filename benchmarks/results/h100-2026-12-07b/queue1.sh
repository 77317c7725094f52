# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# No part here serves: .whl_srv (tritonserver, 45 MB) need not travel (a queue that serves carries it in a `wait` call
# and awaits /tmp/wheels/.srv_ready before its first served part).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl, 7 MB;
# the queue copies it to /tmp/wheels), then `wait` calls back to back carrying nothing (no part here needs SmolLM2's
# wheels or py-spy: .whl_s1 / .whl_s2 stay home). Keep each call within 30 s of the last (the machine is released
# after 30 s idle). The parts run from a copy of the tree made by `start` (h200_queue.sh), so later calls cannot
# disturb them. In order of need; what is cut is what comes last.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 31: several prompts' first chunks from one prefill graph (28bf326), prompts kept whole beside them (3b79ab7) and a
# prefill launched before the running step is read (5b11109), none yet on a GPU. The probe times each R x length
# shape against the eager forward of the same prompts (and their hidden states' difference), at a chunk of 4,096
# (2 x 2048, 4 x 1024 ..); then 2048/128 at chunks 4,096 and 2,048 (host ms a step by phase in the JSON). H100
# 2026-12-07: 3,082 / 3,173 (two prompts a step eager then); H200 2026-12-07 3,218 at 2,048 (TensorRT-LLM 3,538).
# TRTLLM_PIPELINE_PREFILL_GRAPHS=0 would be the A/B of the graphs (not queued).
part prefill 200 PREFILL_CHUNK=4096
part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 PREFILL_CHUNK=4096 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part throughput 200 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 1000/1000 at 512 rows: its prefill steps now two whole prompts from the 2 x 1,024 graph (H200 2026-12-07: 14,901,
# TensorRT-LLM 17,744; H100 2026-12-06e: 14,607)
part throughput 300 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=1000/1000 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 31 (H200 only: the goal is an H200's). 1000/1000 in one wave of 1,024 rows: on the H100 (2026-12-07) 13,980
# against 14,607 in two waves of 512, so 128/2048 at 1,024 rows only. The JSON now has each step's host times.
if on_h200; then
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 31: where a 512-row FP8 step of 1000/1000 goes, by kernel (the furthest row: 0.84 of TensorRT-LLM on the H200; a
# step's FP8 GEMMs, lm_head and attention should take ~11-12 ms at 512 rows and ~1,500 tokens, the ITL is 20.9)
part probe 200 LOAD_VARIANT=-fp8kv LENGTHS=1000/1000 REQUESTS=512 SECONDS_=75
# 32: W4A8 and INT4-AWQ steps under the table with the 3-split GLU (H100 2026-12-07: INT4 batch 8 4.619 ms).
part int4_rows 420 FREE_GIB=32
