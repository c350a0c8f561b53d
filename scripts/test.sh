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
phase "setup and build" bash scripts/build.sh
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
phase "fuzzing" bash tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS}" "${ROOT}/build-fuzz"
if [[ "${SANITIZERS:-1}" != 0 ]]; then
  phase "sanitizers" bash scripts/sanitizers.sh all
fi
source scripts/ctest_lanes.sh
phase "ctest" dcf_ctest_lanes --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
