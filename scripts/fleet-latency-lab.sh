#!/usr/bin/env bash
# What a [fleet] store adds to a request's latency on loopback: one llmlb
# instance in front of two `fast` simulated replicas with `max_inflight`,
# without and with a redis-server store, ROUNDS times in turn; one line per
# run, then the median of the per-round differences (docs/lab/fleet-instances.md).
#
#   scripts/fleet-latency-lab.sh [ROUNDS]
# Env: LLMLB (binary, default target/release/llmlb), REQUESTS (600).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
LLMLB=${LLMLB:-target/release/llmlb}
REQUESTS=${REQUESTS:-600}
work=$(mktemp -d /tmp/llmlb-fleet-lat.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

base=$(( 20000 + (RANDOM % 2000) * 8 ))
"$LLMLB" replica-sim --profile fast --replicas 2 --port "$base" --model m 2>"$work/sim.log" &
pids+=($!)
for i in 0 1; do
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$((base + i))/health" >/dev/null && break; sleep 0.05; done
done
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
pids+=($!)
for _ in $(seq 200); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

# run NAME FLEET: one instance, one bench run; prints "p50_ttft p50_e2e refresh_mean_ms".
run() {
  local fleet="" cfg="$work/$1.toml" log="$work/$1.log"
  [[ $2 == 1 ]] && fleet="[fleet]
store = \"redis://127.0.0.1:$rport\""
  cat >"$cfg" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
$fleet
[[pools]]
name = "p"
models = ["m"]
balancer = "least_connections"
max_inflight = 8
[[pools.replicas]]
url = "http://127.0.0.1:$base"
[[pools.replicas]]
url = "http://127.0.0.1:$((base + 1))"
EOF
  RUST_LOG=warn,llmlb=info "$LLMLB" --log-format json serve --config "$cfg" 2>"$log" &
  local pid=$!
  for _ in $(seq 200); do grep -q '"addr"' "$log" 2>/dev/null && break; sleep 0.05; done
  local addr admin
  addr=$(grep -m1 -o '"addr":"[^"]*"' "$log" | cut -d'"' -f4)
  admin=$(grep -m1 -o '"admin_addr":"[^"]*"' "$log" | cut -d'"' -f4)
  sleep 0.5
  "$LLMLB" bench --target "http://$addr" --model m --workload random --input-len 64 --output-len 8 \
    --concurrency 4 --requests "$REQUESTS" --seed 1 --no-progress --out "$work/$1.json" >/dev/null 2>&1
  local refresh
  refresh=$(curl -s "http://$admin/metrics" | awk '$1 == "llmlb_fleet_refresh_seconds_sum" {s = $2} $1 == "llmlb_fleet_refresh_seconds_count" {c = $2} END {if (c > 0) printf "%.3f", 1000 * s / c; else print "-"}')
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$work/$1.json" "$refresh" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
assert f["failed"] == 0, f["errors"]
print(f"{f['ttft_ms']['p50']:.3f} {f['e2e_ms']['p50']:.3f} {sys.argv[2]}")
PY
}

diffs=()
for r in $(seq 1 "$ROUNDS"); do
  read -r t0 e0 _ < <(run "plain$r" 0)
  read -r t1 e1 ref < <(run "fleet$r" 1)
  echo "round=$r without: ttft_p50_ms=$t0 e2e_p50_ms=$e0  with [fleet]: ttft_p50_ms=$t1 e2e_p50_ms=$e1 refresh_mean_ms=$ref"
  diffs+=("$(python3 -c "print($e1 - $e0)")")
done
python3 -c "import statistics, sys; d = [float(x) for x in sys.argv[1:]]; print(f'added e2e p50 (median over rounds): {statistics.median(d):+.3f} ms; per round: ' + ', '.join(f'{x:+.3f}' for x in d))" "${diffs[@]}"
