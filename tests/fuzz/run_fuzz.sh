#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build dir and runs them briefly, side
# by side:
#   tokenizer_fuzz  the tokenizer, seeded with the GPT-2 reference texts;
#   request_fuzz    raw GenerateRequest/TokenizeRequest bytes through parsing, conversion and
#                   validation (needs the main project: the generated protobuf code);
#   openai_fuzz     OpenAI request bodies through JSON parsing, the chat template, planning
#                   and validation, seeded with well-formed and edge-case bodies.
# Exits non-zero on a crash or a violated property.
# Usage: tests/fuzz/run_fuzz.sh [seconds of a core per target=30] [build_dir=build-fuzz]
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
source "${ROOT}/scripts/cmake_generator.sh"
# shellcheck disable=SC2046  # the -G flag is two words or none
cmake -S "${SRC}" -B "${BUILD}" $(dcf_generator_args "${BUILD}") -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDCFORMER_FUZZ=ON -DDCFORMER_CUDA=OFF -DDCFORMER_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
TARGETS=(tokenizer_fuzz openai_fuzz)
if [[ "${SRC}" == "${ROOT}" ]]; then TARGETS+=(request_fuzz); fi
cmake --build "${BUILD}" --target "${TARGETS[@]}" -j"${JOBS}"
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
# The fuzzers run side by side, each with its corpus and arguments in RUNS (below).
RUNS=()
RUNS+=("tokenizer|${FUZZER}|${CORPUS}|${BUILD}/")

if [[ " ${TARGETS[*]} " == *" request_fuzz "* ]]; then
  REQUEST_FUZZER="$(find "${BUILD}" -type f -name request_fuzz -perm -u+x | head -n 1)"
  REQUEST_CORPUS="${BUILD}/request_fuzz_corpus"
  mkdir -p "${REQUEST_CORPUS}"
  # Seeds: well-formed requests (leading 0x00 = GenerateRequest, 0x01 = TokenizeRequest), in
  # protobuf wire format written by hand so that no generated Python code is needed.
  python3 - "${REQUEST_CORPUS}" <<'PY'
import os, sys
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7f, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out
def field(num, payload):  # length-delimited
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def vfield(num, n):
    return varint(num << 3) + varint(n)
seeds = {
    "gen_text": b"\x00" + field(1, b"req-1") + field(2, "Hello, world! \u00e9\u4e2d".encode()),
    "gen_ids": b"\x00" + field(3, field(1, b"".join(varint(i) for i in (5, 6, 7))))
               + field(4, vfield(2, 40) + b"\x0d\x00\x00\x00\x3f")  # top_k, temperature
               + field(5, vfield(1, 8) + field(2, b"stop") + vfield(3, 11) + vfield(5, 1))
               + field(6, vfield(1, 1) + vfield(2, 5) + vfield(3, 1)),
    "tok_text": b"\x01" + field(1, "Tokenize me \u263a".encode()),
}
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)
PY
  RUNS+=("request|${REQUEST_FUZZER}|${REQUEST_CORPUS}|${BUILD}/request-")
fi

OPENAI_FUZZER="$(find "${BUILD}" -type f -name openai_fuzz -perm -u+x | head -n 1)"
OPENAI_CORPUS="${BUILD}/openai_fuzz_corpus"
mkdir -p "${OPENAI_CORPUS}"
# Seeds: the first byte picks the endpoint (0x00 completions, 0x01 chat).
python3 - "${OPENAI_CORPUS}" <<'PY'
import json, os, sys
seeds = {
    "completion": (0, {"model": "m", "prompt": "Hello", "max_tokens": 8, "temperature": 0.7,
                       "top_p": 0.9, "stop": ["\n"], "logprobs": 2, "echo": False, "n": 2,
                       "seed": 5}),
    "completion_ids": (0, {"model": "m", "prompt": [[1, 2, 3], [4]], "stream": True,
                           "stream_options": {"include_usage": True}, "top_k": 40,
                           "ignore_eos": True, "stop_token_ids": [7]}),
    "chat": (1, {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": [
                                                {"type": "text", "text": "hi \u00e9"}]}],
                 "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3}),
    "refused": (1, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function"}]}),
}
for name, (api, body) in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(bytes([api]) + json.dumps(body).encode())
PY
RUNS+=("openai|${OPENAI_FUZZER}|${OPENAI_CORPUS}|${BUILD}/openai-")

# Each fuzzer is a single process on one core: one after another they left a core of CI's two
# idle (3 x 30 s). Side by side for SECONDS_TO_RUN x fuzzers / min(cores, fuzzers) seconds of
# wall time, each gets about SECONDS_TO_RUN seconds of a core, as before (45 s on 2 cores).
CORES="$(nproc)"
WALL=$(( (SECONDS_TO_RUN * ${#RUNS[@]} + (CORES < ${#RUNS[@]} ? CORES : ${#RUNS[@]}) - 1) /
         (CORES < ${#RUNS[@]} ? CORES : ${#RUNS[@]}) ))
declare -A PIDS=()
# A script stopped early (Ctrl-C, a CI time limit) stops its fuzzers too. Needs bash >= 4.4
# (empty arrays under set -u).
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT INT TERM
for run in "${RUNS[@]}"; do
  IFS='|' read -r name fuzzer corpus prefix <<<"${run}"
  # libFuzzer exits non-zero on a crash, leak, timeout or abort from a violated property.
  "${fuzzer}" "${corpus}" -max_total_time="${WALL}" -max_len=4096 -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="${prefix}" \
    >"${BUILD}/${name}_fuzz.log" 2>&1 &
  PIDS[${name}]=$!
done
failed=()
for name in "${!PIDS[@]}"; do
  wait "${PIDS[${name}]}" || failed+=("${name}")
done
trap - EXIT INT TERM
for run in "${RUNS[@]}"; do
  name="${run%%|*}"
  echo "=== ${name}_fuzz (${WALL} s beside the others; log ${BUILD}/${name}_fuzz.log)"
  if [[ " ${failed[*]} " == *" ${name} "* ]]; then
    cat "${BUILD}/${name}_fuzz.log"  # the whole log of a failed run: the crash and its input
  else
    grep -E '^(stat::|Done |INFO: (Seed|Loaded))' "${BUILD}/${name}_fuzz.log" || true
  fi
done
if (( ${#failed[@]} )); then
  echo "run_fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
