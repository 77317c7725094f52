# 32: INT8 weight-only batch 1 through the pipeline with the warp-specialized GEMV (H100 2026-12-05: 3.206 ms with
# the register kernel, context 128)
part int8_gemv 300 INT8_FORMATS=int8-wo GEMV_BATCH=1 GEMV_CONTEXT=128 TRTLLM_PIPELINE_INT8_WS=1
