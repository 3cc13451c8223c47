#!/usr/bin/env bash
# Quality of 8-bit AdamW state (issue 38): one job trained STEPS steps (default 300) through slided and slidectl with
# optimizer adamw and with adamw_8bit, the same data order and schedule; prints one JSON line per run (the last
# step's loss, the mean of the last 20 steps' losses as `slidectl watch` shows them, the held-out loss) and one
# comparing them. Uses an existing build (BUILD, default build).
#   QUALITY=demo    (default) the demo model and data on the CPU
#   QUALITY=corpus  a 97.5M-parameter Llama (make_random_model llama-100m, random init) on the Python 3.11
#                   documentation (scripts/make_quality_corpus.py wrote .quality/), sequences of 512 packed, batch 8,
#                   on DEVICE (default cuda)
# Usage: bench/quality_8bit.sh [STEPS]   (COMMIT labels the lines; default the checkout's HEAD; HW names the machine)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
commit=${COMMIT:-$(git rev-parse --short HEAD)}
build=${BUILD:-build}
quality=${QUALITY:-demo}
hardware=${HW:-cpu, $(nproc) cores}
work=$(mktemp -d)
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
if [ "$quality" = corpus ]; then
  [ -f .quality/train.jsonl ] || [ ! -f .quality/train.jsonl.xz ] ||  # as carried
    python3 -c 'import lzma, shutil; shutil.copyfileobj(lzma.open(".quality/train.jsonl.xz"), open(".quality/train.jsonl", "wb"))' 
  [ -f .quality/train.jsonl ] || { echo "no .quality/: run scripts/make_quality_corpus.py" >&2; exit 1; }
  [ -f .quality/model/model.safetensors ] || "$build/bench/make_random_model" llama-100m .quality/model .quality/tokenizer
  model="$(pwd)/.quality/model" dataset="$(pwd)/.quality/train.jsonl" model_name="llama-100m (97.5M), Python 3.11 docs"
  shape="batch_size: 8
seq_len: 512
sequence_mode: pack
lr: 0.0006
warmup_steps: 20
eval_fraction: 0.02
device: ${DEVICE:-cuda}"
else
  model="$(pwd)/deploy/demo/model" dataset="$(pwd)/deploy/demo/train.jsonl" model_name="deploy/demo (0.8M)"
  shape="batch_size: 16
seq_len: 32
sequence_mode: truncate
lr: 0.003
warmup_steps: 5
eval_fraction: 0.05
device: cpu"
fi
"$build/server/slided" --state-dir "$work/state" --metrics-listen 127.0.0.1:0 > "$work/slided.log" 2>&1 &
daemon=$!
for _ in $(seq 600); do  # a GPU box's daemon takes seconds to start (CUDA)
  [ -S "$work/state/slided.sock" ] && break
  kill -0 $daemon 2>/dev/null || { echo "slided exited:" >&2; tail -20 "$work/slided.log" >&2; exit 1; }
  sleep 0.1
done
addr="unix:$work/state/slided.sock"
results=()
for optimizer in adamw adamw_8bit; do
  cat > "$work/$optimizer.yaml" <<JOB
name: quality-$optimizer
model_dir: $model
dataset: $dataset
output_dir: $work/out-$optimizer
steps: $steps
lr_schedule: cosine
max_grad_norm: 1.0
optimizer: $optimizer
$shape
JOB
  start=$(date +%s)
  id=$("$build/client/slidectl" --addr "$addr" submit "$work/$optimizer.yaml" | awk '/^submitted/ {print $2}')
  [ -n "$id" ] || { echo "submit failed" >&2; exit 1; }
  "$build/client/slidectl" --addr "$addr" watch "$id" > "$work/$optimizer.watch" 2>&1 || true
  "$build/client/slidectl" --addr "$addr" --json get "$id" > "$work/$optimizer.json"
  results+=("$(python3 - "$work/$optimizer.json" "$optimizer" "$commit" "$steps" "$(( $(date +%s) - start ))" \
    "$work/$optimizer.watch" "$hardware" "$model_name" <<'PY'
import json, re, sys
job = json.load(open(sys.argv[1]))
job = job.get("job", job)
assert job.get("state") == "SUCCEEDED", job
losses = [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+\s+loss (\S+)", open(sys.argv[6]).read(), re.M)]
last = losses[-20:]
print(json.dumps({"bench": "quality_8bit", "commit": sys.argv[3], "hardware": sys.argv[7],
                  "model": sys.argv[8], "optimizer": sys.argv[2], "steps": int(sys.argv[4]),
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
