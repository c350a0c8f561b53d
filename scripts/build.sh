#!/usr/bin/env bash
# Installs the system dependencies (idempotent) and builds everything into build/.
# Usage: scripts/build.sh [extra cmake configure args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/setup.sh
source scripts/cmake_generator.sh
# shellcheck disable=SC2046  # the -G flag is two words or none
cmake -S . -B build $(dcf_generator_args build) -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
