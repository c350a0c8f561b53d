#!/usr/bin/env bash
# Installs every system dependency of dcformer-serve from Debian 12 packages.
# Idempotent: packages already present are skipped; safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  ninja-build  # the build tool of scripts/*.sh (scripts/cmake_generator.sh says why)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libcurl4-openssl-dev zlib1g-dev
  libboost-dev  # Boost.Beast/Asio (header-only): the server's HTTP listener (/metrics)
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libopenblas0-openmp nlohmann-json3-dev libzip-dev libutf8proc-dev
  clang libclang-rt-14-dev
  python3-grpcio python3-protobuf python3-prometheus-client python3-numpy python3-yaml
  python3-h2 python3-cryptography  # abuse tests: raw HTTP/2 clients, an expired certificate
  python3-torch  # the PyTorch reference model (bench/baseline) and its test; ~600 MB installed
  prometheus openssl curl
  gnuplot-nox  # dcformer-loadgen --plot-out
  patchelf     # scripts/gpu-check.sh: the relocatable GPU-check bundle
  jsonnet      # integration.test_kubernetes: deploy/kubernetes/kube-prometheus/dcformer.libsonnet
)
# Node.js is used only by the example client; machines may already carry a non-Debian build
# (with its own npm), which conflicts with Debian's npm package: install only when absent.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian's prometheus package starts a system Prometheus on :9090, dcformer-server's default
  # metrics port. The project only runs prometheus/promtool from its tests: on a machine with
  # systemd, stop the service that this install just started.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1 &&
     [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
else
  echo "setup: all system packages present"
fi

# npm packages (package-lock.json pins them), installed here so no test downloads anything:
# the Node.js example clients' (gRPC, and the official openai SDK's), and the Kubernetes
# schema validator's (deploy/validate).
# Skipped when present, and when the folder is absent (container build stages copy only
# this script before installing).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm_ci() {  # DIR MARKER: npm ci in DIR unless DIR/node_modules/MARKER exists
  local dir="${ROOT}/$1"
  [[ -f "${dir}/package-lock.json" && ! -e "${dir}/node_modules/$2" ]] || return 0
  echo "setup: installing the npm packages of $1 (npm ci)"
  (cd "${dir}" && npm ci --no-audit --no-fund --loglevel=error)
}
npm_ci client/examples/node @grpc/grpc-js
npm_ci deploy/validate kubernetes-models
npm_ci client/examples/openai-node openai
