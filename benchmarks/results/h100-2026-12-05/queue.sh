# The queue for a session lent an H100 (80 GB HBM3, ~3.35 TB/s) rather than the H200: only parts that carry their
# own baseline in the same call (served against in-process; kernel sweeps against today's kernels; the chained
# steps beside the unchained), and the real model's correctness. H200 figures are not compared with these.
part served 420 TRITON_CACHE_DIR=/tmp/triton-cache-a TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVE_READY_S=180 SERVED_PHASES="cold bench spy warm"
part attention 330 ATTN_KV=fp8
part quant_gemm 360 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq KERNEL_SWEEP_S=90
await /tmp/smolw/ready 30
part spec 120 WHEELS=/tmp/smolw SPEC_BATCHES=1
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part modelcheck 150 WHEELS=/tmp/smolw SMOLLM2_FORMATS=fp8-fp8kv
part int8_gemv 480 CLEAN=1
part throughput 200 LENGTHS=128/2048 REQUESTS=500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part throughput 200 TRTLLM_PIPELINE_CHAIN=0 LENGTHS=128/2048 REQUESTS=500 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part int4_rows 420
