# Session 46's queue (~13 minutes of the 30; the rest kept for a second call): W4A8's warp-specialized batch-1 GEMV
# (quant_gemv_w4a8_ws, new: compiled on the CPU only) checked and timed, first alone, then in the 7B step.
# `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/w4a8-ws.sh` carrying .whl, then `wait` calls.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
if on_h200; then
  # 31: the goal's rows on the goal's GPU (last there 2026-12-07: 500/2000 20,443, 1000/1000 14,901, 2048/2048
  # 11,989; H100 since: 1000/1000 17,876, 500/2000 21,529)
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 \
    SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 32: each W4A8 launch of the 7B at batch 1, today's kernel (new) against the warp-specialized one (ws) and its
# variants, each checked against float32 x @ W^T and the dot kernel (H100 2026-12-07f under ncu: the GLU 50.4 us, DRAM
# 49%, the INT4 GEMV's 30.1 at 72%)
part w4a8_kernels 240 W4A8_GEMV_VARIANTS=new,ws
# 32: the step with it (batch 1 checked against eager now too; H100 2026-12-07f without it: W4A8 3.567 / 4.729 /
# 7.906 / 10.271 ms at batch 1 / 8 / 32 / 64; prefill INT4 1.28x BF16's, W4A8 1.33x before the pair fix)
# (only where every launch above was within its bounds: a wrong or hung kernel is not timed in a step)
if grep -q "end w4a8_kernels rc=0 " "$q/summary.txt"; then
  part quant_gemm 330 QG_PARTS=steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16 TRTLLM_PIPELINE_W4A8_WS=1
else
  part quant_gemm 330 QG_PARTS=steps QUANT_FORMATS=w4a8_awq,int4_awq,bf16
fi
# 32: INT4 steps with the GEMMs' input scaled by the norm (default since 2026-12-07; H100 2026-12-07f with the scales
# in the K loop: 2.144 / 4.454 / 5.300 ms at batch 1 / 8 / 16)
part quant_gemm 200 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq
