#!/usr/bin/env bash
# Several llmlb instances in front of simulated replicas, with or without a
# shared [fleet] store: one run of the shared-prefix workload, one result
# line (docs/lab/fleet-instances.md).
#
#   scripts/fleet-lab.sh INSTANCES LIMIT FLEET SEED
#     INSTANCES  llmlb instances (clients' requests go to them in turn)
#     LIMIT      max_inflight per replica, or 0 for none
#     FLEET      1: the instances share a redis-server [fleet] store; 0: not
#     SEED       workload seed (fresh prompts per run)
# Env: LLMLB (binary, default target/release/llmlb), REPLICAS (4),
#      BLOCKS (1024), CLIENTS (24), PREFIX_GROUPS (16), PER_GROUP (12), MODE (cache).
set -euo pipefail
cd "$(dirname "$0")/.."
N=$1 LIMIT=$2 FLEET=$3 SEED=$4
LLMLB=${LLMLB:-target/release/llmlb}
REPLICAS=${REPLICAS:-4} BLOCKS=${BLOCKS:-1024} CLIENTS=${CLIENTS:-24}
GROUPS_=${PREFIX_GROUPS:-16} PER_GROUP=${PER_GROUP:-12} MODE=${MODE:-cache}
work=$(mktemp -d /tmp/llmlb-fleet-lab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Replicas: one process, ports BASE..BASE+REPLICAS-1.
base=$(( 20000 + (RANDOM % 2000) * 8 ))
# The longest request the KV cache can hold (one block kept back).
"$LLMLB" replica-sim --replicas "$REPLICAS" --port "$base" --num-blocks "$BLOCKS" \
  --max-model-len $(( (BLOCKS - 1) * 16 )) --model m --seed "$SEED" 2>"$work/sim.log" &
pids+=($!)
for i in $(seq 0 $((REPLICAS - 1))); do
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$((base + i))/health" >/dev/null && break; sleep 0.05; done
  curl -sf "http://127.0.0.1:$((base + i))/health" >/dev/null || { cat "$work/sim.log" >&2; exit 1; }
done

fleet=""
if [[ $FLEET == 1 ]]; then
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
  pids+=($!)
  for _ in $(seq 200); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  fleet="[fleet]
store = \"redis://127.0.0.1:$rport\""
fi
limit=""
[[ $LIMIT != 0 ]] && limit="max_inflight = $LIMIT"
{
  echo "[server]"; echo 'listen = "127.0.0.1:0"'; echo 'admin_listen = "127.0.0.1:0"'
  echo "$fleet"
  echo '[[pools]]'; echo 'name = "p"'; echo 'models = ["m"]'; echo 'balancer = "least_connections"'
  echo "$limit"
  echo "[pools.queue]"; echo 'max_wait = "60s"'; echo 'timeout = "120s"'
  echo "[pools.prefix]"; echo "mode = \"$MODE\""
  for i in $(seq 0 $((REPLICAS - 1))); do
    echo '[[pools.replicas]]'; echo "url = \"http://127.0.0.1:$((base + i))\""
  done
} >"$work/llmlb.toml"

targets=()
for i in $(seq 1 "$N"); do
  RUST_LOG=warn,llmlb=info "$LLMLB" --log-format json serve --config "$work/llmlb.toml" 2>"$work/lb$i.log" &
  pids+=($!)
  for _ in $(seq 200); do grep -q '"addr"' "$work/lb$i.log" 2>/dev/null && break; sleep 0.05; done
  addr=$(grep -m1 -o '"addr":"[^"]*"' "$work/lb$i.log" | cut -d'"' -f4)
  targets+=("http://$addr")
done
sleep 0.5

metric() { # replica port, metric name: the sum of its samples
  curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($1, m "{") == 1 || $1 == m {s += $2} END {printf "%d\n", s}'
}
hits_before=0 queries_before=0
for i in $(seq 0 $((REPLICAS - 1))); do
  hits_before=$(( hits_before + $(metric $((base + i)) vllm:prefix_cache_hits_total) ))
  queries_before=$(( queries_before + $(metric $((base + i)) vllm:prefix_cache_queries_total) ))
done

# Sample every replica's running + waiting from its own metrics.
( peak=0
  while [[ ! -f "$work/done" ]]; do
    for i in $(seq 0 $((REPLICAS - 1))); do
      v=$(curl -s "http://127.0.0.1:$((base + i))/metrics" | awk 'index($1, "vllm:num_requests_running") == 1 || index($1, "vllm:num_requests_waiting") == 1 {s += $2} END {printf "%d\n", s}')
      (( v > peak )) && peak=$v
    done
    echo "$peak" >"$work/peak"
    sleep 0.02
  done ) &
pids+=($!)

target=$(IFS=,; echo "${targets[*]}")
"$LLMLB" bench --target "$target" --model m --workload shared-prefix \
  --groups "$GROUPS_" --prompts-per-group "$PER_GROUP" --system-len 330 --question-len 24 \
  --output-len 64 --concurrency "$CLIENTS" --seed "$SEED" --no-progress \
  --out "$work/bench.json" >"$work/bench.txt" 2>&1
touch "$work/done"
sleep 0.1

hits=0 queries=0
for i in $(seq 0 $((REPLICAS - 1))); do
  hits=$(( hits + $(metric $((base + i)) vllm:prefix_cache_hits_total) ))
  queries=$(( queries + $(metric $((base + i)) vllm:prefix_cache_queries_total) ))
done
python3 - "$work/bench.json" "$((hits - hits_before))" "$((queries - queries_before))" "$(cat "$work/peak")" "$N" "$LIMIT" "$FLEET" "$SEED" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
hits, queries, peak = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n, limit, fleet, seed = sys.argv[5:9]
print(f"instances={n} limit={limit} fleet={fleet} seed={seed} completed={r['completed']} "
      f"failed={r['failed']} hits={hits / max(queries, 1):.3f} "
      f"ttft_p50_ms={r['ttft_ms']['p50']:.0f} ttft_p99_ms={r['ttft_ms']['p99']:.0f} "
      f"peak_running_waiting={peak}")
PY
