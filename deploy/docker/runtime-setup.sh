#!/usr/bin/env bash
# The runtime stage of deploy/Dockerfile and deploy/Dockerfile.cuda, after build.sh's prefix
# was copied in: checks that the binaries and the CUDA backend plugin find every library they
# load (bundled ones in PREFIX/lib, the rest from the base image), that the binaries run, and
# creates the non-root user the image runs as (uid 10001).
#
# Usage: runtime-setup.sh PREFIX [--cuda] [--no-user]
#   --cuda     the CUDA image: the libraries of the CUDA runtime image count as provided, and
#              PREFIX/lib/libdcformer_cuda_plugin.so (which the binaries dlopen, so ldd of
#              them does not show it) must be there and resolve
#   --no-user  only check (the test suite checks a prefix built on this machine)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${HERE}/runtime-libs.sh"

PREFIX="${1:?usage: runtime-setup.sh PREFIX [--cuda] [--no-user]}"
shift
CUDA=OFF
CREATE_USER=1
while (($#)); do
  case "$1" in
    --cuda) CUDA=ON; shift ;;
    --no-user) CREATE_USER=0; shift ;;
    *) echo "runtime-setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
PREFIX="$(cd "${PREFIX}" && pwd)"
export LD_LIBRARY_PATH="${PREFIX}/lib"

PLUGIN="${PREFIX}/lib/libdcformer_cuda_plugin.so"
FILES=("${PREFIX}/bin/dcformer-server" "${PREFIX}/bin/dcformer-cli")
for f in "${FILES[@]}"; do
  [[ -x "${f}" ]] || { echo "runtime-setup.sh: ${f} missing" >&2; exit 1; }
done
if [[ -f "${PLUGIN}" ]]; then
  FILES+=("${PLUGIN}")
elif [[ "${CUDA}" == ON ]]; then
  # Without it --backend cuda cannot start, and auto would run on the CPU.
  echo "runtime-setup.sh: ${PLUGIN} missing: the CUDA image has no CUDA backend" >&2
  exit 1
fi

status=0
for bin in "${FILES[@]}"; do
  b="$(basename "${bin}")"
  while read -r soname arrow path _; do
    [[ "${arrow}" == "=>" ]] || continue
    if [[ "${path}" == "not" ]]; then
      # In the CUDA image the driver's libraries appear only when a container starts.
      runtime_provided "${soname}" "${CUDA}" && [[ "${soname}" == libcuda.so.* ]] && continue
      echo "runtime-setup.sh: ${b}: ${soname} not found" >&2
      status=1
    elif ! runtime_provided "${soname}" "${CUDA}" && [[ "${path}" != "${PREFIX}/lib/"* ]]; then
      echo "runtime-setup.sh: ${b}: ${soname} comes from ${path}, not from ${PREFIX}/lib" >&2
      status=1
    fi
  done < <(ldd "${bin}")
done
((status == 0)) || exit 1
# They run: both print their usage (absl's --help exits with status 1 by design).
usage="$("${PREFIX}/bin/dcformer-server" --help 2>&1 || true)"
grep -q "serves a DCFormer model" <<<"${usage}" ||
  { echo "runtime-setup.sh: dcformer-server does not run: ${usage}" >&2; exit 1; }
usage="$("${PREFIX}/bin/dcformer-cli" --help 2>&1 || true)"
grep -q "client of dcformer-server" <<<"${usage}" ||
  { echo "runtime-setup.sh: dcformer-cli does not run: ${usage}" >&2; exit 1; }

if ((CREATE_USER)) && ! getent passwd 10001 >/dev/null; then
  useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin dcformer
fi
echo "runtime-setup.sh: ${PREFIX} runs with its bundled libraries"
