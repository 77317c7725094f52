# Session 17's device time (bash benchmarks/h200_queue.sh start benchmarks/queues/2026-12-04.sh), in order of need:
# issue 30 (coalesced streaming: the c=8 check first, then where the time goes at c=64, the table, a warm start),
# 31 (throughput, shared prefix), 32 (4/8-bit GEMMs), 35 (speculation), 33 (the real SmolLM2 on the fast path; its
# wheel comes in two halves with the second and third calls), then 30's plain streaming profiled and soaked.
part served 330 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVED_PHASES="cold hangcheck spy bench warm"
part throughput 420 LENGTHS=128/2048 REQUESTS=1000
part prefix 200
part quant_gemm 420
part spec 300
await /tmp/smolw/ready 240
part smollm2 360 WHEELS=/tmp/smolw
part served 240 SKIP_GENERATE=1 SERVED_PHASES="cold spy soak"
