#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: dependencies, build, then dcformer-server on
# the repo's default model (models/dcformer-kjv, a small DCFormer trained on the King James Bible) at 127.0.0.1:50051, Prometheus metrics at
# http://127.0.0.1:9090/metrics. Runs in the foreground; Ctrl-C (SIGINT) or SIGTERM drains
# and exits 0. Extra arguments go to dcformer-server (e.g. --model DIR --port N).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
bash scripts/build.sh
exec build/bin/dcformer-server "$@"
