#!/usr/bin/env bash
# Opt-in check of llmlb's routing policies in front of two real vLLM CPU
# replicas (the build from ../shared/vllm-cpu), both publishing their
# KV-cache events (with replay) on 127.0.0.1.
#
# Skipped, with the reason and exit 0, when the vLLM CPU venv or its tiny
# model is absent. Otherwise: builds llmlb in release mode (cargo skips a current build;
# no build when --llmlb names a binary), then
# runs scripts/real_vllm_check.py on each backend in BACKENDS (default
# `vllm,sim`: the real replicas, then two `llmlb replica-sim --profile vllm-cpu-tiny`
# replicas tokenizing with the same model directory). For the real backend
# it starts two replicas (ports 18600/18601 unless given, pinned to cores 0
# and 1), runs `llmlb doctor` against them, then round_robin,
# least_connections, hash, cache and exact through a fresh `llmlb serve`
# with [pools.tokenizer] dir = the replicas' model directory, prints the
# table, and stops the replicas; then the same for the simulated replicas
# (ports 40 above the real ones), and last whether the two backends rank the
# policies the same way by p99 TTFT and by prefix hits.
# The replicas are stopped on any exit of this script too, each with its whole
# process group (scripts/vllm_replica.py); a replica gets VLLM_START_WAIT
# seconds (default 900) to answer /health.
#
# vLLM binds its event socket only for a wildcard (all interfaces) endpoint;
# to stay on 127.0.0.1 its PUB socket connects to a loopback relay
# (scripts/kv_events_relay.py, EVENTS_PORT+i) and llmlb subscribes to the
# relay (SUBSCRIBE_PORT+i). The replay endpoint is bound by vLLM itself.
#
# Usage: scripts/real-vllm-check.sh [extra real_vllm_check.py arguments]
# Environment: BACKENDS (vllm,sim; `vllm` alone for the real one), VLLM_START_WAIT, LLMLB_SHARED (the
# shared directory, default ../shared beside the checkout), VLLMCPU_DIR (default ~/.cache/llmlb-vllm-cpu), REPLICA_PORT
# (18600), EVENTS_PORT (15660), REPLAY_PORT (15670), PROXY_PORT (18680).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_DIR="${VLLMCPU_DIR:-$HOME/.cache/llmlb-vllm-cpu}"
SERVE="${LLMLB_SHARED:-$ROOT/../shared}/vllm-cpu/setup_and_serve.sh"
REPLICA_PORT="${REPLICA_PORT:-18600}"
EVENTS_PORT="${EVENTS_PORT:-15660}"
REPLAY_PORT="${REPLAY_PORT:-15670}"
PROXY_PORT="${PROXY_PORT:-18680}"
SUBSCRIBE_PORT="${SUBSCRIBE_PORT:-15680}"
RELAYS=()

skip() {
  echo "real-vllm-check: skipped: $1"
  exit 0
}

[ -x "$VLLM_DIR/venv/bin/vllm" ] ||
  skip "no vLLM CPU venv at $VLLM_DIR (install it with: bash ../shared/vllm-cpu/setup_and_serve.sh install; then ... model)"
[ -f "$VLLM_DIR/tinymodel/tokenizer.json" ] ||
  skip "no tiny model at $VLLM_DIR/tinymodel (make it with: bash ../shared/vllm-cpu/setup_and_serve.sh model)"
[ -f "$SERVE" ] || skip "no $SERVE"
command -v python3 >/dev/null || skip "no python3"

stop_replicas() {
  for pid in "${RELAYS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for port in "$REPLICA_PORT" "$((REPLICA_PORT + 1))"; do
    VLLMCPU_DIR="$VLLM_DIR" python3 "$ROOT/scripts/vllm_replica.py" stop --port "$port" >/dev/null 2>&1 || true
  done
}
trap stop_replicas EXIT

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
# Through cargo unless `--llmlb` names the binary: one older than the
# sources is rebuilt (a no-op when it is current), so the run measures this
# checkout.
case " $* " in
  *" --llmlb "*|*" --llmlb="*) ;;
  *) (cd "$ROOT" && cargo build --release --bin llmlb) ;;
esac

for i in 0 1; do
  "$VLLM_DIR/venv/bin/python" "$ROOT/scripts/kv_events_relay.py" \
    "$((EVENTS_PORT + i))" "$((SUBSCRIBE_PORT + i))" &
  RELAYS+=("$!")
done

echo "machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$ROOT/scripts/real_vllm_check.py" --backends "${BACKENDS:-vllm,sim}" \
  --llmlb "$TARGET/release/llmlb" \
  --replica-port "$REPLICA_PORT" --events-port "$EVENTS_PORT" \
  --replay-port "$REPLAY_PORT" --subscribe-port "$SUBSCRIBE_PORT" \
  --proxy-port "$PROXY_PORT" --system-len 450 "$@"
