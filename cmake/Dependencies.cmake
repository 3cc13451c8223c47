# Finds the project's dependencies and sets SLIDE_HAVE_CUDA / SLIDE_HAVE_IO_URING.
# Debian 12 packaging notes: protobuf has no CMake config (module mode, before gRPC); liburing is pkg-config only.

# --- LibTorch from the PyPI wheel -------------------------------------------------------------------------
if(NOT Torch_DIR)
  execute_process(
    # Located without importing torch (the import needs every CUDA library; a CPU-only box has none).
    COMMAND python3 -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), 'share', 'cmake'))"
    OUTPUT_VARIABLE SLIDE_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE SLIDE_TORCH_RC)
  if(NOT SLIDE_TORCH_RC EQUAL 0)
    message(FATAL_ERROR "LibTorch not found: run scripts/install-deps.sh (installs PyPI torch==2.11.0)")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${SLIDE_TORCH_PREFIX}")
endif()

# --- CUDA -------------------------------------------------------------------------------------------------
set(SLIDE_HAVE_CUDA OFF)
if(NOT SLIDE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      # A100, RTX 4090 / L40, H100 / H200; override with -DCMAKE_CUDA_ARCHITECTURES
      set(CMAKE_CUDA_ARCHITECTURES 80 89 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flags for nvcc; the kernels need only C++17
    find_package(CUDAToolkit REQUIRED)
    set(SLIDE_HAVE_CUDA ON)
  elseif(SLIDE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SLIDE_CUDA=ON but nvcc was not found")
  endif()
endif()

if(SLIDE_HAVE_CUDA)
  # Caffe2's CUDA module runs a GPU-detection program unless the architectures are given.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  # TorchConfig warns about optional pieces (kineto, NVTX) it does not find; they are not needed.
  find_package(Torch REQUIRED CONFIG)
else()
  include(cmake/TorchWithoutToolkit.cmake)
endif()
# Torch's imported targets add flags (e.g. -D_GLIBCXX_USE_CXX11_ABI) through TORCH_CXX_FLAGS.
separate_arguments(SLIDE_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
# The PyPI libtorch.so / libtorch_cpu.so export their own (static) copy of std::filesystem. Whichever library
# comes first in an executable's DT_NEEDED list wins symbol lookup, and libtorch's copy crashes when called
# from our code (remove_all jumps to address 0). Put the system libstdc++ first so its definitions win.
add_link_options("LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")

find_package(nlohmann_json 3.10 REQUIRED)
# The service: protobuf in module mode (Debian ships no config) before gRPC's config package.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(Threads REQUIRED)
find_package(yaml-cpp REQUIRED)  # 0.7: target yaml-cpp
find_package(CLI11 2.1 CONFIG REQUIRED)  # header-only: target CLI11::CLI11 (slided and slidectl flags)
find_package(prometheus-cpp CONFIG REQUIRED)  # targets prometheus-cpp::core, prometheus-cpp::pull
find_package(PkgConfig REQUIRED)
# Tokenizer: PCRE2 for the pre-tokenizer regexes (Unicode properties), ICU for NFC normalization.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)  # the daemon's /metrics server

set(SLIDE_HAVE_IO_URING OFF)
if(NOT SLIDE_IO_URING STREQUAL "OFF")
  pkg_check_modules(URING IMPORTED_TARGET liburing)
  if(URING_FOUND)
    set(SLIDE_HAVE_IO_URING ON)
  elseif(SLIDE_IO_URING STREQUAL "ON")
    message(FATAL_ERROR "SLIDE_IO_URING=ON but liburing was not found")
  endif()
endif()

if(SLIDE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
