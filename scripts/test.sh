#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: dependencies, build, every CTest test
# (labels unit, integration, gpu; GPU tests skip visibly without a device), then a short
# libFuzzer run of the tokenizer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
bash tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS}" "${ROOT}/build-fuzz"
