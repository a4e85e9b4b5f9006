#!/usr/bin/env bash
# Renders llmlb's admin status page in a real headless browser against a
# running `llmlb serve` in front of three simulated replicas (all on
# 127.0.0.1), and checks that:
#   1. the page lists every replica as up, with the load they report, a
#      prefix-cache hit rate for at least one of them, and a table of recent
#      dispatches with rows;
#   2. after one replica is stopped, the page shows it down or ejected while
#      the others stay up (the page refreshes itself from /admin/status).
# Saves a screenshot of the second state (default docs/status-page.png).
# Installs Debian's chromium when it is missing. Bounded: a few streaming
# requests, every wait capped; everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
SHOT=${1:-docs/status-page.png}

if ! command -v chromium >/dev/null; then
    echo "== installing chromium (Debian package)"
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null; }
fi

echo "== cargo build --bin llmlb"
cargo build --quiet --bin llmlb
LLMLB=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/llmlb

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Waits (up to 10 s) until FILE has a line matching REGEX; prints the match.
wait_for_line() {
    local file=$1 regex=$2
    for _ in $(seq 100); do
        if grep -qE "$regex" "$file" 2>/dev/null; then grep -oE "$regex" "$file" | head -1; return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for /$regex/ in $file" >&2; cat "$file" >&2; return 1
}

echo "== three simulated replicas"
SIM_PIDS=()
URLS=()
for i in 0 1 2; do
    "$LLMLB" replica-sim --port 0 --model llama-3-8b --profile h100-8b --num-blocks 800 --max-model-len 8192 --seed "$i" >"$WORK/sim$i.out" 2>"$WORK/sim$i.err" &
    PIDS+=($!); SIM_PIDS+=($!)
    URLS+=("$(wait_for_line "$WORK/sim$i.out" 'http://127\.0\.0\.1:[0-9]+')")
done

cat >"$WORK/llmlb.toml" <<TOML
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
watch_interval = "0s"

[[pools]]
name = "llama"
models = ["llama-3-8b"]
balancer = "jsq"
max_inflight = 4

[pools.scrape]
interval = "250ms"
timeout = "200ms"
staleness = "2s"

[pools.health]
enabled = true
interval = "300ms"
timeout = "200ms"
fall = 2
rise = 2

[pools.outlier]
consecutive_failures = 1

[[pools.replicas]]
url = "${URLS[0]}"
name = "sim-0"
[[pools.replicas]]
url = "${URLS[1]}"
name = "sim-1"
[[pools.replicas]]
url = "${URLS[2]}"
name = "sim-2"
TOML

echo "== llmlb serve"
"$LLMLB" --log-format json serve --config "$WORK/llmlb.toml" >"$WORK/lb.out" 2>"$WORK/lb.err" &
PIDS+=($!)
ADDR=$(wait_for_line "$WORK/lb.err" '"addr":"127\.0\.0\.1:[0-9]+"' | grep -oE '[0-9.]+:[0-9]+')
ADMIN=$(wait_for_line "$WORK/lb.err" '"admin_addr":"127\.0\.0\.1:[0-9]+"' | grep -oE '[0-9.]+:[0-9]+')
echo "   api $ADDR, admin $ADMIN"

# Some load, so in-flight, KV usage and the queue are not all zero: 14
# streams (capacity is 3 x max_inflight = 12), each
# bounded by --max-time. The prompts share a long first part, so replicas
# that get more than one report prefix-cache hits.
for i in $(seq 14); do
    curl -s -N --max-time 30 "http://$ADDR/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"llama-3-8b\",\"prompt\":\"$(printf 'x%.0s' $(seq 400)) status page check $i\",\"max_tokens\":1500,\"stream\":true}" \
        >/dev/null &
    PIDS+=($!)
done

browser() {
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
        --user-data-dir="$WORK/chrome" --virtual-time-budget=4000 "$@" "http://$ADMIN/" 2>>"$WORK/chrome.err"
}

# Counts replica rows in DOM with the given state.
rows() { { grep -oE "data-replica=\"sim-[0-9]\" data-state=\"$2\"" "$1" || true; } | wc -l; }

echo "== render 1: every replica up"
sleep 1.5   # let health checks and scrapes report (cadence 250-300 ms)
browser --dump-dom >"$WORK/dom1.html"
up=$(rows "$WORK/dom1.html" up)
echo "   rows up: $up"
[ "$up" = 3 ] || { echo "FAIL: expected 3 replicas up"; sed -n '1,200p' "$WORK/dom1.html"; exit 1; }
grep -q 'class="pill ok">ready<' "$WORK/dom1.html" || { echo "FAIL: page does not say ready"; exit 1; }
dispatches=$({ grep -oE 'data-dispatch="[0-9]+"' "$WORK/dom1.html" || true; } | wc -l)
echo "   recent dispatch rows: $dispatches"
[ "$dispatches" -ge 1 ] && [ "$dispatches" -le 50 ] \
    || { echo "FAIL: expected 1..50 recent dispatch rows"; exit 1; }
hits=$({ grep -oE 'data-col="prefix-hits"[^>]*>[0-9.]+%<' "$WORK/dom1.html" || true; } | wc -l)
echo "   replicas with a prefix-cache hit rate: $hits"
[ "$hits" -ge 1 ] || { echo "FAIL: no prefix-cache hit rate shown"; exit 1; }

echo "== stop sim-2"
kill "${SIM_PIDS[2]}"
for _ in $(seq 50); do
    curl -s "http://$ADMIN/admin/status" | grep -q '"eligible":false' && break
    sleep 0.2
done

echo "== render 2: sim-2 down or ejected, the others up"
browser --dump-dom >"$WORK/dom2.html"
gone=$(( $(rows "$WORK/dom2.html" down) + $(rows "$WORK/dom2.html" ejected) ))
up=$(rows "$WORK/dom2.html" up)
echo "   rows up: $up, down or ejected: $gone"
grep -qE 'data-replica="sim-2" data-state="(down|ejected)"' "$WORK/dom2.html" \
    || { echo "FAIL: sim-2 not shown down"; exit 1; }
[ "$up" = 2 ] || { echo "FAIL: expected 2 replicas up"; exit 1; }

mkdir -p "$(dirname "$SHOT")"
browser --screenshot="$SHOT" --window-size=1200,800 >/dev/null
[ -s "$SHOT" ] || { echo "FAIL: no screenshot"; exit 1; }
echo "   screenshot: $SHOT"
echo "status page check passed"
