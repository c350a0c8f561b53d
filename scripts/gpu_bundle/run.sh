#!/usr/bin/env bash
# The GPU check (docs/GPU_CHECK.md), from the bundle scripts/gpu-check.sh built:
#   ./run.sh OUTDIR         on a GPU machine: gpu tests, golden CUDA vs CPU, compute-sanitizer,
#                           benchmarks, in under 10 minutes; OUTDIR/gpu-check.{log,json}
#   ./run.sh --self-check   any machine: the bundle's binaries find their libraries in it
# Exit status: 0 passed, 1 a part failed, 3 no GPU here (only the self-check ran), 2 usage.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(command -v python3 || true)"
if [[ -z "${PY}" ]]; then
  echo "run.sh: python3 is needed (standard library only)" >&2
  exit 2
fi
exec "${PY}" "${HERE}/gpu_check.py" "$@"
