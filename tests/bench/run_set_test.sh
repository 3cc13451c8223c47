#!/usr/bin/env bash
# run_set (bench/run_set.cc) on a set of shell commands: each run's JSON lines are labelled into bench.jsonl, its
# other output goes to bench.err, a run past its timeout is killed, a failing or missing command is reported and
# the set goes on, the budget stops later runs; every set in bench/runs/ parses and names what it builds.
# Usage: run_set_test.sh RUN_SET_BINARY REPO_ROOT
set -euo pipefail
run_set=$1 root=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; cat "$dir/out/bench.jsonl" "$dir/out/bench.err" 2>/dev/null; exit 1; }
cat > "$dir/set.yaml" <<'YAML'
budget_s: 3
runs:
  - {name: ok, timeout_s: 5, env: {X: "7"}, command: [bash, -c, 'echo "{\"v\": $X}"; echo noise; echo oops >&2']}
  - {name: slow, timeout_s: 1, command: [bash, -c, 'echo "{\"v\": 1}"; sleep 30']}
  - {name: fails, timeout_s: 5, command: [bash, -c, 'exit 3']}
  - {name: missing, timeout_s: 5, command: [/nonexistent/command]}
  - {name: out, timeout_s: 5, command: [bash, -c, 'echo "{\"dir\": \"{out}\"}"; sleep 2']}
  - {name: late, timeout_s: 5, command: [bash, -c, 'echo "{\"v\": 2}"']}
YAML
mkdir -p "$dir/out"
set +e
"$run_set" "$dir/set.yaml" --out "$dir/out" --commit c0ffee --hardware "test box" > "$dir/progress.txt"
rc=$?
set -e
[ "$rc" = 1 ] || fail "exit status $rc, want 1 (some runs failed)"
grep -q '^ok: rc 0 ' "$dir/progress.txt" || fail "ok's progress line"
grep -q '^slow: rc 137 ' "$dir/progress.txt" || fail "slow was not killed at its timeout"
grep -q '^fails: rc 3 ' "$dir/progress.txt" || fail "fails' status"
grep -q '^missing: rc 127 ' "$dir/progress.txt" || fail "missing's status"
grep -q '^skipped (time): late' "$dir/progress.txt" || fail "the budget did not stop the last run"
grep -q '^{"commit":"c0ffee","date":"[0-9T:Z-]*","hardware":"test box","run":"ok","v":7}$' "$dir/out/bench.jsonl" \
  || fail "ok's labelled line"
grep -q '"run":"slow","v":1' "$dir/out/bench.jsonl" || fail "the line slow printed before it was killed"
grep -q "\"run\":\"out\",\"dir\":\"$dir/out\"" "$dir/out/bench.jsonl" || fail "{out} was not substituted"
[ "$(wc -l < "$dir/out/bench.jsonl")" = 3 ] || fail "bench.jsonl has other lines than the runs' JSON"
grep -q '^ok: noise$' "$dir/out/bench.err" || fail "ok's other stdout line"
grep -q '^oops$' "$dir/out/bench.err" || fail "ok's stderr"
for set in "$root"/bench/runs/*.yaml; do
  targets=$("$run_set" "$set" --list build) || fail "$set does not parse"
  [ -n "${targets// /}" ] || fail "$set names no build target"
done
echo "PASS"
