#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: dependencies, build, then greedy generation on
# the repo's default model (models/dcformer-tiny). Extra arguments go to dcformer-generate.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/build.sh
if [[ $# -eq 0 ]]; then
  set -- --prompt "The quick brown fox" --max-new-tokens 24
fi
exec build/bin/dcformer-generate --model models/dcformer-tiny "$@"
