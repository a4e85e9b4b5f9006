#!/usr/bin/env bash
# Soak: steady streaming load through llmlb for DURATION seconds (default 600)
# while the config is reloaded every RELOAD_EVERY seconds (alternately by
# SIGHUP and by editing the watched file), sampling llmlb's resident memory
# and open file descriptors. Everything runs on 127.0.0.1 and is stopped on
# exit. Prints one line per sample and a summary.
#
#   cargo build --release && scripts/soak.sh            # 10 minutes
#   DURATION=60 RATE=10 scripts/soak.sh                  # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-600}
RATE=${RATE:-20}
SAMPLE_EVERY=${SAMPLE_EVERY:-30}
RELOAD_EVERY=${RELOAD_EVERY:-60}
BIN=${BIN:-./target/release/llmlb}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Three simulated replicas on consecutive ports.
while :; do
  base=$(free_port)
  if [ "$base" -lt 60000 ]; then break; fi
done
"$BIN" replica-sim --port "$base" --replicas 3 --profile fast --model soak-model >"$work/sim.log" 2>&1 &
pids+=($!)
listen=$(free_port)
admin=$(free_port)

write_config() { # $1 = weight of the first replica
  cat >"$work/llmlb.toml.tmp" <<EOF
[server]
listen = "127.0.0.1:$listen"
admin_listen = "127.0.0.1:$admin"
watch_interval = "1s"
[[pools]]
name = "soak"
models = ["soak-model"]
balancer = "least_tokens"
max_inflight = 32
[[pools.replicas]]
url = "http://127.0.0.1:$base"
weight = $1
[[pools.replicas]]
url = "http://127.0.0.1:$((base + 1))"
[[pools.replicas]]
url = "http://127.0.0.1:$((base + 2))"
EOF
  mv "$work/llmlb.toml.tmp" "$work/llmlb.toml"
}
write_config 1
"$BIN" serve --config "$work/llmlb.toml" >"$work/llmlb.log" 2>&1 &
lb=$!
pids+=($lb)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

"$BIN" bench --target "http://127.0.0.1:$listen" --model soak-model --workload random \
  --input-len 256 --output-len 64 --rate "$RATE" --duration "${DURATION}s" --timeout 30s \
  --no-progress --out "$work/soak.json" >"$work/bench.log" 2>&1 &
bench=$!
pids+=($bench)

sample() {
  local rss fds
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$lb/status")
  fds=$(ls "/proc/$lb/fd" | wc -l)
  printf '%6ds  rss %6d KiB  fds %4d  reloads ok %s failed %s\n' "$1" "$rss" "$fds" \
    "$(curl -s "http://127.0.0.1:$admin/metrics" | awk '/^llmlb_config_reloads_total\{result="success"\}/ {print $2}')" \
    "$(curl -s "http://127.0.0.1:$admin/metrics" | awk '/^llmlb_config_reloads_total\{result="failure"\}/ {print $2}')"
  echo "$1 $rss $fds" >>"$work/samples"
}

start=$(date +%s)
next_sample=0
next_reload=$RELOAD_EVERY
reloads=0
while kill -0 "$bench" 2>/dev/null; do
  now=$(( $(date +%s) - start ))
  if [ "$now" -ge "$next_sample" ]; then
    sample "$now"
    next_sample=$((next_sample + SAMPLE_EVERY))
  fi
  if [ "$now" -ge "$next_reload" ]; then
    reloads=$((reloads + 1))
    if [ $((reloads % 2)) -eq 1 ]; then
      write_config 2           # the watcher picks the change up
    else
      write_config 1
      kill -HUP "$lb"          # and SIGHUP reloads at once
    fi
    next_reload=$((next_reload + RELOAD_EVERY))
  fi
  [ "$now" -gt $((DURATION + 120)) ] && { echo "bench did not stop in time" >&2; exit 1; }
  sleep 1
done
sample "$(( $(date +%s) - start ))"
wait "$bench" || true

echo
tail -n 25 "$work/bench.log" | grep -E "completed|requests/s|TTFT p99|errors" || true
awk 'NR==1 {r0=$2; f0=$3} {r=$2; f=$3; if ($2>rmax) rmax=$2; if ($3>fmax) fmax=$3}
     END {printf "rss first %d KiB, last %d KiB, max %d KiB; fds first %d, last %d, max %d; %d samples\n", r0, r, rmax, f0, f, fmax, NR}' "$work/samples"
