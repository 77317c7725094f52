# Session 46's queue: the warp-specialized batch-1 GEMVs of W4A8-AWQ and INT8 (quant_gemv_w4a8_ws,
# quant_gemv_int8_ws; new, compiled on the CPU only) checked and timed alone at the 7B's launches, then in the 7B step
# where their check passed. `WAIT_S=15 bash benchmarks/h200_queue.sh start benchmarks/queues/w4a8-ws.sh` carrying
# .whl, then `wait` calls.
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; }
if on_h200; then
  # 31: the goal's rows on the goal's GPU (last there 2026-12-07: 500/2000 20,443, 1000/1000 14,901, 2048/2048
  # 11,989; H100 since: 1000/1000 17,876, 500/2000 21,529)
  part throughput 540 LOAD_VARIANT=-fp8kv MAX_BATCHES=512 LENGTHS="1000/1000 500/2000 2048/2048" REQUESTS=1000 \
    SKIP_LONG_PROMPT=1 SKIP_BATCH1=1
fi
# 32: each batch-1 launch of the 7B, today's kernel (new) against the warp-specialized one (ws) and its neighbours,
# each checked against float32 x @ W^T and the tensor-core kernel (H100 2026-12-07f under ncu: W4A8's GLU 50.4 us at
# DRAM 49%, INT4's warp-specialized 30.1 at 72%)
part w4a8_kernels 200 W4A8_GEMV_VARIANTS=new,ws
part w4a8_kernels 150 W4A8_GEMV_VARIANTS=new,ws GEMV_FORMAT=int8_wo
part w4a8_kernels 150 W4A8_GEMV_VARIANTS=new,ws GEMV_FORMAT=int8_sq
# 32: the steps with each kernel whose launches all passed (batch 1 checked against eager too). H100 2026-12-07f
# without: W4A8 3.567 / 4.729 / 7.906 / 10.271 ms at batch 1 / 8 / 32 / 64; prefill W4A8 1.33x BF16's before the
# fused prefill's pair fix
w4a8_ok=0; int8_ok=0
grep -q "end w4a8_kernels rc=0 " <(sed -n '/W4A8_GEMV_VARIANTS=new,ws$/,/end w4a8_kernels/p' "$q/summary.txt") && w4a8_ok=1
grep -q "end w4a8_kernels rc=0 " <(sed -n '/GEMV_FORMAT=int8_wo$/,/end w4a8_kernels/p' "$q/summary.txt") && int8_ok=1
grep -q "end w4a8_kernels rc=0 " <(sed -n '/GEMV_FORMAT=int8_sq$/,/end w4a8_kernels/p' "$q/summary.txt") || int8_ok=0
stamp "switches from the checks: TRTLLM_PIPELINE_W4A8_WS=$w4a8_ok TRTLLM_PIPELINE_INT8_WS=$int8_ok"
part quant_gemm 360 QG_PARTS=steps QUANT_FORMATS=w4a8_awq,int8_wo,int8_sq,bf16 TRTLLM_PIPELINE_W4A8_WS=$w4a8_ok \
  TRTLLM_PIPELINE_INT8_WS=$int8_ok
# INT8's steps without its warp-specialized GEMV (the A/B; W4A8's "without" is 2026-12-07f's, same kind of GPU)
on_h200 || part quant_gemm 200 QG_PARTS=steps QUANT_FORMATS=int8_wo,int8_sq
