#!/usr/bin/env bash
# Installs the system dependencies (idempotent) and builds everything into build/.
# Usage: scripts/build.sh [extra cmake configure args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/setup.sh
source scripts/cmake_generator.sh
# Without a GPU to run them, the CUDA kernels (when a toolkit exists) are compiled for one
# architecture, sm_80, not the default two (DCFORMER_CUDA_ARCHITECTURES, 90a;80): nvcc
# compiles each .cu file once per architecture (gemv_int8.cu: 60 s for sm_80, about twice
# that for both), and the kernels have no architecture-specific code, so sm_80, the older
# one, is the compile that refuses what only Hopper has; its PTX (compute_80) also runs on a
# Hopper by JIT. Only a new tree gets it (no list cached yet), and the tree remembers that
# this script chose it (DCF_GPU_LESS_ARCHITECTURES): with a GPU visible, the next run restores
# the default. A list already in the tree, or passed by hand, is left alone.
gpu_visible() {  # reads nvidia-smi's whole output (grep -q would end it early: SIGPIPE)
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU' >/dev/null
}
cached() {  # the build tree's cached value of $1, if any
  if [[ -f build/CMakeCache.txt ]]; then sed -n "s/^$1:[A-Z]*=//p" build/CMakeCache.txt; fi
}
ARCH_ARGS=()
if [[ " $* " == *DCFORMER_CUDA_ARCHITECTURES* ]]; then
  ARCH_ARGS=(-DDCF_GPU_LESS_ARCHITECTURES=OFF)  # your list
else
  archs=$(cached DCFORMER_CUDA_ARCHITECTURES)
  ours=0
  if [[ "$(cached DCF_GPU_LESS_ARCHITECTURES)" == ON && "${archs}" == 80 ]]; then ours=1; fi
  if ! gpu_visible; then
    if [[ -z "${archs}" || ${ours} == 1 ]]; then
      ARCH_ARGS=(-DDCFORMER_CUDA_ARCHITECTURES=80 -DDCF_GPU_LESS_ARCHITECTURES=ON)
      echo "build.sh: no GPU visible: CUDA kernels (when a toolkit exists) built for sm_80 only"
    fi
  elif [[ ${ours} == 1 ]]; then
    ARCH_ARGS=(-UDCFORMER_CUDA_ARCHITECTURES -UDCF_GPU_LESS_ARCHITECTURES)
  fi
fi
# shellcheck disable=SC2046  # the -G flag is two words or none
cmake -S . -B build $(dcf_generator_args build) -DCMAKE_BUILD_TYPE=Release "${ARCH_ARGS[@]}" "$@"
cmake --build build -j"$(nproc)"
