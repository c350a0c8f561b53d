#!/usr/bin/env bash
# Runs one workload through dcformer-server (driven by dcformer-loadgen, all requests in
# flight at once) and through the PyTorch baseline (bench/baseline/torch_generate_bench.py:
# static batches of equal-length prompts, eager fp32), on the same checkpoint, one after the
# other in one run, and prints the ratios.
#
#   bench/compare.sh [--model DIR] [--workload fixed|mixed] [--requests 32] [--out DIR]
#                    [--server-flag FLAG ...] [--server-bin PATH]
#
# --model      checkpoint directory (default: the issue's 261M-parameter model, written once
#              to $OUT/model-261m with dcformer-make-model: dim 1024, 12 layers, 16 heads,
#              FFN 2816, context 2048, window 256, F16 weights)
# --workload   fixed: every request 128 prompt + 32 new tokens (issue 10's measurement);
#              mixed: prompts of 32, 64, 128 and 256 tokens (a quarter each, interleaved)
#              and 32 or 64 new tokens
# --requests   number of requests (default 32), all sent at once
# --out        where the prompts, JSON results and logs go (default /tmp/dcformer-compare)
# --server-flag  passed to dcformer-server (repeatable), e.g. --server-flag=--max-num-seqs=64
# --server-bin   another dcformer-server binary (e.g. an older build, for a before/after)
#
# Both sides use every core. OMP_WAIT_POLICY defaults to passive for both processes (an
# actively spinning OpenMP barrier collapses on a machine shared with other work); export
# OMP_WAIT_POLICY=active on a dedicated machine. Needs build/bin (cmake --build build) and
# /usr/bin/python3 with Debian's python3-torch.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/build/bin"
MODEL=""
WORKLOAD="fixed"
REQUESTS=32
OUT="/tmp/dcformer-compare"
SERVER_FLAGS=()
SERVER_BIN=""
while (($#)); do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --model=*) MODEL="${1#*=}"; shift ;;
    --workload) WORKLOAD="$2"; shift 2 ;;
    --workload=*) WORKLOAD="${1#*=}"; shift ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --requests=*) REQUESTS="${1#*=}"; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#*=}"; shift ;;
    --server-flag) SERVER_FLAGS+=("$2"); shift 2 ;;
    --server-flag=*) SERVER_FLAGS+=("${1#*=}"); shift ;;
    --server-bin) SERVER_BIN="$2"; shift 2 ;;
    --server-bin=*) SERVER_BIN="${1#*=}"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ "${WORKLOAD}" != fixed && "${WORKLOAD}" != mixed ]]; then
  echo "compare.sh: --workload must be fixed or mixed, not '${WORKLOAD}'" >&2
  exit 2
fi
if ! [[ "${REQUESTS}" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare.sh: --requests must be a positive integer, not '${REQUESTS}'" >&2
  exit 2
fi
for b in dcformer-server dcformer-loadgen dcformer-cli dcformer-make-model; do
  if [[ ! -x "${BIN}/${b}" ]]; then
    echo "compare.sh: ${BIN}/${b} is missing: build first (cmake --build build)" >&2
    exit 1
  fi
done
SERVER_BIN="${SERVER_BIN:-${BIN}/dcformer-server}"
if [[ ! -x "${SERVER_BIN}" ]]; then
  echo "compare.sh: --server-bin ${SERVER_BIN} is not an executable" >&2
  exit 1
fi
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
mkdir -p "${OUT}"

if [[ -z "${MODEL}" ]]; then
  MODEL="${OUT}/model-261m"
  if [[ ! -f "${MODEL}/config.json" ]]; then
    echo "compare.sh: writing the 261M-parameter benchmark model to ${MODEL}"
    "${BIN}/dcformer-make-model" --out "${MODEL}" --dim 1024 --n-layer 12 --n-head 16 \
      --ffn 2816 --context 2048 --window 256 --dtype F16
  fi
fi
if [[ ! -f "${MODEL}/config.json" ]]; then
  echo "compare.sh: --model ${MODEL} has no config.json" >&2
  exit 1
fi

# The workload: one JSONL file both sides read (token ids, max_new_tokens per line).
PROMPTS="${OUT}/prompts-${WORKLOAD}.jsonl"
/usr/bin/python3 - "${MODEL}" "${WORKLOAD}" "${REQUESTS}" "${PROMPTS}" <<'EOF'
import json, random, sys
model, workload, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
vocab = json.load(open(model + "/config.json"))["vocab_size"]
rng = random.Random(1)
with open(path, "w") as f:
    for i in range(n):
        if workload == "fixed":
            plen, new = 128, 32
        else:
            plen, new = (32, 64, 128, 256)[i % 4], (32, 64)[(i // 4) % 2]
        ids = [rng.randrange(vocab) for _ in range(plen)]
        f.write(json.dumps({"token_ids": ids, "max_new_tokens": new}) + "\n")
EOF

echo "compare.sh: model ${MODEL}, workload ${WORKLOAD} (${REQUESTS} requests, ${PROMPTS})"
echo "compare.sh: OMP_WAIT_POLICY=${OMP_WAIT_POLICY}; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- ours: dcformer-server + dcformer-loadgen -------------------------------------------
PORT=$((20000 + RANDOM % 20000))
METRICS_PORT=$((PORT + 1))
"${SERVER_BIN}" --model="${MODEL}" --host=127.0.0.1 --port="${PORT}" \
  --metrics-port="${METRICS_PORT}" --max-num-seqs="$((REQUESTS > 64 ? REQUESTS : 64))" \
  "${SERVER_FLAGS[@]+"${SERVER_FLAGS[@]}"}" >"${OUT}/server.log" 2>&1 &
SERVER_PID=$!
cleanup() { kill "${SERVER_PID}" 2>/dev/null || true; wait "${SERVER_PID}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  if "${BIN}/dcformer-cli" --target="127.0.0.1:${PORT}" health 2>/dev/null | grep -q SERVING; then
    break
  fi
  if ! kill -0 "${SERVER_PID}" 2>/dev/null; then
    echo "compare.sh: dcformer-server exited; see ${OUT}/server.log" >&2
    exit 1
  fi
  sleep 0.5
done
"${BIN}/dcformer-loadgen" --target="127.0.0.1:${PORT}" --concurrency="${REQUESTS}" \
  --num-requests="${REQUESTS}" --prompts-file="${PROMPTS}" --temperature=0 --notext \
  --noprogress --json-out="${OUT}/ours.json" | tee "${OUT}/ours.txt"
cleanup
trap - EXIT

# --- the PyTorch baseline ---------------------------------------------------------------
PYTHONPATH="${ROOT}/bench/baseline${PYTHONPATH:+:${PYTHONPATH}}" /usr/bin/python3 \
  "${ROOT}/bench/baseline/torch_generate_bench.py" --model "${MODEL}" \
  --prompts-file "${PROMPTS}" --batch-size "${REQUESTS}" --json-out "${OUT}/torch.json" \
  | tee "${OUT}/torch.txt"

echo "compare.sh: load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "${OUT}/ours.json" "${OUT}/torch.json" <<'EOF'
import json, sys
ours = json.load(open(sys.argv[1]))["runs"][0]
ref = json.load(open(sys.argv[2]))
o_tps = ours["throughput"]["output_tokens_per_s"]
r_tps = ref["throughput"]["output_tokens_per_s"]
rows = [
    ("output tokens/s", o_tps, r_tps),
    ("wall time s", ours["duration_s"], ref["duration_s"]),
    ("TTFT p50 ms", ours["latency_ms"]["ttft"]["p50"], ref["latency_ms"]["ttft"]["p50"]),
    ("TTFT max ms", ours["latency_ms"]["ttft"]["max"], ref["latency_ms"]["ttft"]["max"]),
]
print(f"{'':18} {'dcformer-server':>16} {'torch baseline':>16} {'ratio':>8}")
for name, a, b in rows:
    ratio = a / b if name.startswith("output") else (b / a if a > 0 else float("inf"))
    print(f"{name:18} {a:16.2f} {b:16.2f} {ratio:7.2f}x")
print(f"(ratio: ours / baseline for throughput, baseline / ours for times; "
      f"{ours['requests']['ok']} OK of {ours['requests']['sent']} requests)")
EOF
