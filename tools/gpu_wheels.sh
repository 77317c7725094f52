#!/usr/bin/env bash
# The wheels an H200 machine of the device tool lacks (its image has torch, Triton, transformers; no
# ModelOpt, pydantic, tritonclient or PyTriton), for its Python 3.12, into .whl/ (git-ignored), where
# pip can reach PyPI. benchmarks/h200_run.sh installs them there. About 62 MB: PuLP (16 MB) is left
# out and stood in for by benchmarks/gpu_shims, so that everything fits one 64 MiB transfer.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/.whl/" >> .git/info/exclude; }
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  nvidia-modelopt==0.47.0 omegaconf==2.4.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 tritonclient==2.73.0 python-rapidjson==1.25 nvidia-pytriton==0.7.0
du -sh .whl
