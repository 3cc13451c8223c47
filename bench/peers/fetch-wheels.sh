#!/usr/bin/env bash
# The packages DeepSpeed needs that the GPU box lacks, for its Python 3.12, into DIR (default .peer-wheels, ignored
# by git): carry DIR to the box and `bench/run_gpu.sh peers` installs them into /tmp/ds-site.
set -euo pipefail
dir=${1:-.peer-wheels}
mkdir -p "$dir"
pip download --no-deps --no-binary :all: -d "$dir" deepspeed
pip download --only-binary :all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --no-deps -d "$dir" \
  hjson msgpack ninja py-cpuinfo "pydantic>=2" pydantic-core annotated-types typing-inspection einops nvidia-ml-py \
  psutil typing_extensions numpy packaging tqdm setuptools wheel
