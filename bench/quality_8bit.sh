#!/usr/bin/env bash
# Quality of 8-bit AdamW state (issue 38): the demo job trained STEPS steps (default 300) through slided and slidectl
# with optimizer adamw and with adamw_8bit, the same data order and schedule; prints one JSON line per run (the last
# step's loss, the mean of the last 20 steps' losses as `slidectl watch` shows them, the held-out loss) and one
# comparing them. Uses an existing build (scripts/build.sh build) and the CPU.
# Usage: bench/quality_8bit.sh [STEPS]   (COMMIT labels the lines; default the checkout's HEAD)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
commit=${COMMIT:-$(git rev-parse --short HEAD)}
work=$(mktemp -d)
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
build/server/slided --state-dir "$work/state" --metrics-listen 127.0.0.1:0 > "$work/slided.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/state/slided.sock" ] && break; sleep 0.1; done
addr="unix:$work/state/slided.sock"
demo="$(pwd)/deploy/demo"
results=()
for optimizer in adamw adamw_8bit; do
  cat > "$work/$optimizer.yaml" <<JOB
name: quality-$optimizer
model_dir: $demo/model
dataset: $demo/train.jsonl
output_dir: $work/out-$optimizer
steps: $steps
batch_size: 16
seq_len: 32
sequence_mode: truncate
lr: 0.003
lr_schedule: cosine
warmup_steps: 5
max_grad_norm: 1.0
eval_fraction: 0.05
device: cpu
optimizer: $optimizer
JOB
  start=$(date +%s)
  id=$(build/client/slidectl --addr "$addr" submit "$work/$optimizer.yaml" | awk '/^submitted/ {print $2}')
  [ -n "$id" ] || { echo "submit failed" >&2; exit 1; }
  build/client/slidectl --addr "$addr" watch "$id" > "$work/$optimizer.watch" 2>&1 || true
  build/client/slidectl --addr "$addr" --json get "$id" > "$work/$optimizer.json"
  results+=("$(python3 - "$work/$optimizer.json" "$optimizer" "$commit" "$steps" "$(( $(date +%s) - start ))" \
    "$work/$optimizer.watch" <<'PY'
import json, os, re, sys
job = json.load(open(sys.argv[1]))
job = job.get("job", job)
assert job.get("state") == "SUCCEEDED", job
losses = [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+\s+loss (\S+)", open(sys.argv[6]).read(), re.M)]
last = losses[-20:]
print(json.dumps({"bench": "quality_8bit", "commit": sys.argv[3], "hardware": f"cpu, {os.cpu_count()} cores",
                  "model": "deploy/demo (0.8M)", "optimizer": sys.argv[2], "steps": int(sys.argv[4]),
                  "loss": job["loss"], "loss_last20_mean": sum(last) / len(last), "eval_loss": job["eval_loss"],
                  "wall_s": int(sys.argv[5])}))
PY
)")
  echo "${results[-1]}"
done
python3 - "${results[@]}" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
print(json.dumps({"bench": "quality_8bit_compare", "commit": a["commit"], "steps": a["steps"],
                  "loss_rel_diff": (b["loss"] - a["loss"]) / a["loss"],
                  "loss_last20_mean_rel_diff": (b["loss_last20_mean"] - a["loss_last20_mean"]) / a["loss_last20_mean"],
                  "eval_loss_rel_diff": (b["eval_loss"] - a["eval_loss"]) / a["eval_loss"]}))
PY
