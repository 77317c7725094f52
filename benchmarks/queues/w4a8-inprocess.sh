# 32: W4A8-AWQ batch 1 through the pipeline (bench --in-process, the measure) with the warp-specialized GEMV
part w4a8_gemv 420 GEMV_BATCH=1 GEMV_CONTEXT=128,2048 TRTLLM_PIPELINE_W4A8_WS=1
