#!/usr/bin/env bash
# The build stage of deploy/Dockerfile (CPU) and deploy/Dockerfile.cuda: builds dcformer-server
# and dcformer-cli and lays out everything the runtime stage copies, under one prefix:
#
#   PREFIX/bin/dcformer-server, PREFIX/bin/dcformer-cli
#   PREFIX/lib/*.so*          every shared library they load that a bare runtime base image
#                             lacks (gRPC, protobuf, Abseil, OpenBLAS, OpenMP, ...), copied
#                             from this machine under its soname (runtime-libs.sh says
#                             which ones the base image provides)
#   PREFIX/models/NAME/       the model baked in (--model; none with --model "")
#   PREFIX/share/dcformer/    runtime-setup.sh, which the runtime stage runs
#
# The runtime stage runs with LD_LIBRARY_PATH=PREFIX/lib. Build and runtime stages must use
# the same distribution release (the libraries are copied, not reinstalled).
#
# Usage: deploy/docker/build.sh --prefix DIR [--source DIR] [--build-dir DIR] [--cuda]
#                               [--model DIR] [--reuse-build | --configure-only]
#   --cuda         configure with DCFORMER_CUDA=ON (the CUDA toolkit must be installed); the
#                  CUDA libraries themselves are left to the CUDA runtime base image
#   --model DIR    model directory to bake in (default: SOURCE/models/dcformer-tiny; "" = none)
#   --reuse-build  do not configure: build the two targets in an existing, configured build
#                  directory (a no-op when it is up to date; the test suite uses this)
#   --configure-only  stop after configuring (the test suite checks the CUDA image's
#                  configure step this way, with the toolkit installed on CI machines)
set -euo pipefail

SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREFIX=""
BUILD=""
CUDA=OFF
MODEL="__default__"
REUSE=0
CONFIGURE_ONLY=0
while (($#)); do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --cuda) CUDA=ON; shift ;;
    --model) MODEL="$2"; shift 2 ;;
    --reuse-build) REUSE=1; shift ;;
    --configure-only) CONFIGURE_ONLY=1; shift ;;
    *) echo "build.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "${PREFIX}" || ${CONFIGURE_ONLY} == 1 ]] || { echo "build.sh: --prefix is required" >&2; exit 2; }
BUILD="${BUILD:-${SOURCE}/build-image}"
[[ "${MODEL}" == "__default__" ]] && MODEL="${SOURCE}/models/dcformer-tiny"
BINARIES=(dcformer-server dcformer-cli)

source "${SOURCE}/deploy/docker/runtime-libs.sh"

if ((REUSE == 0)); then
  echo "build.sh: configuring ${BUILD} (DCFORMER_CUDA=${CUDA})"
  cmake -S "${SOURCE}" -B "${BUILD}" -DCMAKE_BUILD_TYPE=Release -DDCFORMER_BUILD_TESTS=OFF \
    -DDCFORMER_CUDA="${CUDA}"
fi
[[ -f "${BUILD}/CMakeCache.txt" ]] || { echo "build.sh: ${BUILD} is not configured" >&2; exit 1; }
((CONFIGURE_ONLY == 0)) || exit 0
cmake --build "${BUILD}" --target "${BINARIES[@]}" -j"$(nproc)"

mkdir -p "${PREFIX}/bin" "${PREFIX}/lib" "${PREFIX}/models"
for b in "${BINARIES[@]}"; do
  install -m 0755 "${BUILD}/bin/${b}" "${PREFIX}/bin/${b}"
done

# ldd lists the whole closure (direct and indirect dependencies): "soname => /path (addr)".
bundled=0
while read -r soname path; do
  runtime_provided "${soname}" "${CUDA}" && continue
  if [[ "${path}" == "not" ]]; then
    echo "build.sh: ${soname} not found on this machine" >&2
    exit 1
  fi
  if [[ ! -e "${PREFIX}/lib/${soname}" ]]; then
    cp -L "${path}" "${PREFIX}/lib/${soname}"
    chmod 0644 "${PREFIX}/lib/${soname}"
    bundled=$((bundled + 1))
  fi
done < <(for b in "${BINARIES[@]}"; do ldd "${PREFIX}/bin/${b}"; done |
         awk '$2 == "=>" { print $1, $3 }' | sort -u)

if [[ -n "${MODEL}" ]]; then
  [[ -f "${MODEL}/config.json" ]] || { echo "build.sh: --model ${MODEL}: no config.json" >&2; exit 1; }
  rm -rf "${PREFIX}/models/$(basename "${MODEL}")"
  cp -r "${MODEL}" "${PREFIX}/models/"
fi

# The runtime stage's script travels with the prefix; here it only checks.
mkdir -p "${PREFIX}/share/dcformer"
install -m 0755 "${SOURCE}/deploy/docker/runtime-setup.sh" "${PREFIX}/share/dcformer/"
install -m 0644 "${SOURCE}/deploy/docker/runtime-libs.sh" "${PREFIX}/share/dcformer/"
CHECK_ARGS=(--no-user)
[[ "${CUDA}" == ON ]] && CHECK_ARGS+=(--cuda)
bash "${PREFIX}/share/dcformer/runtime-setup.sh" "${PREFIX}" "${CHECK_ARGS[@]}"
echo "build.sh: ${PREFIX}: ${BINARIES[*]}, ${bundled} bundled libraries, models: $(ls "${PREFIX}/models" | tr '\n' ' ')"
