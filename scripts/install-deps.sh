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

# SLIDE_DEPS=image (docker/Dockerfile's build stage): what building slided and slidectl needs, without the test,
# fuzzing and monitoring tools.
if [ "${SLIDE_DEPS:-all}" = image ]; then
  apt_pkgs=(
    build-essential cmake ninja-build ccache pkg-config git python3-pip
    libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
    prometheus-cpp-dev libyaml-cpp-dev libcli11-dev liburing-dev
    nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libicu-dev
  )
fi

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
pip_flags=(-q --disable-pip-version-check --no-cache-dir)
# PEP 668 system pythons refuse plain installs; pyenv/venv pythons ignore the flag.
$PY -m pip install --help 2>/dev/null | grep -q break-system-packages && pip_flags+=(--break-system-packages)

# SLIDE_CUDA_FROM_PYPI=1 (docker/Dockerfile): no CUDA toolkit on the machine, so the whole CUDA build comes from
# PyPI: torch with every CUDA library wheel it loads (cuBLAS, cuDNN, NCCL, ...: what the GPU build runs on), nvcc
# with its crt/nvvm/cccl wheels (the cuda-toolkit meta-package pins them to one release), and a CMake >= 3.26
# (Debian's 3.25 FindCUDAToolkit fails without nvToolsExt). The toolkit root is torch's nvidia/cu13 folder; printed
# last as `install-deps: CUDA toolkit at DIR`.
if [ "${SLIDE_CUDA_FROM_PYPI:-0}" = 1 ]; then
  echo "install-deps: pip install torch==${TORCH_VERSION} with its CUDA libraries, nvcc and CMake from PyPI"
  $PY -m pip install "${pip_flags[@]}" "torch==${TORCH_VERSION}" "cuda-toolkit[nvcc,crt,nvvm,cccl]==13.0.2" \
    "cmake==3.31.6"
  cuda_root=$($PY -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), '..', 'nvidia', 'cu13'))")
  cuda_root=$(cd "$cuda_root" && pwd)
  # The wheels ship lib/ and versioned sonames only; FindCUDAToolkit looks for lib64/ and libX.so.
  [ -e "$cuda_root/lib64" ] || ln -s lib "$cuda_root/lib64"
  for so in "$cuda_root"/lib/lib*.so.[0-9]*; do
    link=${so%%.so.*}.so
    [ -e "$link" ] || ln -s "$(basename "$so")" "$link"
  done
fi

# Located without importing torch: `import torch` needs every CUDA library, which a CPU-only box does not have.
TORCH_DIR_PY="import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
have_torch=$($PY -c "import importlib.metadata as m, sys; sys.stdout.write(m.version('torch'))" 2>/dev/null || true)
if [[ "$have_torch" != ${TORCH_VERSION}* ]]; then
  echo "install-deps: pip install torch==${TORCH_VERSION} (LibTorch only, no CUDA wheels)"
  $PY -m pip install "${pip_flags[@]}" --no-deps "torch==${TORCH_VERSION}" \
    "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5" "nvidia-cufile==1.15.1.6"
  $PY -m pip install "${pip_flags[@]}" filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec
fi
# The Grafana dashboard's schema check (tests: Deploy.GrafanaDashboardMatchesGrafanasSchema): Grafana's models for
# the release deploy/docker-compose.yml runs, pure Python.
if [ "${SLIDE_DEPS:-all}" != image ] &&
  ! $PY -c "import grafana_foundation_sdk, yaml" 2>/dev/null; then
  echo "install-deps: pip install the Grafana Foundation SDK (Grafana 11.1's schema) and PyYAML"
  $PY -m pip install "${pip_flags[@]}" --no-deps "grafana-foundation-sdk==1769699681!11.1.0" pyyaml
fi
# Without a CUDA toolkit (no nvcc) the build is CPU-only (cmake/TorchWithoutToolkit.cmake): libtorch_cpu still
# loads libcudart and libcupti, which then come from their PyPI wheels (into torch's RPATH, nvidia/cu13/lib).
if [ "${SLIDE_CUDA_FROM_PYPI:-0}" != 1 ] && ! nvcc --version >/dev/null 2>&1 &&
  ! /usr/local/cuda/bin/nvcc --version >/dev/null 2>&1; then
  cu13=$($PY -c "$TORCH_DIR_PY")/../nvidia/cu13/lib
  if [ ! -e "$cu13/libcudart.so.13" ] || [ ! -e "$cu13/libcupti.so.13" ]; then
    echo "install-deps: no CUDA toolkit; pip install the CUDA runtime and CUPTI libraries LibTorch's CPU part loads"
    $PY -m pip install "${pip_flags[@]}" --no-deps "nvidia-cuda-runtime==13.0.96.*" "nvidia-cuda-cupti==13.0.85.*"
  fi
fi
echo "install-deps: torch $($PY -c "import importlib.metadata as m; print(m.version('torch'))") at $($PY -c "$TORCH_DIR_PY")"
[ "${SLIDE_CUDA_FROM_PYPI:-0}" = 1 ] && echo "install-deps: CUDA toolkit at $cuda_root"
exit 0
