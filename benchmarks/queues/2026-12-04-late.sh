# 2026-12-04, the session's last device time (~440 s): `WAIT_S=15 bash benchmarks/h200_queue.sh start
# benchmarks/queues/2026-12-04-late.sh` (carry .whl), two short `WAIT_S=3 ... wait` calls carrying .whl_s1 and
# .whl_s2, then `wait` calls carrying nothing. In order of need.
# 30: short prompts prefilled as rows of a fast step (c=32 5,753 tok/s and c=64 9,183 before: a 128-token eager
# prefill ~27 ms of host launches every ~8 steps), greedy bans without a logits copy (c=1 ITL 3.25 ms vs 2.50),
# decode steps left running while the loop streams (in-process with and without)
part served 220 TRTLLM_PIPELINE_STREAM_COALESCE=1 SKIP_GENERATE=1 SERVED_PHASES="cold bench inprocess inprocess_sync"
# 33: SmolLM2 BF16 answered wrong on the GPU (FP8 right): which path parts, and whether the checkpoint made there
# differs from the one made on a CPU
await /tmp/smolw/ready 60
part modelcheck 120 WHEELS=/tmp/smolw
# 35: prompt lookup on the real model (FP8: right answers) after the speculative loop's host work was cut
part spec 100 WHEELS=/tmp/smolw SPEC_BATCHES=1
# 30/31: the fast-step prefill by length, the fused layers' first-layer agreement (on the served build)
part prefill 120 PREFILL_SERVED_BUILD=1
