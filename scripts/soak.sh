#!/usr/bin/env bash
# Soak run, on 127.0.0.1 only, bounded by SOAK_DURATION (default 600 s):
# four `llmlb sim` replicas behind `llmlb serve`, moderate open-loop streaming
# load from `llmlb bench`, and a config reload every RELOAD_EVERY seconds
# (default 30; it alternates replica r3's weight between 1 and 2, so each
# reload rebuilds the topology, alternately by SIGHUP and POST /admin/reload).
#
# Every SAMPLE_EVERY seconds (default 10) it prints llmlb's resident memory
# (VmRSS) and open file descriptors; at the end, the first and last samples
# and the bench outcome counts. Exits 1 when memory or descriptors grew by
# more than half between the first full minute and the last one.
#
# Usage: scripts/soak.sh                       (10 minutes, target/release/llmlb if built, else debug)
#        SOAK_DURATION=60 RATE=10 scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${SOAK_DURATION:-600}
RATE=${RATE:-20}
RELOAD_EVERY=${RELOAD_EVERY:-30}
SAMPLE_EVERY=${SAMPLE_EVERY:-10}
if [ -n "${LLMLB_BIN:-}" ]; then BIN=$LLMLB_BIN
elif [ -x target/release/llmlb ]; then BIN=target/release/llmlb
else
    [ -x target/debug/llmlb ] || cargo build --quiet
    BIN=target/debug/llmlb
fi
for tool in curl jq; do
    command -v "$tool" >/dev/null || { echo "soak.sh needs $tool" >&2; exit 2; }
done

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

BASE=$((20000 + RANDOM % 20000))
LB=$((BASE + 10))
ADMIN=$((BASE + 11))

wait_http() {
    local deadline=$(($(date +%s) + $2))
    until curl -fsS -o /dev/null "$1" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "timeout waiting for $1" >&2; exit 2; }
        sleep 0.05
    done
}

for i in 0 1 2 3; do
    "$BIN" sim --port $((BASE + i)) --replicas 1 --profile fast --model llama >"$WORK/sim$i.log" 2>&1 &
    PIDS+=($!)
done
for i in 0 1 2 3; do wait_http "http://127.0.0.1:$((BASE + i))/health" 20; done

write_config() { # weight of r3
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' "$LB" "$ADMIN"
        printf 'drain_delay = "0s"\nwatch_interval = "0s"\n'
        printf '[[pools]]\nname = "llama"\nmodels = ["llama"]\nbalancer = "least_connections"\n'
        printf '[pools.health]\nenabled = true\ninterval = "1s"\ntimeout = "500ms"\n'
        for i in 0 1 2 3; do
            w=1; [ "$i" = 3 ] && w=$1
            printf '[[pools.replicas]]\nname = "r%s"\nurl = "http://127.0.0.1:%s"\nweight = %s\n' "$i" $((BASE + i)) "$w"
        done
    } >"$WORK/llmlb.toml.new"
    mv "$WORK/llmlb.toml.new" "$WORK/llmlb.toml"
}
write_config 1
"$BIN" serve --config "$WORK/llmlb.toml" >"$WORK/llmlb.log" 2>&1 &
LB_PID=$!
PIDS+=("$LB_PID")
wait_http "http://127.0.0.1:$ADMIN/readyz" 20

"$BIN" bench --target "http://127.0.0.1:$LB" --model llama --rate "$RATE" \
    --duration "${DURATION}s" --num-requests $((RATE * DURATION + RATE)) --input-len 64..512 --output-len 16..128 \
    --timeout 60s --no-progress --out "$WORK/bench.json" >"$WORK/bench.log" 2>&1 &
BENCH_PID=$!
PIDS+=("$BENCH_PID")

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$LB_PID/status"; }
fds() { ls "/proc/$LB_PID/fd" | wc -l; }

echo "   t(s)  rss(KiB)  fds  reloads"
start=$(date +%s)
reloads=0
next_reload=$RELOAD_EVERY
samples="$WORK/samples"
while kill -0 "$BENCH_PID" 2>/dev/null; do
    t=$(($(date +%s) - start))
    [ "$t" -le $((DURATION + 60)) ] || break
    if [ "$t" -ge "$next_reload" ]; then
        reloads=$((reloads + 1))
        write_config $((1 + reloads % 2))
        if [ $((reloads % 2)) = 0 ]; then
            kill -HUP "$LB_PID"
        else
            curl -fsS -o /dev/null -X POST "http://127.0.0.1:$ADMIN/admin/reload"
        fi
        next_reload=$((next_reload + RELOAD_EVERY))
    fi
    printf '%7d %9d %4d %8d\n' "$t" "$(rss_kb)" "$(fds)" "$reloads" | tee -a "$samples"
    sleep "$SAMPLE_EVERY"
done
wait "$BENCH_PID" || true

echo
echo "bench outcomes:"
jq -r '[.requests[] | .outcome.kind] | group_by(.) | map("  \(.[0]): \(length)") | .[]' "$WORK/bench.json"
per_minute=$((60 / SAMPLE_EVERY))
[ "$per_minute" -ge 1 ] || per_minute=1
first=$(sed -n "2,$((per_minute + 1))p" "$samples" | awk '{r+=$2; f+=$3; n++} END {if (n) printf "%d %d", r/n, f/n}')
last=$(tail -n "$per_minute" "$samples" | awk '{r+=$2; f+=$3; n++} END {if (n) printf "%d %d", r/n, f/n}')
echo "mean rss KiB / fds, first minute: $first; last minute: $last"
read -r r0 f0 <<<"$first"
read -r r1 f1 <<<"$last"
if [ "$r1" -gt $((r0 * 3 / 2)) ] || [ "$f1" -gt $((f0 * 3 / 2 + 8)) ]; then
    echo "FAIL: memory or descriptors grew"
    exit 1
fi
echo "PASS: memory and descriptors flat"
