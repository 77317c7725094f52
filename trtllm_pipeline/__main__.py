from trtllm_pipeline.cli import main

main()
