#!/usr/bin/env bash
# The demo's priority scenario (`llmlb demo --scenario priority`, the
# "priority queue" variant) through several llmlb instances, with or without
# a shared [fleet] store: one result line (docs/lab/fleet-instances.md).
#
#   scripts/fleet-priority-lab.sh INSTANCES FLEET SEED
#     INSTANCES  llmlb instances (each tier's requests go to them in turn)
#     FLEET      1: the instances share a redis-server [fleet] store; 0: not
#     SEED       workload seed
# Env: LLMLB (binary, default target/release/llmlb), RATE (14: paid gets
#      0.5 x RATE req/s, free 2.5 x RATE), RUN_SECONDS (20), KEEP (a
#      directory: each tier's `llmlb bench --out` report, every request in
#      it, is copied there as TIER-INSTANCES-FLEET-SEED.json, and the
#      requests running on each replica every 50 ms as
#      running-INSTANCES-FLEET-SEED.txt), SEND_PRIORITY
#      (1: the replicas schedule by priority and the pool sends each
#      request's level as `priority`; default 0), MAX_INFLIGHT (per replica,
#      default 16, the replicas' batch size; `none`: no limit and no queue in
#      llmlb, the replicas queue), MAX_PREFILLING (the pool's
#      `max_prefilling`; default unset), OUTPUT_LEN (tokens per answer, `N`
#      or `MIN..MAX`, default 128 as in the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
N=$1 FLEET=$2 SEED=$3
LLMLB=${LLMLB:-target/release/llmlb}
RATE=${RATE:-14} SECONDS_=${RUN_SECONDS:-20}
work=$(mktemp -d /tmp/llmlb-fleet-prio.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Two replicas that batch at most 16 sequences, as in the demo.
base=$(( 20000 + (RANDOM % 2000) * 8 ))
limit="max_inflight = ${MAX_INFLIGHT:-16}"
[[ ${MAX_INFLIGHT:-16} == none ]] && limit=""
[[ -n ${MAX_PREFILLING:-} ]] && limit="$limit
max_prefilling = $MAX_PREFILLING"
send_priority=false sim_priority=()
if [[ ${SEND_PRIORITY:-0} == 1 ]]; then send_priority=true sim_priority=(--priority-scheduling); fi
"$LLMLB" replica-sim --replicas 2 --port "$base" --max-num-seqs 16 \
  --model m --seed "$SEED" "${sim_priority[@]}" 2>"$work/sim.log" &
pids+=($!)
for i in 0 1; do
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$((base + i))/health" >/dev/null && break; sleep 0.05; done
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
cat >"$work/llmlb.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
$fleet
$(cat src/demo/tiers.toml)
[[pools]]
name = "p"
models = ["m"]
balancer = "least_connections"
$limit
send_priority = $send_priority
[pools.queue]
max_depth = 512
timeout = "30s"
[pools.scrape]
interval = "100ms"
timeout = "100ms"
staleness = "1000ms"
[[pools.replicas]]
url = "http://127.0.0.1:$base"
[[pools.replicas]]
url = "http://127.0.0.1:$((base + 1))"
EOF

targets=()
for i in $(seq 1 "$N"); do
  RUST_LOG=warn,llmlb=info "$LLMLB" --log-format json serve --config "$work/llmlb.toml" 2>"$work/lb$i.log" &
  pids+=($!)
  for _ in $(seq 200); do grep -q '"addr"' "$work/lb$i.log" 2>/dev/null && break; sleep 0.05; done
  addr=$(grep -m1 -o '"addr":"[^"]*"' "$work/lb$i.log" | cut -d'"' -f4)
  targets+=("http://$addr")
done
sleep 0.5
target=$(IFS=,; echo "${targets[*]}")

tier() { # name rate seed
  local n
  n=$(python3 -c "import math; print(math.ceil($2 * $SECONDS_))")
  "$LLMLB" bench --target "$target" --model m --workload random --input-len 512 --output-len "${OUTPUT_LEN:-128}" \
    --rate "$2" --requests "$n" --duration "$((SECONDS_ * 2))s" --timeout 120s \
    --header "x-llmlb-tier:$1" --seed "$3" --no-progress --out "$work/$1.json" >"$work/$1.txt" 2>&1
}
if [[ -n ${KEEP:-} ]]; then
  # Requests running on each replica, every 50 ms while the load runs.
  ( end=$((SECONDS + SECONDS_ + 10))
    while (( SECONDS < end )); do
      line=""
      for i in 0 1; do
        n=$(curl -sf "http://127.0.0.1:$((base + i))/metrics" | awk '/^vllm:num_requests_running/ {print $2}' || true)
        line="$line ${n:-nan}"
      done
      echo "$line"
      sleep 0.05
    done ) >"$work/running.txt" 2>/dev/null &
  pids+=($!)
fi
paid_rate=$(python3 -c "print($RATE * 0.5)")
free_rate=$(python3 -c "print($RATE * 2.5)")
tier paid "$paid_rate" "$SEED" &
p1=$!
tier free "$free_rate" "$((SEED + 1))" &
p2=$!
wait $p1 $p2
if [[ -n ${KEEP:-} ]]; then
  mkdir -p "$KEEP"
  for t in paid free; do cp "$work/$t.json" "$KEEP/$t-$N-$FLEET-$SEED.json"; done
  cp "$work/running.txt" "$KEEP/running-$N-$FLEET-$SEED.txt"
  for i in $(seq 1 "$N"); do cp "$work/lb$i.log" "$KEEP/lb$i-$N-$FLEET-$SEED.log"; done
fi

python3 - "$work/paid.json" "$work/free.json" "$N" "$FLEET" "$SEED" <<'PY'
import json, sys
paid = json.load(open(sys.argv[1]))
free = json.load(open(sys.argv[2]))
n, fleet, seed = sys.argv[3:6]
def share(f):
    return f"{100 * f['rejected_429'] / max(f['sent'], 1):.1f}%"
print(f"instances={n} fleet={fleet} seed={seed} "
      f"paid_ttft_p50_ms={paid['ttft_ms']['p50']:.0f} paid_ttft_p99_ms={paid['ttft_ms']['p99']:.0f} "
      f"free_ttft_p50_ms={free['ttft_ms']['p50']:.0f} free_ttft_p99_ms={free['ttft_ms']['p99']:.0f} "
      f"paid_429={share(paid)} free_429={share(free)} "
      f"failed_other_than_429={paid['failed'] + free['failed'] - paid['rejected_429'] - free['rejected_429']}")
PY
