# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last). In order of need; what is cut is what comes last.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# 31: a loaded step's decode attention (the probe, H100 2026-12-07: 10.5 of ~21 ms at 512 rows of 1000/1000, ~1.8
# TB/s of KV). The launch against its variants: the L2 prefetch before the PDL wait at every batch (it now stops at
# 64 rows: 0.7 GB a layer of keys and values against 50 MB of L2) and the combine launch at one split (now stored by
# the attention programs); the output's bits compared too.
part attention 150 ATTN_STEP=1 ATTN_KV=fp8 ATTN_BATCHES=64,128,256,512 ATTN_CONTEXTS=1024,2048
part attention 100 ATTN_STEP=1 ATTN_KV=bf16 ATTN_BATCHES=256,512 ATTN_CONTEXTS=1024,2048
# the whole runs with both (H100 2026-12-07: 1000/1000 15,829 at 512 rows; 2026-12-06e: 500/2000 18,980)
part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=1000/1000 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part throughput 200 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=500/2000 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
if on_h200; then  # the goal's rows on its GPU (H200 2026-12-07: 128/2048 at 1,024 rows 0.955 of TensorRT-LLM)
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
part probe 200 LOAD_VARIANT=-fp8kv LENGTHS=1000/1000 REQUESTS=512 SECONDS_=75
