# The next device time (bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh, then `wait` calls back to back,
# each carrying .whl: a call that does not carry it finds it gone), in order of need. Each part's deadline fits the
# session's 30 minutes only in part: what is cut is what comes last.
# 31: the 256-row step on cuBLAS and the grouped prefill attention (probe), then the table's first row
part probe 240 SECONDS_=60 REQUESTS=512
part throughput 360 LENGTHS=128/2048 REQUESTS=1000 SKIP_LONG_PROMPT=1
# 30: coalesced streaming, every load under a deadline that keeps the stacks
part served 330 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVED_PHASES="cold hangcheck bench spy warm"
# 35: speculation (verify buckets now at most 256 rows)
part spec 300
part prefix 200
# 32: the GEMM candidates (dequant + cuBLAS, int_mm, wider tiles), then the steps with the new table
part quant_gemm 360 QG_PARTS=kernels
part throughput 300 LENGTHS=none SKIP_BATCH1=1
