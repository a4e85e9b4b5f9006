#!/usr/bin/env bash
# Proxy overhead with JSON and SSE answers, under wrk: the same POST
# /v1/completions straight to an instant nginx backend and through llmlb
# (this tree's release build, with and without its access log), the floor
# under it (`examples/hyper_floor.rs`, pooled client), optionally an earlier
# llmlb build, and nginx as a proxy, all on 127.0.0.1 in one run.
# Reports requests/s, p50 latency and each proxy's CPU time per request
# (user+sys of its process group from /proc, before and after each run),
# and at the end each proxy's median CPU per request over the rounds and
# its ratio to the floor's (per streamed event: per SSE answer divided by
# its 18 events, 16 chunks, the usage chunk and [DONE]), then the median of
# each round's ratio to the floor's run in that round. With WRK_STREAM=1
# it also measures the cost of one more streamed event: llmlb and the floor
# in front of a streaming `llmlb replica-sim --profile fast` (one event a
# frame), answers of 16 and 64 tokens, and the difference in CPU per
# answer divided by the difference in events.
#
# Usage: scripts/wrk_overhead.sh
# Env:   WRK_SECONDS  seconds per run (default 8)
#        WRK_ROUNDS   rounds, the order reversed every other round (default 2)
#        WRK_CONNS    concurrencies (default "32 1")
#        WRK_BASE     another llmlb binary, run as `llmlb-base`
#        WRK_FLOOR    the floor binary (default target/release/examples/hyper_floor,
#                     skipped when absent: `cargo build --release --example hyper_floor`)
#        WRK_OUT      where logs and the summary go (default target/wrk-overhead)
#        WRK_STREAM   1: also the marginal cost per streamed event (above)
#        WRK_PIN      1: the proxies on CPU 1, wrk and the backends on CPU 0
#                     (taskset), so the proxy measured has a core to itself
#        TOKIO_WORKER_THREADS  read by tokio in both llmlb and the floor: with
#                     WRK_PIN=1, `1` gives each proxy one worker on its core
#                     (two workers sharing one core wake each other), the
#                     setting whose rounds agree most closely
#
# The backend is nginx with one worker: a request with `x-answer: json` gets
# one JSON completion (249 bytes), any other the 16-chunk SSE stream of
# scripts/peers.sh (usage chunk and [DONE] included). Needs nginx and wrk
# (Debian packages). Every process started runs in its own process group
# and is stopped on exit; every run is bounded by wrk's -d.

set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECS="${WRK_SECONDS:-8}"
ROUNDS="${WRK_ROUNDS:-2}"
CONNS="${WRK_CONNS:-32 1}"
BASE="${WRK_BASE:-}"
OUT="${WRK_OUT:-$ROOT/target/wrk-overhead}"
LLMLB="${CARGO_TARGET_DIR:-$ROOT/target}/release/llmlb"
FLOOR="${WRK_FLOOR:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/hyper_floor}"
HZ="$(getconf CLK_TCK)"

# shellcheck source=scripts/proxy_helpers.sh
source "$ROOT/scripts/proxy_helpers.sh"
require_tools "$LLMLB" wrk

TEMP="$OUT/tmp"
mkdir -p "$TEMP"
rm -f "$OUT"/*.txt "$OUT"/*.log "$OUT"/*.conf "$OUT"/*.toml "$OUT"/*.lua
wait_ok() { # URL HEADER...: until a completion request through URL succeeds (10 s)
    local url="$1" i
    shift
    for i in $(seq 100); do
        curl -sf -m 1 -o /dev/null "$@" -H 'content-type: application/json' \
            -d '{"model":"instant","prompt":"hi","max_tokens":16,"stream":true}' "$url/v1/completions" && return 0
        sleep 0.1
    done
    return 1
}

BACKEND_PORT=$(free_port)
nginx_backend_conf "$BACKEND_PORT" >"$OUT/backend.conf"
PROXY_CPU=() LOAD_CPU=()
if [ "${WRK_PIN:-}" = 1 ]; then PROXY_CPU=(taskset -c 1) LOAD_CPU=(taskset -c 0); fi
start backend "${LOAD_CPU[@]}" "$NGINX" -p "$OUT" -c "$OUT/backend.conf"
BACKEND="http://127.0.0.1:$BACKEND_PORT"

declare -A URL PG
URL[direct]="$BACKEND"
llmlb() { # NAME BINARY [EXTRA TOML [BACKEND]]
    local port
    port=$(free_port)
    llmlb_conf "$port" "${4:-$BACKEND}" "${3:-}" >"$OUT/$1.toml"
    start "$1" "${PROXY_CPU[@]}" "$2" serve --config "$OUT/$1.toml"
    PG[$1]=$PGID
    URL[$1]="http://127.0.0.1:$port"
}
RUNS=(direct llmlb llmlb-nolog)
llmlb llmlb "$LLMLB"
llmlb llmlb-nolog "$LLMLB" $'[telemetry.access_log]\nenabled = false'
if [ -n "$BASE" ]; then
    llmlb llmlb-base "$BASE"
    RUNS+=(llmlb-base)
fi
if [ -x "$FLOOR" ]; then
    # It reads its listen address and replica from an llmlb config.
    export FLOOR_MODE=pooled
    llmlb floor "$FLOOR"
    RUNS+=(floor)
else
    echo "no floor binary at $FLOOR (cargo build --release --example hyper_floor): not measured" >&2
fi
NG_PORT=$(free_port)
nginx_proxy_conf "$NG_PORT" "$BACKEND_PORT" >"$OUT/nginx-proxy.conf"
start nginx-proxy "${PROXY_CPU[@]}" "$NGINX" -p "$OUT" -c "$OUT/nginx-proxy.conf"
PG[nginx]=$PGID
URL[nginx]="http://127.0.0.1:$NG_PORT"
RUNS+=(nginx)
for run in "${RUNS[@]}"; do
    wait_ok "${URL[$run]}" || { echo "$run: no successful request (see $OUT/$run.log)" >&2; exit 1; }
done

for answer in json sse; do
    stream=true
    extra=""
    if [ "$answer" = json ]; then stream=false; extra='wrk.headers["X-Answer"] = "json"'; fi
    cat >"$OUT/$answer.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$extra
wrk.body = '{"model":"instant","prompt":"How far is the moon?","max_tokens":16,"stream":$stream}'
EOF
done

{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "nginx: $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')"
    echo "wrk: $(wrk -v 2>&1 | head -1)"
    echo "llmlb: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)${BASE:+, base: $BASE}"
    echo "pinned: ${WRK_PIN:-0}"
} | tee "$OUT/machine.txt" >&2

# measure NAME RUN LUA CONNS: one wrk run of LUA against RUN, its output in
# NAME.txt and the CPU ticks RUN's process group spent in NAME.cpu (0 for
# the backend alone).
measure() {
    local name="$1" run="$2" before=0 after=0
    echo "   $name" >&2
    [ "$run" != direct ] && before=$(cpu_ticks "${PG[$run]}")
    "${LOAD_CPU[@]}" wrk -t1 -c"$4" -d"${SECS}s" --latency -s "$3" \
        "${URL[$run]}/v1/completions" >"$OUT/$name.txt" 2>&1
    [ "$run" != direct ] && after=$(cpu_ticks "${PG[$run]}")
    echo "$((after - before))" >"$OUT/$name.cpu"
}

ORDER=("${RUNS[@]}")
for r in $(seq "$ROUNDS"); do
    for answer in json sse; do
        for c in $CONNS; do
            for run in "${ORDER[@]}"; do
                measure "$run-$answer-c$c-r$r" "$run" "$OUT/$answer.lua" "$c"
            done
        done
    done
    mapfile -t ORDER < <(printf '%s\n' "${ORDER[@]}" | tac)
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

python3 - "$OUT" "$HZ" "$ROUNDS" "$CONNS" "${RUNS[@]}" <<'EOF' | tee "$OUT/summary.md"
import re, sys
from statistics import median
out, hz, rounds, conns, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5:]

def ms(text):
    v, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

def read(name):
    t = open(f"{out}/{name}.txt").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    total = int(re.search(r"(\d+) requests in", t).group(1))
    p50 = ms(re.search(r"^\s+50%\s+(\S+)", t, re.M).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    errs = re.search(r"Socket errors: (.*)", t)
    return rps, total, p50, int(bad.group(1)) if bad else 0, errs.group(1) if errs else ""

print(open(f"{out}/machine.txt").read())
for r in range(1, rounds + 1):
    for answer in ("json", "sse"):
        for c in conns:
            print(f"\nround {r}, {answer} answers, concurrency {c}")
            print("| path | requests/s | p50 (ms) | added p50 (ms) | proxy CPU per request (µs) | non-2xx | socket errors |")
            print("|---|---|---|---|---|---|---|")
            d = read(f"direct-{answer}-c{c}-r{r}")
            for run in runs:
                rps, total, p50, bad, errs = read(f"{run}-{answer}-c{c}-r{r}")
                add = cpu = "-"
                if run != "direct":
                    add = f"{p50 - d[2]:+.3f}"
                    ticks = int(open(f"{out}/{run}-{answer}-c{c}-r{r}.cpu").read())
                    cpu = f"{ticks / hz / total * 1e6:.1f}" if total else "-"
                print(f"| {run} | {rps:,.0f} | {p50:.3f} | {add} | {cpu} | {bad} | {errs} |")

# Median over the rounds of CPU µs per request, and the ratio to the floor.
EVENTS = 18
def cpu_us(run, answer, c, r):
    total = read(f"{run}-{answer}-c{c}-r{r}")[1]
    ticks = int(open(f"{out}/{run}-{answer}-c{c}-r{r}.cpu").read())
    return ticks / hz / total * 1e6 if total else float("nan")
for c in conns:
    print(f"\nmedian of {rounds} rounds, concurrency {c}: proxy CPU in µs (ratio to the floor)")
    print("| path | per JSON request | per SSE answer | per streamed event |")
    print("|---|---|---|---|")
    med = {(run, a): median([cpu_us(run, a, c, r) for r in range(1, rounds + 1)])
           for run in runs if run != "direct" for a in ("json", "sse")}
    for run in runs:
        if run == "direct":
            continue
        cells = []
        for a, div in (("json", 1), ("sse", 1), ("sse", EVENTS)):
            v = med[(run, a)] / div
            ratio = f" ({med[(run, a)] / med[('floor', a)]:.2f}x)" if ("floor", a) in med else ""
            cells.append(f"{v:.1f}{ratio}" if div == 1 else f"{v:.2f}{ratio}")
        print(f"| {run} | " + " | ".join(cells) + " |")
    # Each round's ratio to the floor's run beside it: on a shared machine
    # a slow stretch moves both, so the per-round ratio drifts less than
    # the medians' ratio.
    if any(run == "floor" for run in runs):
        print(f"\nper-round ratio to the floor, concurrency {c}: median (lowest-highest)")
        for run in runs:
            if run in ("direct", "floor"):
                continue
            for a in ("json", "sse"):
                rs = sorted(cpu_us(run, a, c, r) / cpu_us("floor", a, c, r) for r in range(1, rounds + 1))
                print(f"- {run}, {a}: {median(rs):.2f}x ({rs[0]:.2f}-{rs[-1]:.2f})")
EOF

[ "${WRK_STREAM:-0}" = 1 ] || exit 0
[ -x "$FLOOR" ] || { echo "no floor binary: the per-event run needs it" >&2; exit 1; }

# One more streamed event: the same proxies in front of a streaming replica
# simulator (one event a frame), answers of 16 and 64 tokens.
SIM_PORT=$(free_port)
start sim "${LOAD_CPU[@]}" "$LLMLB" replica-sim --profile fast --model instant --port "$SIM_PORT"
SIM="http://127.0.0.1:$SIM_PORT"
llmlb llmlb-stream "$LLMLB" "" "$SIM"
llmlb floor-stream "$FLOOR" "" "$SIM"
STREAM_RUNS=(llmlb-stream floor-stream)
if [ -n "$BASE" ]; then
    llmlb llmlb-base-stream "$BASE" "" "$SIM"
    STREAM_RUNS+=(llmlb-base-stream)
fi
for tokens in 16 64; do
    body="{\"model\":\"instant\",\"prompt\":\"How far is the moon?\",\"max_tokens\":$tokens,\"min_tokens\":$tokens,\"ignore_eos\":true,\"stream\":true}"
    printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n' \
        "'$body'" >"$OUT/stream-$tokens.lua"
    for run in "${STREAM_RUNS[@]}"; do
        wait_ok "${URL[$run]}" || { echo "$run: no successful request (see $OUT/$run.log)" >&2; exit 1; }
        # Events in one answer, as the client reads them.
        curl -sf -m 10 -H 'content-type: application/json' -d "$body" "${URL[$run]}/v1/completions" |
            grep -c '^data:' >"$OUT/$run-events-$tokens.txt"
    done
done
ORDER=("${STREAM_RUNS[@]}")
for r in $(seq "$ROUNDS"); do
    for tokens in 16 64; do
        for run in "${ORDER[@]}"; do
            measure "$run-t$tokens-r$r" "$run" "$OUT/stream-$tokens.lua" 32
        done
    done
    mapfile -t ORDER < <(printf '%s\n' "${ORDER[@]}" | tac)
done

python3 - "$OUT" "$HZ" "$ROUNDS" "${STREAM_RUNS[@]}" <<'EOF' | tee -a "$OUT/summary.md"
import re, sys
from statistics import median
out, hz, rounds, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]

def per_answer(name):
    t = open(f"{out}/{name}.txt").read()
    total = int(re.search(r"(\d+) requests in", t).group(1))
    if re.search(r"Non-2xx or 3xx responses: (\d+)", t):
        sys.exit(f"{name}: non-2xx answers")
    ticks = int(open(f"{out}/{name}.cpu").read())
    return ticks / hz / total * 1e6, total

def events(run, tokens):
    return int(open(f"{out}/{run}-events-{tokens}.txt").read())

print("\nper streamed event, concurrency 32 (replica-sim --profile fast, one event a frame):")
print("CPU per answer of 16 and 64 tokens, and (64 - 16) / the difference in events, µs")
print("| round | " + " | ".join(f"{r} 16 / 64 / per event" for r in runs) + " | ratio to the floor |")
print("|---|" + "---|" * (len(runs) + 1))
marginal = {r: [] for r in runs}
for i in range(1, rounds + 1):
    cells = []
    for run in runs:
        short, n16 = per_answer(f"{run}-t16-r{i}")
        long, n64 = per_answer(f"{run}-t64-r{i}")
        m = (long - short) / (events(run, 64) - events(run, 16))
        marginal[run].append(m)
        cells.append(f"{short:.1f} / {long:.1f} / {m:.2f} ({n16}, {n64} answers)")
    ratio = marginal["llmlb-stream"][-1] / marginal["floor-stream"][-1]
    print(f"| {i} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
med = {r: median(v) for r, v in marginal.items()}
print("\nmedian per streamed event: " + ", ".join(
    f"{r} {m:.2f} µs ({m / med['floor-stream']:.2f}x)" for r, m in med.items()))
EOF
