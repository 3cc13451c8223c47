# LibTorch for a build without CUDA (no nvcc, or SLIDE_CUDA=OFF). PyPI's torch wheel is a CUDA build: its CMake
# package (Caffe2Config.cmake) stops with a fatal error where no CUDA toolkit is installed, yet its CPU library
# runs without one (it loads libcudart and libcupti, which scripts/install-deps.sh then takes from PyPI). So the
# CPU build imports libtorch_cpu and libc10 directly. libtorch.so is left out: it pulls in libtorch_cuda and every
# CUDA library behind it. Sets what find_package(Torch) would: TORCH_INCLUDE_DIRS, TORCH_LIBRARIES,
# TORCH_CXX_FLAGS.
execute_process(  # located without importing torch, which needs every CUDA library
  COMMAND python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
  OUTPUT_VARIABLE SLIDE_TORCH_ROOT RESULT_VARIABLE slide_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT slide_torch_rc EQUAL 0 OR NOT EXISTS "${SLIDE_TORCH_ROOT}/lib")
  message(FATAL_ERROR "LibTorch not found: run scripts/install-deps.sh (installs PyPI torch==2.11.0)")
endif()
find_library(SLIDE_TORCH_CPU_LIBRARY torch_cpu PATHS "${SLIDE_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
find_library(SLIDE_C10_LIBRARY c10 PATHS "${SLIDE_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
set(TORCH_INCLUDE_DIRS "${SLIDE_TORCH_ROOT}/include" "${SLIDE_TORCH_ROOT}/include/torch/csrc/api/include")
set(TORCH_LIBRARIES "${SLIDE_TORCH_CPU_LIBRARY}" "${SLIDE_C10_LIBRARY}")
set(TORCH_CXX_FLAGS "")  # the wheel uses the default (C++11) libstdc++ ABI; its own package adds no flags either
message(STATUS "LibTorch (CPU libraries of the wheel, no CUDA toolkit needed): ${SLIDE_TORCH_ROOT}")
