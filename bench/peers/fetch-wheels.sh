#!/usr/bin/env bash
# The packages the peers need that the GPU box lacks (DeepSpeed's, PEFT's, bitsandbytes for QLoRA), for its Python
# 3.12, into DIR (default .peer-wheels, ignored by git): carry DIR to the box; bench/run_gpu.sh installs them.
set -euo pipefail
dir=${1:-.peer-wheels}
mkdir -p "$dir"
pip download --no-deps --no-binary :all: -d "$dir" deepspeed
pip download --only-binary :all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --no-deps -d "$dir" \
  hjson msgpack ninja py-cpuinfo "pydantic>=2" pydantic-core annotated-types typing-inspection einops nvidia-ml-py \
  psutil typing_extensions numpy packaging tqdm setuptools wheel
pip download --only-binary :all: --python-version 3.12 --platform manylinux_2_24_x86_64 --no-deps -d "$dir" \
  peft==0.21.2 accelerate==1.16.0 bitsandbytes==0.50.2
# The box's torch is built for CUDA 13.0: keep bitsandbytes' CUDA 13 libraries only (43 MB -> a few MB), so the
# wheels and .gpu-debs fit the device tool's 64 MiB together.
python3 "$(dirname "$0")/../../scripts/slim_wheel.py" "$dir"/bitsandbytes-*.whl 'libbitsandbytes_(rocm|xpu|cuda1[12]|cuda13[1-9])'
