#!/usr/bin/env bash
# Installs the system dependencies (idempotent) and builds everything into build/.
# Usage: scripts/build.sh [extra cmake configure args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
