#!/usr/bin/env bash
# The container path, run for real (.ci/run calls it after scripts/test.sh): a Docker engine (Debian's docker.io and
# docker-compose when missing), a Debian 12 base image (debootstrap + `docker import` when no registry serves one),
# the image from docker/Dockerfile, then the compose stack (slided + Prometheus) with deploy/docker-compose.ci.yml:
#   the health check turns healthy; slidectl on the host answers through the published port;
#   the demo job runs inside the container on the mounted /models, /datasets, /outputs and exports there, with its
#   moments on the /scratch NVMe tier through io_uring (the seccomp profile allows it; the job log names the backend);
#   the daemon runs as uid 10001; Prometheus scrapes slided:9464 and has loaded the alert rules;
#   `stop` checkpoints a running job at its step boundary and `up` resumes it from the state volume.
# SLIDE_DOCKER_FROM_SOURCE=1 compiles inside the image; otherwise, when build/ holds slided and slidectl (test.sh
# has just built them), the image takes those (the Dockerfile's PREBUILT). Timings go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t0=$SECONDS
say() { echo "docker-smoke [$((SECONDS - t0)) s]: $*"; }
fail() { echo "docker-smoke: FAILED: $*" >&2; exit 1; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo

# --- the engine ---------------------------------------------------------------------------------------------------
# Debian's docker.io client (/usr/bin/docker) speaks BuildKit with DOCKER_BUILDKIT=1; another client earlier on PATH
# may lack it, so the package's is preferred.
have_compose() { command -v docker-compose >/dev/null || /usr/bin/docker compose version >/dev/null 2>&1; }
if ! command -v dockerd >/dev/null || ! have_compose || ! command -v debootstrap >/dev/null; then
  say "apt-get install docker.io docker-compose debootstrap"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends docker.io docker-compose \
    debootstrap > /tmp/slide-apt-docker.log 2>&1 || { tail -20 /tmp/slide-apt-docker.log; fail "apt-get install"; }
fi
docker=docker; [ -x /usr/bin/docker ] && docker=/usr/bin/docker
if ! $docker info >/dev/null 2>&1; then
  say "starting dockerd"
  $SUDO setsid dockerd > /tmp/slide-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 60); do $docker info >/dev/null 2>&1 && break; sleep 1; done
  $docker info >/dev/null 2>&1 || { tail -20 /tmp/slide-dockerd.log; fail "dockerd did not start"; }
fi
if $docker compose version >/dev/null 2>&1; then compose=("$docker" compose); else compose=(docker-compose); fi
say "engine $($docker version -f '{{.Server.Version}}'), compose: $("${compose[@]}" version --short 2>/dev/null || true)"

# --- the base image -----------------------------------------------------------------------------------------------
base=${SLIDE_BASE_IMAGE:-debian:bookworm}
if ! $docker image inspect "$base" >/dev/null 2>&1 && ! timeout 60 $docker pull -q "$base" >/dev/null 2>&1; then
  say "no registry serves $base: debootstrap bookworm, then docker import"
  rootfs=$(mktemp -d /tmp/slide-bookworm.XXXXXX)
  $SUDO debootstrap --variant=minbase bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    > /tmp/slide-debootstrap.log 2>&1 || { tail -20 /tmp/slide-debootstrap.log; fail "debootstrap"; }
  $SUDO tar -C "$rootfs" -c . | $docker import - "$base" >/dev/null
  $SUDO rm -rf "$rootfs"
fi

# --- the images ---------------------------------------------------------------------------------------------------
build_args=(--build-arg "BASE=$base")
if [ "${SLIDE_DOCKER_FROM_SOURCE:-0}" != 1 ] && [ -x build/server/slided ] && [ -x build/client/slidectl ]; then
  build_args+=(--build-arg PREBUILT=build)
fi
# The host's CA bundle as a BuildKit secret: needed behind a TLS-intercepting proxy, harmless elsewhere.
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] && build_args+=(--secret "id=ca_bundle,src=$ca")
say "docker build slideformer:latest ${build_args[*]}"
DOCKER_BUILDKIT=1 $docker build -q -f docker/Dockerfile "${build_args[@]}" -t slideformer:latest . > /tmp/slide-image.log 2>&1 ||
  { tail -40 /tmp/slide-image.log; fail "docker build"; }
DOCKER_BUILDKIT=1 $docker build -q -f docker/prometheus.Dockerfile --build-arg "BASE=$base" \
  -t slideformer-prometheus:latest . > /tmp/slide-prometheus-image.log 2>&1 ||
  { tail -20 /tmp/slide-prometheus-image.log; fail "docker build (prometheus)"; }
say "images built: slideformer $($docker image inspect -f '{{.Size}}' slideformer:latest | numfmt --to=iec)"
# In CI the build stage's cache (the CUDA wheels unpacked, ~9 GB) is not needed again: give the disk back.
[ -n "${CI:-}" ] && $docker builder prune -af > /dev/null 2>&1

# --- the stack ----------------------------------------------------------------------------------------------------
work=$(mktemp -d /tmp/slide-smoke.XXXXXX)
project=slidesmoke$$
mkdir -p "$work"/{models,datasets,outputs,nvme}
cp -r deploy/demo/model "$work/models/demo"
cp deploy/demo/train.jsonl "$work/datasets/"
$SUDO chown 10001:10001 "$work/outputs" "$work/nvme"
token=$(openssl rand -hex 24)
printf 'SLIDE_TOKEN=%s\n' "$token" > "$work/slided.env"
memlock_kib=$(ulimit -H -l)
[ "$memlock_kib" = unlimited ] && memlock_kib=$((64 << 20))
export SLIDE_ENV_FILE=$work/slided.env SLIDE_MODELS_DIR=$work/models SLIDE_DATASETS_DIR=$work/datasets \
  SLIDE_OUTPUTS_DIR=$work/outputs SLIDE_NVME_DIR=$work/nvme SLIDE_GRPC_PUBLISH=127.0.0.1: \
  SLIDE_PROMETHEUS_PUBLISH=127.0.0.1: SLIDE_MEMLOCK_BYTES=$((memlock_kib * 1024)) SLIDE_BASE_IMAGE=$base
# Run in deploy/, as a user would: docker-compose 1.29 reads the seccomp profile's path from the working directory.
dc() { (cd "$root/deploy" && "${compose[@]}" -p "$project" -f docker-compose.yml -f docker-compose.ci.yml "$@"); }
cleanup() {
  dc logs --no-color > /tmp/slide-smoke-compose.log 2>&1 || true
  dc down -v > /dev/null 2>&1 || true
  $SUDO rm -rf "$work"
  [ -n "${CI:-}" ] && $docker image rm slideformer:latest slideformer-prometheus:latest > /dev/null 2>&1
  true
}
trap cleanup EXIT
dc up -d --no-build slided prometheus > /tmp/slide-smoke-up.log 2>&1 || { cat /tmp/slide-smoke-up.log; fail "compose up"; }
slided=$(dc ps -q slided)

# wait_healthy: the image's HEALTHCHECK (slidectl status inside the container) reports healthy.
wait_healthy() {
  local h=
  for _ in $(seq 90); do
    h=$($docker inspect -f '{{.State.Health.Status}}' "$slided" 2>/dev/null || true)
    [ "$h" = healthy ] && return 0
    sleep 1
  done
  $docker logs "$slided" 2>&1 | tail -20
  fail "slided's health check: '$h' after 90 s"
}
wait_healthy
[ "$($docker exec "$slided" id -u)" = 10001 ] || fail "slided does not run as uid 10001"
$docker inspect -f '{{json .HostConfig.SecurityOpt}}' "$slided" | grep -q "slided's container profile" ||
  fail "the container does not run under deploy/seccomp/io-uring.json"
grep -q '^Seccomp:[[:space:]]*2' <($docker exec "$slided" cat /proc/1/status) || fail "no seccomp filter on slided"
say "slided healthy, uid 10001, under the io_uring seccomp profile"
addr=$(dc port slided 50151 | tail -1)
ctl() { SLIDE_TOKEN=$token build/client/slidectl --addr "$addr" "$@"; }
ctl status > /tmp/slide-smoke-status.txt || { cat /tmp/slide-smoke-status.txt; fail "slidectl status through $addr"; }
grep -q . /tmp/slide-smoke-status.txt || fail "slidectl status printed nothing"
say "slidectl status through the published port $addr: $(head -1 /tmp/slide-smoke-status.txt)"

# job_file NAME STEPS CHECKPOINT_EVERY: the demo job with the container's paths, its moments on the NVMe tier.
job_file() {
  sed -e "s|^name: .*|name: $1|" -e "s|^model_dir: .*|model_dir: /models/demo|" \
    -e "s|^dataset: .*|dataset: /datasets/train.jsonl|" -e "s|^output_dir: .*|output_dir: /outputs/$1|" \
    -e "s|^steps: .*|steps: $2|" -e "s|^checkpoint_every: .*|checkpoint_every: $3|" \
    -e "s|^nvme_state: .*|nvme_state: moments|" deploy/demo/job.yaml > "$work/$1.yaml"
  echo "$work/$1.yaml"
}
# `slidectl logs` follows a running job to its end: read what it has so far.
logs_now() { SLIDE_TOKEN=$token timeout 10 build/client/slidectl --addr "$addr" logs "$1" > "$2" 2>&1 || true; }
job_id() { sed -n 's/^submitted \([^ ]*\).*/\1/p' "$1" | head -1; }

ctl submit "$(job_file demo 60 20)" > "$work/demo.submit" || { cat "$work/demo.submit"; fail "submit"; }
demo=$(job_id "$work/demo.submit")
[ -n "$demo" ] || { cat "$work/demo.submit"; fail "no job id in the submit reply"; }
ctl watch "$demo" > "$work/demo.watch" 2>&1 || { tail -20 "$work/demo.watch"; fail "the demo job did not succeed"; }
say "demo job: $(grep -E 'SUCCEEDED' "$work/demo.watch" | head -1)"
ls "$work/outputs/demo"/*.safetensors > /dev/null 2>&1 || fail "no export in the outputs volume: $(ls -R "$work/outputs")"
ctl logs "$demo" > "$work/demo.log"
grep -q 'on NVMe: .*io_uring' "$work/demo.log" ||
  { grep -i nvme "$work/demo.log"; fail "the NVMe tier did not use io_uring under the seccomp profile"; }
say "NVMe tier: $(grep -o 'on NVMe: .*' "$work/demo.log" | head -1)"

# Prometheus: the slided target is up, the alert rules are loaded, a slided series is stored.
prom=http://$(dc port prometheus 9090 | tail -1)
up=
for _ in $(seq 60); do
  up=$(curl -fsS "$prom/api/v1/targets" | python3 -c 'import json,sys; t=json.load(sys.stdin)["data"]["activeTargets"]; print(",".join(x["scrapeUrl"]+"="+x["health"] for x in t))' || true)
  [[ "$up" == *"slided:9464/metrics=up"* ]] && break
  sleep 2
done
[[ "$up" == *"slided:9464/metrics=up"* ]] || fail "Prometheus' slided target: $up"
rules=$(curl -fsS "$prom/api/v1/rules" | python3 -c 'import json,sys; g=json.load(sys.stdin)["data"]["groups"]; print(sum(len(x["rules"]) for x in g))')
[ "$rules" -gt 0 ] || fail "Prometheus loaded no alert rules"
series=$(curl -fsS "$prom/api/v1/query?query=slide_jobs" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))')
say "Prometheus: $up, $rules alert rules, slide_jobs series: $series"

# stop + up: a running job checkpoints at its step boundary on SIGTERM and resumes from the state volume.
ctl submit "$(job_file long 100000 1000)" > "$work/long.submit" || { cat "$work/long.submit"; fail "submit"; }
long=$(job_id "$work/long.submit")
for _ in $(seq 120); do
  step=$(ctl --json get "$long" | python3 -c 'import json,sys; print(int(json.load(sys.stdin).get("step", 0)))' || echo 0)
  [ "$step" -ge 30 ] && break
  sleep 1
done
[ "$step" -ge 30 ] || fail "the long job did not reach step 30"
dc stop slided > /dev/null 2>&1
[ "$($docker inspect -f '{{.State.ExitCode}}' "$slided")" = 0 ] || fail "slided exited non-zero on stop"
dc up -d --no-build slided > /dev/null 2>&1
slided=$(dc ps -q slided)
wait_healthy
addr=$(dc port slided 50151 | tail -1)
logs_now "$long" "$work/long.log"
suspended=$(sed -n 's/^suspended at step \([0-9]*\).*/\1/p' "$work/long.log" | head -1)
[ -n "$suspended" ] || { tail -20 "$work/long.log"; fail "stop did not checkpoint the running job"; }
for _ in $(seq 120); do
  grep -q "resumed from the checkpoint at step $suspended" "$work/long.log" && break
  sleep 1
  logs_now "$long" "$work/long.log"
done
grep -q "resumed from the checkpoint at step $suspended" "$work/long.log" ||
  { tail -20 "$work/long.log"; fail "up did not resume the job from step $suspended"; }
ctl cancel "$long" > /dev/null
say "stop checkpointed the running job at step $suspended; up resumed it there"
say "OK in $((SECONDS - t0)) s"
