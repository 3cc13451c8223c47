#!/usr/bin/env bash
# Installs everything slideformer needs to build and test on Debian 12, unattended and idempotent:
# Debian packages (toolchain, gRPC, protobuf, prometheus-cpp, yaml-cpp, liburing, GoogleTest, Prometheus)
# and LibTorch from PyPI's torch==2.11.0 wheel. The wheel is installed without its ~3 GB of CUDA
# dependencies; only the three shared libraries LibTorch needs to load and that /usr/local/cuda lacks
# (cuSPARSELt, NVSHMEM host, cuFile) come from their PyPI wheels.
set -euo pipefail

TORCH_VERSION=2.11.0
apt_pkgs=(
  build-essential cmake ninja-build ccache pkg-config git python3-pip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libyaml-cpp-dev libcli11-dev liburing-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libicu-dev prometheus tmux openssl
  clang libclang-rt-14-dev  # the libFuzzer targets (tests/fuzz), built and replayed in .ci/run
)

missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# Located without importing torch: `import torch` needs every CUDA library, which a CPU-only box does not have.
TORCH_DIR_PY="import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
have_torch=$($PY -c "import importlib.metadata as m, sys; sys.stdout.write(m.version('torch'))" 2>/dev/null || true)
if [[ "$have_torch" != ${TORCH_VERSION}* ]]; then
  echo "install-deps: pip install torch==${TORCH_VERSION} (LibTorch only, no CUDA wheels)"
  pip_flags=(-q --disable-pip-version-check --no-cache-dir)
  # PEP 668 system pythons refuse plain installs; pyenv/venv pythons ignore the flag.
  $PY -m pip install "${pip_flags[@]}" --help 2>/dev/null | grep -q break-system-packages &&
    pip_flags+=(--break-system-packages)
  $PY -m pip install "${pip_flags[@]}" --no-deps "torch==${TORCH_VERSION}" \
    "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5" "nvidia-cufile==1.15.1.6"
  $PY -m pip install "${pip_flags[@]}" filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec
fi
# Without a CUDA toolkit (no nvcc) the build is CPU-only (cmake/TorchWithoutToolkit.cmake): libtorch_cpu still
# loads libcudart and libcupti, which then come from their PyPI wheels (into torch's RPATH, nvidia/cu13/lib).
if ! nvcc --version >/dev/null 2>&1 && ! /usr/local/cuda/bin/nvcc --version >/dev/null 2>&1; then
  cu13=$($PY -c "$TORCH_DIR_PY")/../nvidia/cu13/lib
  if [ ! -e "$cu13/libcudart.so.13" ] || [ ! -e "$cu13/libcupti.so.13" ]; then
    echo "install-deps: no CUDA toolkit; pip install the CUDA runtime and CUPTI libraries LibTorch's CPU part loads"
    pip_flags=(-q --disable-pip-version-check --no-cache-dir)
    $PY -m pip install "${pip_flags[@]}" --help 2>/dev/null | grep -q break-system-packages &&
      pip_flags+=(--break-system-packages)
    $PY -m pip install "${pip_flags[@]}" --no-deps "nvidia-cuda-runtime==13.0.96.*" "nvidia-cuda-cupti==13.0.85.*"
  fi
fi
echo "install-deps: torch $($PY -c "import importlib.metadata as m; print(m.version('torch'))") at $($PY -c "$TORCH_DIR_PY")"
