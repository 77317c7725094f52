# First `bash tools/gpu_wheels.sh` where .whl is missing (git-ignored: a fresh checkout lacks it). No part serves.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` carrying .whl, then `wait` calls back to
# back (each within 30 s of the last). In order of need; what is cut is what comes last.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
# the K/V write kernel now also quantizes an E4M3 pool's keys and values and returns what its readers see (the eager
# spelling took ~8 elementwise launches a layer more): against the eager spelling on this GPU, rc 1 if it differs
part kv_write 60
# On an H200 the goal's rows first (the device budget cuts what comes last), then 2048/128; on an H100 the kernel
# timings and 2048/128 with its probe.
if on_h200; then
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 360 LOAD_VARIANT=-fp8kv MAX_BATCHES=1024 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1
else
  # the key loop without masks on whole tiles (FP8 at 128 keys 1,229 -> 869 instructions a thread by sm_90 SASS): the
  # module's launch as the step makes it, against h100-2026-12-07b's attention-step-* on the same shapes (FP8 512 x
  # 2048: 483 us a layer, BF16 700)
  part attention 60 ATTN_STEP=1 ATTN_KV=fp8 ATTN_BATCHES=64,128,256,512 ATTN_CONTEXTS=1024,2048
  part attention 40 ATTN_STEP=1 ATTN_KV=bf16 ATTN_BATCHES=256,512 ATTN_CONTEXTS=1024,2048
  # 31: the five rows with the decode attention's changes (no L2 prefetch at load, one split storing its output),
  # cuBLAS's outputs uncopied, the prefill's K/V write in one launch and its tokens staged in pinned memory. H100
  # 2026-12-07c: 1000/1000 17,876 (TensorRT-LLM's H200 row 17,744); H200 2026-12-07, before all of them: 128/2048 25,045
  # (at 512 rows), 500/2000 20,443, 1000/1000 14,901, 2048/2048 11,989, 2048/128 3,218. On an H100 the goal's rows are
  # not the goal's GPU: 2048/128 and 1000/1000 only (A/B against h100-2026-12-07b).
  # (and batch 1 after it, which these changes leave as it was: the prefetch stays below 64 rows, batch 1 splits its
  # keys; FP8 2.62-2.75 ms a step)
  part throughput 330 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=2048/128 REQUESTS=1000 SKIP_LONG_PROMPT=1
  # where a 2048/128 step in steady state goes (one prompt and ~128 decode rows; H100 2026-12-07c: 37-39 ms a step
  # where its kernels add to ~34): its kernels and how busy the GPU was between them
  part probe 120 LOAD_VARIANT=-fp8kv LENGTHS=2048/128 REQUESTS=512 SECONDS_=40 TRACE_AFTER=20
  # the FP8 pool's key tile at load (~2.2 TB/s against BF16's ~3.0 on the H100): the sweep, now with 128-key tiles
  # unpipelined and at 8 warps
  part attention 90 ATTN_KV=fp8 ATTN_BATCHES=256,512 ATTN_CONTEXTS=2048
fi
