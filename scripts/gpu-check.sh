#!/usr/bin/env bash
# Builds the GPU-check bundle on a machine WITHOUT a GPU (needs the CUDA toolkit for nvcc),
# then runs the bundle here as far as it can go without a GPU. The bundle is what you copy to
# a GPU machine and run there with one command (docs/GPU_CHECK.md):
#
#   bash scripts/gpu-check.sh                      # here: build-gpu/ -> build-gpu-bundle/
#   build-gpu-bundle/run.sh OUTDIR                 # there: tests, golden, sanitizers, benches
#
# Options:
#   --build-dir DIR   CMake build tree (default build-gpu; configured Release with
#                     DCFORMER_CUDA=ON and built here)
#   --reuse-build     take DIR as it is: no configure, no build (CI bundles its own build tree)
#   --bundle DIR      where the bundle goes (default build-gpu-bundle; replaced)
#   --archs LIST      CUDA architectures of that build (default 90a-real: the H200's machine
#                     code only, which keeps the bundle small; e.g. "90a-real;80-real")
#   --max-mib N       size limit of the bundle (default 60)
#   --no-run          assemble only: skip the self-check and the run here
#
# The bundle (under 60 MiB): bin/ (gpu-label test binaries, dcformer-generate,
# dcformer-make-model, dcformer-model-bench, dcformer-attention-bench, dcformer-decode-bench;
# CUDA runtime linked statically, RUNPATH $ORIGIN/../lib), lib/ (the non-system shared
# libraries they load, found with ldd), lib/fallback/ (libstdc++ and libgcc_s, used only when
# the machine's own are too old), data/golden/ (the golden checkpoints), run.sh and
# MANIFEST.json. cuBLAS comes from the GPU machine's CUDA toolkit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

BUILD_DIR=build-gpu
BUNDLE=build-gpu-bundle
REUSE=0
RUN=1
ARCHS=90a-real
MAX_BUNDLE_MIB=60
while (($#)); do
  case "$1" in
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --reuse-build) REUSE=1; shift ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --archs) ARCHS="$2"; shift 2 ;;
    --max-mib) MAX_BUNDLE_MIB="$2"; shift 2 ;;
    --no-run) RUN=0; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BINARIES=(dcformer-generate dcformer-make-model dcformer-model-bench dcformer-attention-bench
          dcformer-decode-bench)

if ((!REUSE)); then
  NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  if [[ ! -x "${NVCC}" ]] && ! command -v nvcc >/dev/null 2>&1; then
    echo "gpu-check: no CUDA toolkit here (nvcc not found): the bundle needs nvcc to build" >&2
    exit 2
  fi
  launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  echo "gpu-check: configuring ${BUILD_DIR} (Release, DCFORMER_CUDA=ON, architectures ${ARCHS})"
  cmake -S . -B "${BUILD_DIR}" -DCMAKE_BUILD_TYPE=Release -DDCFORMER_CUDA=ON \
    -DDCFORMER_CUDA_ARCHITECTURES="${ARCHS}" "${launcher[@]}" >/dev/null
fi

# The gpu-label test binaries, from CTest's own list (a test binary may hold several tests).
gpu_tests() {
  ctest --test-dir "${BUILD_DIR}" -L gpu --show-only=json-v1 2>/dev/null |
    python3 -c '
import json, os, sys
seen = set()
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and cmd[0] not in seen:
        seen.add(cmd[0])
        print(cmd[0])'
}

if ((!REUSE)); then
  # The tools plus every gpu test binary (dcf_add_cuda_test names them NAME_gpu).
  mapfile -t gpu_targets < <(cmake --build "${BUILD_DIR}" --target help |
                             sed -n 's/^\.\.\. \(.*_gpu\)$/\1/p')
  echo "gpu-check: building ${#BINARIES[@]} tools and ${#gpu_targets[@]} gpu test binaries in" \
       "${BUILD_DIR} (nvcc for DCFORMER_CUDA_ARCHITECTURES)"
  cmake --build "${BUILD_DIR}" -j"$(nproc)" --target "${BINARIES[@]}" "${gpu_targets[@]}"
fi

echo "gpu-check: assembling ${BUNDLE}"
rm -rf "${BUNDLE}"
mkdir -p "${BUNDLE}/bin" "${BUNDLE}/lib/fallback" "${BUNDLE}/data"
copy_bin() {
  local src="$1"
  [[ -x "${src}" ]] || { echo "gpu-check: missing binary ${src}" >&2; exit 1; }
  cp "${src}" "${BUNDLE}/bin/"
  strip --strip-unneeded "${BUNDLE}/bin/$(basename "${src}")"
}
for b in "${BINARIES[@]}"; do copy_bin "${BUILD_DIR}/bin/${b}"; done
num_tests=0
while read -r exe; do
  [[ -n "${exe}" ]] || continue
  copy_bin "${exe}"
  num_tests=$((num_tests + 1))
done < <(gpu_tests)
if ((num_tests == 0)) && [[ -d "${BUILD_DIR}/bin/tests" ]]; then
  # CTest lists no gpu tests before their binaries exist; take the *_gpu binaries instead.
  for exe in "${BUILD_DIR}"/bin/tests/*_gpu; do
    [[ -x "${exe}" ]] && copy_bin "${exe}" && num_tests=$((num_tests + 1))
  done
fi
echo "gpu-check: ${num_tests} gpu test binaries"
# The CUDA backend is a plugin the tools load with dlopen from <bin>/../lib
# (engine/cuda/cuda_plugin.cc); ldd does not list it, so copy it (its own dependencies join
# the closure below).
PLUGIN="${BUILD_DIR}/lib/libdcformer_cuda_plugin.so"
[[ -f "${PLUGIN}" ]] || { echo "gpu-check: missing ${PLUGIN}" >&2; exit 1; }
cp "${PLUGIN}" "${BUNDLE}/lib/"
strip --strip-unneeded "${BUNDLE}/lib/libdcformer_cuda_plugin.so"
patchelf --set-rpath '$ORIGIN' "${BUNDLE}/lib/libdcformer_cuda_plugin.so"

# Shared libraries: the closure of what ldd resolves, except what every GPU machine provides
# (glibc, the C++ runtime, the driver, the CUDA toolkit's cuBLAS): the deployment image's
# rule, deploy/docker/runtime-libs.sh with CUDA on. libstdc++ and libgcc_s also go to
# lib/fallback (used only where the machine's own are older). OpenBLAS (36 MB, every CPU's
# kernels) is replaced by Debian's reference BLAS under its soname: only the cuda-sim GEMM
# (engine/cuda/gemm_sim.cc, linked into every engine binary) calls cblas_sgemm, and the
# bundle never runs cuda-sim on anything but tiny models.
source deploy/docker/runtime-libs.sh
for exe in "${BUNDLE}"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "${exe}"; done
REF_BLAS=/usr/lib/x86_64-linux-gnu/blas/libblas.so.3
if [[ -e "${REF_BLAS}" ]] && nm -D "${REF_BLAS}" | grep ' T cblas_sgemm$' >/dev/null; then
  cp -L "${REF_BLAS}" "${BUNDLE}/lib/libopenblas.so.0"
  patchelf --set-soname libopenblas.so.0 "${BUNDLE}/lib/libopenblas.so.0"
  patchelf --set-rpath '$ORIGIN' "${BUNDLE}/lib/libopenblas.so.0"
fi
from_toolkit=()
while :; do
  added=0
  for elf in "${BUNDLE}"/bin/* "${BUNDLE}"/lib/*.so*; do
    [[ -f "${elf}" ]] || continue
    while read -r name path; do
      case "${name}" in
        libcublas.so*|libcublasLt.so*) from_toolkit+=("${name}"); continue ;;
        libstdc++.so*|libgcc_s.so*)  # provided, but possibly older than ours: a fallback copy
          [[ -e "${BUNDLE}/lib/fallback/${name}" || -z "${path}" ]] ||
            cp -L "${path}" "${BUNDLE}/lib/fallback/${name}"
          continue ;;
      esac
      runtime_provided "${name}" ON && continue
      [[ "${path}" == "$(cd "${BUNDLE}" && pwd)/lib/"* ]] && continue
      [[ -e "${BUNDLE}/lib/${name}" || -e "${BUNDLE}/lib/fallback/${name}" ]] && continue
      if [[ -z "${path}" ]]; then
        echo "gpu-check: ${elf} needs ${name}, which is not found here" >&2
        exit 1
      fi
      cp -L "${path}" "${BUNDLE}/lib/${name}"
      strip --strip-unneeded "${BUNDLE}/lib/${name}" 2>/dev/null || true
      patchelf --set-rpath '$ORIGIN' "${BUNDLE}/lib/${name}"
      added=1
    done < <(ldd "${elf}" | awk '/=> not found/ {print $1, ""; next} /=>/ && $3 ~ /^\// {print $1, $3}')
  done
  ((added)) || break
done

# The CUDA backend loads cuBLASLt with dlopen (engine/cuda/gemm_cublaslt.cc), so ldd does not
# list it: name it, with the toolkit's major version, for run.sh to find on the GPU machine.
CUBLAS_MAJOR="$(awk '/#define CUBLAS_VER_MAJOR/ {print $3}' \
  "$(dirname "$(dirname "$(readlink -f "${NVCC:-/usr/local/cuda/bin/nvcc}")")")/include/cublas_api.h" \
  2>/dev/null || true)"
from_toolkit+=("libcublasLt.so.${CUBLAS_MAJOR:-13}")

cp -r tests/data/golden "${BUNDLE}/data/golden"
cp scripts/gpu_bundle/run.sh scripts/gpu_bundle/gpu_check.py "${BUNDLE}/"
chmod +x "${BUNDLE}/run.sh"
toolkit_libs="$(printf '%s\n' "${from_toolkit[@]+"${from_toolkit[@]}"}" | sort -u | paste -sd, -)"
python3 - "${BUNDLE}" "${toolkit_libs}" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'EOF'
import json, os, sys
bundle, toolkit, commit = sys.argv[1], sys.argv[2], sys.argv[3]
files = {}
for d in ("bin", "lib", "lib/fallback"):
    p = os.path.join(bundle, d)
    for f in sorted(os.listdir(p)):
        if os.path.isfile(os.path.join(p, f)):
            files[f"{d}/{f}"] = os.path.getsize(os.path.join(p, f))
json.dump({"commit": commit,
           "needs_from_cuda_toolkit": [x for x in toolkit.split(",") if x],
           "files": files}, open(os.path.join(bundle, "MANIFEST.json"), "w"), indent=1)
EOF

size_kib=$(du -sk "${BUNDLE}" | cut -f1)
echo "gpu-check: bundle ${BUNDLE}: $((size_kib / 1024)) MiB (limit ${MAX_BUNDLE_MIB} MiB)"
if ((size_kib > MAX_BUNDLE_MIB * 1024)); then
  echo "gpu-check: the bundle is larger than ${MAX_BUNDLE_MIB} MiB" >&2
  du -sk "${BUNDLE}"/bin/* "${BUNDLE}"/lib/* "${BUNDLE}"/data/* | sort -n | tail -8 >&2
  exit 1
fi

((RUN)) || exit 0
echo "gpu-check: self-check of the bundle (libraries resolve from it, every binary starts)"
"${BUNDLE}/run.sh" --self-check
echo "gpu-check: running the bundle here (expected to stop at 'no GPU' on a machine without one)"
set +e
"${BUNDLE}/run.sh" "${BUILD_DIR}/gpu-check-out"
rc=$?
set -e
if ((rc == 3)); then
  echo "gpu-check: no GPU here, as expected. Copy ${BUNDLE} to a GPU machine and run" \
       "'${BUNDLE}/run.sh OUTDIR' there (docs/GPU_CHECK.md)."
  exit 0
fi
exit "${rc}"
