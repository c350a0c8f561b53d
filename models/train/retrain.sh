#!/usr/bin/env bash
# Retrains models/dcformer-kjv from scratch, on the CPU, and refreshes the test references:
#   corpus (make_corpus.py) -> tokenizer (train_tokenizer.js) -> model (train.py)
#   -> tests/data/kjv/reference.json (make_reference.py)
# A development step: installs its own Debian packages (bible-kjv for the text,
# python3-matplotlib for the loss curve; python3-torch comes with scripts/setup.sh) and the
# pinned npm `tokenizers`. Training takes about 6 minutes on 2 idle cores; run it niced on a
# busy shared machine. Extra arguments go to train.py (e.g. --steps 720 for a longer
# schedule, --stop-after N to stop early).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
cd "${ROOT}"

missing=()
for p in bible-kjv python3-torch python3-matplotlib; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
(cd "${HERE}" && npm ci --no-audit --no-fund --loglevel=error)

DATA="${HERE}/data"
/usr/bin/python3 "${HERE}/make_corpus.py" --out "${DATA}"
node "${HERE}/train_tokenizer.js" --data "${DATA}" --out "${ROOT}/models/dcformer-kjv" \
  --cases "${ROOT}/tests/data/kjv/tokenizer_cases.jsonl" \
  --heldout-text "${ROOT}/tests/data/kjv/heldout.txt"
/usr/bin/python3 "${HERE}/train.py" --data "${DATA}" --out "${ROOT}/models/dcformer-kjv" "$@"
/usr/bin/python3 "${HERE}/make_reference.py"
