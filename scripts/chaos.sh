#!/usr/bin/env bash
# Chaos run with real processes, on 127.0.0.1 only, bounded to about 30 s:
# four `llmlb replica-sim` replicas (one process each) behind `llmlb serve`, steady
# streaming load from `llmlb bench`; replica r0 is killed with SIGKILL,
# replica r1 is frozen with SIGSTOP (it keeps its socket: connections are
# accepted by the kernel and never answered, i.e. it hangs), then r0 is
# started again on its port and r1 resumed (SIGCONT).
#
# Prints: when each replica was ejected and readmitted (from
# GET /admin/replicas), and how every request ended (from the bench report):
# ok, HTTP error, stream ended by llmlb's SSE error event, stream cut otherwise,
# transport error, timeout. Exits 1 if any stream was cut silently or any
# request got no answer at all.
#
# Usage: scripts/chaos.sh            (uses target/debug/llmlb, builds it if missing)
#        LLMLB_BIN=path/to/llmlb scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${LLMLB_BIN:-target/debug/llmlb}
[ -x "$BIN" ] || cargo build --quiet
for tool in curl jq; do
    command -v "$tool" >/dev/null || { echo "chaos.sh needs $tool" >&2; exit 2; }
done

WORK=$(mktemp -d)
declare -A PID=()
cleanup() {
    for p in "${PID[@]}"; do
        kill -CONT "$p" 2>/dev/null || true
        kill -KILL "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

BASE=$((20000 + RANDOM % 20000))
LB=$((BASE + 10))
ADMIN=$((BASE + 11))
T0=$(date +%s.%N)
now() { echo "$(date +%s.%N) - $T0" | bc | xargs printf '%6.2fs'; }

start_sim() {
    "$BIN" replica-sim --port $((BASE + $1)) --replicas 1 --profile fast --model llama \
        >>"$WORK/sim$1.log" 2>&1 &
    PID[sim$1]=$!
}

wait_http() { # url, seconds
    local deadline=$(($(date +%s) + $2))
    until curl -fsS -o /dev/null "$1" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "timeout waiting for $1" >&2; exit 2; }
        sleep 0.05
    done
}

for i in 0 1 2 3; do start_sim "$i"; done
for i in 0 1 2 3; do wait_http "http://127.0.0.1:$((BASE + i))/health" 20; done

{
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\ndrain_delay = "0s"\n' "$LB" "$ADMIN"
    printf '[[pools]]\nname = "llama"\nmodels = ["llama"]\nbalancer = "least_connections"\nretries = 3\n'
    printf '[pools.timeouts]\nconnect = "200ms"\nfirst_byte = "2s"\nidle = "1s"\n'
    printf '[pools.health]\nenabled = true\ninterval = "200ms"\ntimeout = "200ms"\nfall = 2\nrise = 2\n'
    printf '[pools.outlier]\nconsecutive_failures = 2\ncooldown = "500ms"\nmax_ejection_time = "2s"\n'
    for i in 0 1 2 3; do
        printf '[[pools.replicas]]\nname = "r%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((BASE + i))
    done
} >"$WORK/llmlb.toml"
"$BIN" serve --config "$WORK/llmlb.toml" >"$WORK/llmlb.log" 2>&1 &
PID[llmlb]=$!
wait_http "http://127.0.0.1:$ADMIN/readyz" 20
echo "$(now) fleet up: replicas on ports $BASE..$((BASE + 3)), llmlb on $LB (admin $ADMIN)"

# Eligibility transitions, polled every 50 ms.
(
    declare -A last=()
    while true; do
        states=$(curl -fsS "http://127.0.0.1:$ADMIN/admin/replicas" 2>/dev/null |
            jq -r '.pools[0].replicas[] | "\(.name)=\(.eligible)"') || true
        for s in $states; do
            name=${s%%=*}
            if [ "${last[$name]:-true}" != "${s#*=}" ]; then
                echo "$(now) $name eligible=${s#*=}"
                last[$name]=${s#*=}
            fi
        done
        sleep 0.05
    done
) &
PID[watch]=$!

"$BIN" bench --target "http://127.0.0.1:$LB" --model llama --concurrency 16 \
    --duration 16s --input-len 64 --output-len 48 --timeout 20s --no-progress \
    --out "$WORK/bench.json" >"$WORK/bench.log" 2>&1 &
PID[bench]=$!

sleep 3
echo "$(now) SIGKILL r0"
kill -KILL "${PID[sim0]}"
sleep 1
echo "$(now) SIGSTOP r1 (hangs)"
kill -STOP "${PID[sim1]}"
sleep 5
echo "$(now) restart r0, SIGCONT r1"
start_sim 0
kill -CONT "${PID[sim1]}"
wait "${PID[bench]}" || true
sleep 0.5
kill "${PID[watch]}" 2>/dev/null || true

# The messages of the SSE error events llmlb writes when a replica's stream
# breaks or stalls (src/forwarding/body.rs); any other stream failure is a cut.
SSE_ERROR='^replica (stream broke|sent nothing)'
echo
echo "request outcomes:"
jq -r '
  [.requests[] | .outcome] as $o
  | {
      ok: ($o | map(select(.kind == "ok")) | length),
      http_error: ($o | map(select(.kind == "http")) | length),
      sse_error_event: ($o | map(select(.kind == "stream" and (.message | test($sse)))) | length),
      stream_cut: ($o | map(select(.kind == "stream" and (.message | test($sse) | not))) | length),
      transport: ($o | map(select(.kind == "transport")) | length),
      timeout: ($o | map(select(.kind == "timeout")) | length)
    }
  | to_entries[] | "  \(.key): \(.value)"' --arg sse "$SSE_ERROR" "$WORK/bench.json"
echo "http statuses:"
jq -r '[.requests[] | .outcome | select(.kind == "http") | .status] | group_by(.) | map("  \(.[0]): \(length)") | .[]' "$WORK/bench.json"
bad=$(jq --arg sse "$SSE_ERROR" '[.requests[] | .outcome | select(.kind == "transport" or .kind == "timeout" or (.kind == "stream" and (.message | test($sse) | not)))] | length' "$WORK/bench.json")
if [ "$bad" -ne 0 ]; then
    echo "FAIL: $bad request(s) ended without a complete answer or a clean error"
    exit 1
fi
echo "PASS: every request ended with a complete stream or a clean error"
