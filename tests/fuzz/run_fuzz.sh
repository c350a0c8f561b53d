#!/usr/bin/env bash
# Builds tests/fuzz/tokenizer_fuzz with clang + libFuzzer in its own build dir and runs it
# briefly with the GPT-2 reference texts as seed corpus. Exits non-zero on a crash or a violated
# property. Usage: tests/fuzz/run_fuzz.sh [seconds=30] [build_dir=build-fuzz]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_TO_RUN="${1:-30}"
BUILD="${2:-${ROOT}/build-fuzz}"
JOBS="${JOBS:-2}"

# Prefer the main project (when its CMakeLists adds tests/fuzz); otherwise build the fuzz
# directory standalone. The CUDA backend and the unit tests are not needed here.
if grep -q "tests/fuzz" "${ROOT}/CMakeLists.txt"; then
  SRC="${ROOT}"
else
  SRC="${ROOT}/tests/fuzz"
fi
cmake -S "${SRC}" -B "${BUILD}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDCFORMER_FUZZ=ON \
  -DDCFORMER_CUDA=OFF -DDCFORMER_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "${BUILD}" --target tokenizer_fuzz -j"${JOBS}"
FUZZER="$(find "${BUILD}" -type f -name tokenizer_fuzz -perm -u+x | head -n 1)"

CORPUS="${BUILD}/tokenizer_fuzz_corpus"
mkdir -p "${CORPUS}"
# Seeds: every reference text, once as text mode (leading 0x00) and once as id mode (0x01).
python3 - "${ROOT}/tests/data/tokenizer/gpt2/cases.jsonl" "${CORPUS}" <<'PY'
import json, sys, os
for n, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    case = json.loads(line)
    with open(os.path.join(sys.argv[2], f"text_{n}"), "wb") as f:
        f.write(b"\x00" + case["text"].encode("utf-8"))
    with open(os.path.join(sys.argv[2], f"ids_{n}"), "wb") as f:
        f.write(b"\x01" + b"".join(i.to_bytes(2, "little") for i in case["ids"] if i < 65536))
PY
# libFuzzer exits non-zero on a crash, leak, timeout or abort from a violated property.
"${FUZZER}" "${CORPUS}" -max_total_time="${SECONDS_TO_RUN}" -max_len=4096 -timeout=10 \
  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="${BUILD}/"
