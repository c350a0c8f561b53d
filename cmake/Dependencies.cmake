# System dependencies, all from Debian 12 packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# OpenBLAS (dcf_blas) is what code outside the CPU backend links for host GEMMs (the CPU
# backend has its own kernels; dcformer-matmul-bench compares them with it). Prefer Debian's
# OpenMP build (libopenblas0-openmp): its GEMMs then share the engine's OpenMP thread pool
# instead of a second set of spinning pthreads, which on a 2-core machine halved decode and
# prefill speed. The build RPATH points at it, so the
# binaries use it whatever the system's libopenblas alternative is.
find_library(DCF_OPENBLAS_OPENMP NAMES openblas libopenblas.so.0
             PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib64/openblas-openmp
             NO_DEFAULT_PATH)
add_library(dcf_blas INTERFACE)
if(DCF_OPENBLAS_OPENMP)
  target_include_directories(dcf_blas INTERFACE ${OPENBLAS_INCLUDE_DIRS})
  target_link_libraries(dcf_blas INTERFACE ${DCF_OPENBLAS_OPENMP})
  message(STATUS "dcformer: OpenBLAS (OpenMP threading) ${DCF_OPENBLAS_OPENMP}")
else()
  target_link_libraries(dcf_blas INTERFACE PkgConfig::OPENBLAS)
  message(STATUS "dcformer: OpenBLAS (pthreads) ${OPENBLAS_LINK_LIBRARIES}")
endif()
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
if(DCFORMER_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(benchmark QUIET)
endif()

# CUDA toolkit: optional (DCFORMER_CUDA=AUTO|ON|OFF). Look in the standard place so a plain
# `cmake -S . -B build` finds it; without one, everything builds for the CPU (the CUDA code
# still builds and runs against the SIMT emulator, cmake/Cuda.cmake).
# The GPU architectures are the project's choice, not nvcc's default: sm_90a (Hopper, with its
# arch-specific features) plus sm_80. DCFORMER_CUDA_ARCHITECTURES is the one knob; it
# overrides CMAKE_CUDA_ARCHITECTURES, whose cache entry would otherwise keep whatever the first
# configure of a build tree found (nvcc's default, 75).
set(DCFORMER_CUDA_ARCHITECTURES "90a;80" CACHE STRING
    "CUDA architectures of the real CUDA build (CMAKE_CUDA_ARCHITECTURES syntax)")
# ON when scripts/build.sh chose DCFORMER_CUDA_ARCHITECTURES=80 for a machine without a GPU (it
# says why); it restores the default when a GPU is visible.
set(DCF_GPU_LESS_ARCHITECTURES OFF CACHE BOOL
    "DCFORMER_CUDA_ARCHITECTURES chosen by scripts/build.sh for a machine without a GPU")
set(DCFORMER_HAVE_CUDA OFF)
if(NOT DCFORMER_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(DEFINED CACHE{CMAKE_CUDA_ARCHITECTURES} AND
       NOT "$CACHE{CMAKE_CUDA_ARCHITECTURES}" STREQUAL "${DCFORMER_CUDA_ARCHITECTURES}")
      message(STATUS "dcformer: CMAKE_CUDA_ARCHITECTURES=$CACHE{CMAKE_CUDA_ARCHITECTURES} is "
                     "replaced by DCFORMER_CUDA_ARCHITECTURES=${DCFORMER_CUDA_ARCHITECTURES} "
                     "(set -DDCFORMER_CUDA_ARCHITECTURES=... to change it)")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES "${DCFORMER_CUDA_ARCHITECTURES}" CACHE STRING
        "Set by DCFORMER_CUDA_ARCHITECTURES" FORCE)
    enable_language(CUDA)
    # nvcc >= 12 compiles C++20 (with g++ >= 10), but CMake 3.25 does not know the flag; teach
    # it, so that .cu files use the same dialect as the project's C++ (CXX_STANDARD 20).
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND
       CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(DCFORMER_HAVE_CUDA ON)
  elseif(DCFORMER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DCFORMER_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
# The CUDA language is enabled when a toolkit is found so CUDA sources compile in CI; the CUDA
# backend itself is not written yet (the engine runs on the CPU backend).
if(DCFORMER_HAVE_CUDA)
  message(STATUS "dcformer: CUDA toolkit ${CUDAToolkit_VERSION}, architectures "
                 "${DCFORMER_CUDA_ARCHITECTURES}")
else()
  message(STATUS "dcformer: no CUDA toolkit: CUDA code builds for the SIMT emulator only")
endif()
