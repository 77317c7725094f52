# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 and .whl_s2
# (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then `wait` calls back to back carrying
# nothing. In order of need; what is cut is what comes last.
# the kernels new since the last GPU run (FP8 KV cache, INT8 dp4a GEMV, 512-row buckets) on tiny builds: a failure
# here says which later figures would have come from an eager fallback (the part's log names the kernel)
part smoke 240
# 30: the served start that never became ready (2026-12-04, after short prompts became rows of fast steps, bans lost
# their copy and decode steps were left running; the log was lost). That start was the first part on a fresh machine:
# an empty kernel cache. Each start here has a cache of its own (empty) and 180 s (serving.startup_timeout_s), so a
# slow cold compile shows as its time, not as a hang (the server's log now has each batch bucket's seconds); at the
# deadline the stubs' stacks and the log are kept. In-process: chained decode steps (default), overlap without
# chaining, synchronous.
part served 360 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench inprocess inprocess_nochain inprocess_sync"
# 31: the headline row with chained decode steps (the GPU never waiting for the host between decode steps); its A/B
# without them comes after the FP8 KV cache and the prefill chunk
part throughput 300 LENGTHS=128/2048 REQUESTS=1500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 31: the same row with an FP8 KV cache (its own quantize of the 7B: ModelOpt's KV scales) at 256 and at 512 rows a
# step (half the KV a token: the pool holds them; past 256 rows every linear is cuBLAS's), then its batch 1 (the
# decode kernel's FP8 loads must cost nothing there); its build removed after (disk: the later parts' builds)
part throughput 600 LOAD_VARIANT=-fp8kv MAX_BATCHES="256 512" LENGTHS=128/2048 REQUESTS=1500 SKIP_LONG_PROMPT=1 CLEAN=1
# the prefill-bound rows with the step's whole token budget for prompts (four 2048-token prompts a step instead of
# one; before: 2,635 and 11,050 tokens/s at 2048 a step)
part throughput 300 PREFILL_CHUNK=8192 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# the chained row's A/B: the same without chaining (TRTLLM_PIPELINE_CHAIN=0)
part throughput 240 TRTLLM_PIPELINE_CHAIN=0 LENGTHS=128/2048 REQUESTS=1500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# the decode attention's launch shapes over an FP8 pool (the loaded shape was chosen on BF16 keys)
part attention 240 ATTN_KV=fp8
# 32: INT4-AWQ at batch 2-16 on quant_gemv's several-row GEMV (docs/perf-notes.md, "INT4-AWQ at batch 2-16"): the
# GEMV against today's kernels at M 1/2/4/8/16 for the 7B's four linears, the merged quant_gemm_table.json (copy it
# into the package where its "gemv" rows win), steps at batch 1/8/16 by choice (table, switch, measured)
part quant_gemm 360 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq KERNEL_SWEEP_S=90
# 32: INT8 at batch 1 on the dp4a GEMV against today's kernels (graph replay: SmoothQuant 3.40, weight-only 3.53 ms;
# goal 2.5 ms/step)
part int8_gemv 480 CLEAN=1
# 30: the served start without the fast-step prefill buckets (cold and warm), the A/B of the start either way
part served 240 TRITON_CACHE_DIR=/tmp/triton-cache-b TRTLLM_PIPELINE_FAST_PREFILL=0 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold warm bench"
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
