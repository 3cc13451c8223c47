#!/usr/bin/env bash
# Dataset preparation of one 8 MiB line against the same text as ordinary lines (pack mode), on one thread.
# (seq_len 1024 and 64: before the fix a long sample cost time quadratic in its length over seq_len.)
# Usage: bench/dataset_bench.sh [BUILD_DIR=build] [FAMILY=llama3]
set -euo pipefail
build=${1:-build}
family=${2:-llama3}
dir=tests/fixtures/tokenizers
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$dir/corpus.txt" "$work" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read().replace("\n", " ")
big, i = [], 0
while sum(map(len, big)) < 8 << 20:
    big.append(text + " %d " % i)
    i += 1
with open(sys.argv[2] + "/one_line.jsonl", "w") as f:
    f.write(json.dumps({"text": "".join(big)}) + "\n")
with open(sys.argv[2] + "/many_lines.jsonl", "w") as f:
    for piece in big:
        f.write(json.dumps({"text": piece}) + "\n")
PY
for seq in 1024 64; do
  for f in one_line many_lines; do "$build/bench/dataset_bench" "$dir/$family/tokenizer.json" "$work/$f.jsonl" $seq pack; done
done
