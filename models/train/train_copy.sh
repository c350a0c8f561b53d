#!/usr/bin/env bash
# Trains a copy-capable variant of models/dcformer-kjv into OUT, leaving the committed model,
# its tokenizer and the test references alone: the same corpus, tokenizer and schedule, with
# --copy-fraction of the training windows a passage followed by itself again (the shape of
# dcformer-bench --copy_text prompts). For measuring speculative decoding on "rewrite this
# passage" workloads (bench/README.md, issue 20); see README.md here.
#   bash models/train/train_copy.sh /tmp/kjvcopy                 # --copy-fraction 0.5
#   bash models/train/train_copy.sh /tmp/kjvcopy --copy-fraction 0.25 --steps 720
# Extra arguments go to train.py after the default --copy-fraction 0.5. Needs what
# retrain.sh installs (bible-kjv, python3-torch, python3-matplotlib, npm ci here); the corpus
# and token streams go to OUT/data.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
OUT="${1:?usage: train_copy.sh OUT [train.py arguments]}"
shift
mkdir -p "${OUT}/data"
OUT="$(cd "${OUT}" && pwd)"
DATA="${OUT}/data"

/usr/bin/python3 "${HERE}/make_corpus.py" --out "${DATA}"
# The tokenizer trainer writes the token streams; its tokenizer must be the committed one.
node "${HERE}/train_tokenizer.js" --data "${DATA}" --out "${DATA}" \
  --cases "${DATA}/tokenizer_cases.jsonl" --heldout-text "${DATA}/heldout.txt"
cmp "${DATA}/tokenizer.json" "${ROOT}/models/dcformer-kjv/tokenizer.json"
cmp "${DATA}/heldout.txt" "${ROOT}/tests/data/kjv/heldout.txt"
/usr/bin/python3 "${HERE}/train.py" --data "${DATA}" --out "${OUT}" --copy-fraction 0.5 "$@"
cp "${ROOT}/models/dcformer-kjv/tokenizer.json" "${ROOT}/models/dcformer-kjv/chat_template.jinja" \
  "${OUT}/"
