# The next device time: `WAIT_S=20 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=5 ... wait` calls carrying .whl_s1 and .whl_s2
# (SmolLM2's wheel in halves, joined by `wait`), then `wait` calls back to back carrying nothing. In order of need;
# what is cut is what comes last.
# 30: served with the fused prefill (2026-12-04: c=32 5641 tok/s, c=64 9061, server 5.65 / 7.09 ms a step where
# in-process batch 32 / 64 took 3.12 / 3.61: a 128-token eager prefill every ~8 steps), the spy phase now kept
part served 330 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVED_PHASES="cold hangcheck bench spy openai inprocess"
# 33/35: the real SmolLM2 on the fast path, then speculation on it (its wheel joined by the third call's wait)
await /tmp/smolw/ready 120
part smollm2 300 WHEELS=/tmp/smolw
part spec 300 WHEELS=/tmp/smolw
# 31/30/32: the fused layers (cuda/prefill) and the masked attention on KV heads repeated: prefill by length, fused or not
part prefill 180
# 31: the table's rows whose prefill share is largest, and the long prompt's worst gap (its later chunks: masked)
part throughput 330 LENGTHS="2048/128 1000/1000" REQUESTS=1000 SKIP_BATCH1=1
# 31: the shared prefix computed once (the scheduler's deferral)
part prefix 200
# 32: prefill from the quantized weights per format, through the fused layers
part quant_gemm 240 QG_PARTS=steps
# 31: the decode attention's launch shape at 64-256 rows (most of a loaded step at 1-2k tokens)
part attention 240
# 30: the engine's responses sent from their own thread (measured on the CPU only)
part served 200 TRTLLM_PIPELINE_OUTBOX_THREAD=1 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVED_PHASES="cold bench"
part throughput 240 LENGTHS=128/2048 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part quant_gemm 200 QG_PARTS=kernels QUANT_FORMATS=int4_awq,w4a8_awq,int8_wo
