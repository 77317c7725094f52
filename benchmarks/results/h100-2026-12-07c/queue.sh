# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last). In order of need; what is cut is what comes last.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# The fused prefill's K/V write (one Triton launch, cuda/prefill.write_kv) against the index assignment it replaced,
# compiled on this GPU (BF16 and E4M3 pools; the CPU tests run it through the interpreter)
part kv_write 60
# 31: 1000/1000 at 512 rows with the decode attention's changes (H100 2026-12-07b: 17,479), now also without the
# copies of cuBLAS's outputs (0.8 ms a 512-row step) and with the prefill's K/V write and slices
part throughput 300 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=1000/1000 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# where a 2048/128 step goes (its prefill steps: the graph, the K/V write, the decode rows after it)
part probe 120 LOAD_VARIANT=-fp8kv LENGTHS=2048/128 REQUESTS=512 SECONDS_=45
# 2048/128: the prefill's share (H100 2026-12-07b, before all of these: 3,061 at chunks of 2,048), its tokens and
# tables now staged in pinned memory (a pageable copy waited for the running decode step)
part throughput 150 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
if on_h200; then  # the goal's rows on its GPU (H200 2026-12-07: 128/2048 at 1,024 rows 0.955 of TensorRT-LLM)
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# the FP8 pool's key tile at load (~2.2 TB/s against BF16's ~3.0 on the H100): the sweep, now with 128-key tiles
# unpipelined and at 8 warps
part attention 90 ATTN_KV=fp8 ATTN_BATCHES=256,512 ATTN_CONTEXTS=2048
