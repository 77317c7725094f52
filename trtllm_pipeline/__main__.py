from trtllm_pipeline.cli import main

if __name__ == "__main__":  # not again in a spawned process (bench's client processes)
    main()
