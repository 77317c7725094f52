# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing but the first of them, which carries .gpu_data (written beforehand where
# the MMLU/GSM8K release is: `python tools/accuracy_subset.py --data-dir ../shared/data`; `wait` copies it to
# /tmp/gpu_data for the accuracy part). Keep each call within 30 s of the last (the machine is released after 30 s
# idle). In order of need; what is cut is what comes last. On an H100 instead of the H200 every part below still
# carries its own baseline but the 128/2048 throughput (an H200 goal): move it last there.
# 30: the served 7B FP8 (H100 2026-12-06, the same queue's part with one BLS process: c=64 8,091 tokens/s, TTFT p50 187
# / p90 1,186 ms with the engine's mean TTFT 26 ms and 34 of 64 rows a step; 2026-12-05e 11,233 with 54 rows): cold
# start, bench, in-process in the same call. Four BLS processes were worse (c=64 4,589, 9.6 ms a step): one stays.
# Now 384 requests a level (six waves at c=64: steady state, the first wave's 64 simultaneous prompts amortized), and
# the level's "in front" columns (Triton's queue, the BLS to its socket, the socket to the engine, the BLS's first
# response: where the 1.4 s went), with the BLS's kept threads (triton/workers)
part served 480 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench inprocess" SERVED_REQUESTS=384 SERVED_DEADLINE_S=240
# 30: the A/B of the client's kept gRPC stream (5111e42, between the two runs above): a stream per request
part served 200 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES=bench TRTLLM_PIPELINE_GRPC_STREAM_PER_REQUEST=1 SERVED_REQUESTS=384 SERVED_DEADLINE_S=240
# 35: SmolLM2's prompt lookup with verify buckets of b x (1 + k) rows (H100 2026-12-06: a lone request's 9 rows ran in
# bucket 72, ~0.98 ms a verify step by the run's totals against 0.79 timed at 9; grounded 1.27x, acceptance 2.81)
await /tmp/smolw/ready 60
# (and the open workload, new: open-ended requests with nothing to copy, where speculation must stay within 3% of
# plain decoding)
part spec 300 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_TREE_NODES=0 SPEC_MAIN=smollm2
# 30: the A/B of waiting for fast room (the default) on the same warm kernel cache: no waiting (an eager forward at
# once); H100 2026-12-06 reached only its c=1 (TTFT p50 10.5 ms, ITL 3.1)
part served 200 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES=bench TRTLLM_PIPELINE_PREFILL_WAIT=0 SERVED_REQUESTS=384 SERVED_DEADLINE_S=240
# 35: the random 7B's verify costs and prompt lookup, device against host drafting
part spec 360 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_TREE_NODES=0
# 33: the eager forward's logits now float32 on CUDA (they were rounded to bfloat16: every GPU log-likelihood a multiple
# of 0.125 from its item's others); each format's bfloat16 fast path against its own float32 on the same bytes
await /tmp/gpu_data/subset.json 60
part accuracy 420 WHEELS=/tmp/smolw ACCURACY_DATA=/tmp/gpu_data ACCURACY_CALIBRATION=float32 SMOLLM2_FORMATS="fp8 int4-awq w4a8-awq nvfp4" ACCURACY_F32=1 ACCURACY_F32_FORMATS="bf16 fp8 int4-awq w4a8-awq nvfp4"
# 31: 128/2048 at 512 rows with the FP8 pool at steady state (H200 2026-12-05d: 25,461 tok/s over 1,500 requests,
# against TensorRT-LLM's published 26,221; the issue asks for ~3,000)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 31: the prefill-bound rows (1000-token prompts fit a fast step beside few decodes; 2048-token ones now from the
# prefill graphs: H200 2026-12-05 2,635 / 2,368 output tokens/s at 2048/128, 12,633 at 1000/1000)
part throughput 300 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 32: the whole 7B W4A8-AWQ step at batch 1 with the GLU at 32 rows a program (H100 2026-12-05e: the four launches x
# 28 layers 3.075 -> 2.603 ms with the new rule, ~2.26 with the sweep's best; H200 2026-12-05d step 4.288 ms)
part w4a8_gemv 360 CLEAN=1 GEMV_BATCH=1 GEMV_CONTEXT=128
part w4a8_kernels 120
part quant_gemm 300 KERNEL_SWEEP_S=120 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part modelcheck 150 WHEELS=/tmp/smolw SMOLLM2_FORMATS="fp8-fp8kv fp8"
part int4_rows 420
part prefix 200
