#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: dependencies, build, short libFuzzer
# runs (tokenizer, request bytes, OpenAI bodies), the sanitizer builds and runs
# (scripts/sanitizers.sh; SANITIZERS=0 skips them), then every CTest test (labels unit and
# integration, plus gpu when a CUDA toolkit exists: those skip without a device, while their
# emulator builds run as unit tests, docs/CUDA_SIM.md). CTest runs last, the integration
# tests beside the others (scripts/ctest_lanes.sh), so its summaries close the output.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
phase() {  # NAME COMMAND...: runs the command and prints how long it took
  local name="$1" start=${SECONDS}
  shift
  "$@"
  echo "test.sh: ${name} took $((SECONDS - start)) s (total $((SECONDS)) s)"
}
# Without a GPU to run them, the CUDA kernels are compiled for one architecture, sm_80, not
# the default two (DCFORMER_CUDA_ARCHITECTURES, 90a;80): nvcc compiles each .cu file once per
# architecture (gemv_int8.cu: 60 s for one, 120 s for both), and the kernels have no
# architecture-specific code, so sm_80, the older one, is the compile that catches an
# intrinsic a kernel may not use on every GPU we support. Its PTX (compute_80) also runs on a
# Hopper by JIT. With a GPU visible (nvidia-smi), the build keeps the project's default.
BUILD_ARGS=()
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  BUILD_ARGS=(-DDCFORMER_CUDA_ARCHITECTURES=80)
  echo "test.sh: no GPU visible: CUDA kernels (if a toolkit exists) built for sm_80 only"
fi
phase "setup and build" bash scripts/build.sh "${BUILD_ARGS[@]}"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
phase "fuzzing" bash tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS}" "${ROOT}/build-fuzz"
if [[ "${SANITIZERS:-1}" != 0 ]]; then
  phase "sanitizers" bash scripts/sanitizers.sh all
fi
source scripts/ctest_lanes.sh
phase "ctest" dcf_ctest_lanes --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
