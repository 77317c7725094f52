# The session's second device run (after the first queue, benchmarks/queues/next.sh): the same way, carrying nothing.
# 30/31: the fast-step prefill by length and the fused layers' first-layer agreement (the served build)
part prefill 120 PREFILL_SERVED_BUILD=1
# 31: the headline row after the loaded attention shape, the overlapped steps and the logits no longer copied
part throughput 300 LENGTHS=128/2048 REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part prefix 200
