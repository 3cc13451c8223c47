#!/usr/bin/env bash
# Tokenizer throughput, ours vs PyPI `tokenizers`, on the same text in the same run, one thread each.
# Usage: bench/tokenizer_bench.sh [BUILD_DIR=build] [FAMILY=llama3]   (needs: pip install tokenizers)
set -euo pipefail
build=${1:-build}
family=${2:-llama3}
dir=tests/fixtures/tokenizers
text=$(mktemp)
trap 'rm -f "$text"' EXIT
for i in $(seq 200); do sed "s/\$/ $i/" "$dir/corpus.txt"; done > "$text"  # ~0.9 MB, varied numbers
"$build/bench/tokenizer_bench" "$dir/$family/tokenizer.json" "$text" 3
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 - "$dir/$family/tokenizer.json" "$text" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
lines = open(sys.argv[2], encoding="utf-8").read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
nbytes = sum(len(l.encode()) for l in lines)
def run(f):
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter(); n = f(); best = min(best, time.perf_counter() - t0)
    return n, best
n1, t1 = run(lambda: sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines))
n2, t2 = run(lambda: sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False)))
for impl, n, t in (("hf_tokenizers_encode_loop", n1, t1), ("hf_tokenizers_encode_batch_1thread", n2, t2)):
    print(json.dumps({"bench": "tokenizer", "impl": impl, "lines": len(lines), "bytes": nbytes, "tokens": n,
                      "mb_per_s": round(nbytes / t / 1e6, 2), "tokens_per_s": round(n / t)}))
PY
