# Session 46's second queue (the first: w4a8-ws.sh, results h100-2026-12-07g): W4A8's warp-specialized GEMV with the
# tiles its first launches measured best, in the step against the register kernel on one machine; INT8's step without
# its warp-specialized GEMV (the first queue's A/B part, lost with its machine); INT4's pre-quant fold A/B.
part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq TRTLLM_PIPELINE_W4A8_WS=1
part quant_gemm 150 QG_PARTS=steps QUANT_FORMATS=w4a8_awq TRTLLM_PIPELINE_W4A8_WS=0
part w4a8_kernels 100 W4A8_GEMV_VARIANTS=new,ws
part quant_gemm 200 QG_PARTS=steps QUANT_FORMATS=int8_wo,int8_sq
part quant_gemm 200 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq
part quant_gemm 200 QG_PARTS=rows_steps QUANT_FORMATS=int4_awq TRTLLM_PIPELINE_FOLD_PQS=0
