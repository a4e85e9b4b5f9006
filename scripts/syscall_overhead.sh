#!/usr/bin/env bash
# System calls and context switches per proxied request, llmlb (its
# default access log on) beside the floor (`examples/hyper_floor`, pooled)
# and nginx, under the same wrk load as scripts/wrk_overhead.sh: the kernel
# takes a large share of a proxy's CPU on loopback, and a call more per
# request shows here where instruction counts do not.
#
# Each proxy gets `perf trace -s` (every system call of every thread, by
# name) for one wrk run, then `perf stat` (context switches, system calls)
# for another; the script prints per request: each call's count, the
# total, and the context switches.
#
# Usage: scripts/syscall_overhead.sh
# Env:   SC_SECONDS  seconds per run (default 4)
#        SC_CONNS    wrk connections (default 32)
#        SC_ANSWER   json or sse (default json)
#        SC_OUT      where logs go (default target/syscall-overhead)
#        SC_EXTRA    llmlb binaries to measure beside this tree's
# Needs nginx, wrk and perf (Debian packages: nginx, wrk, linux-perf) and
# permission to trace (root, or kernel.perf_event_paranoid <= 1).

set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECS="${SC_SECONDS:-4}"
CONNS="${SC_CONNS:-32}"
ANSWER="${SC_ANSWER:-json}"
OUT="${SC_OUT:-$ROOT/target/syscall-overhead}"
LLMLB="${CARGO_TARGET_DIR:-$ROOT/target}/release/llmlb"
FLOOR="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/hyper_floor"

# shellcheck source=scripts/proxy_helpers.sh
source "$ROOT/scripts/proxy_helpers.sh"
require_tools "$LLMLB" wrk perf
[ -x "$FLOOR" ] || { echo "build the floor first: cargo build --release --example hyper_floor" >&2; exit 1; }
TEMP="$OUT/tmp"
mkdir -p "$TEMP"

BACKEND_PORT=$(free_port)
nginx_backend_conf "$BACKEND_PORT" >"$OUT/backend.conf"
start backend "$NGINX" -p "$OUT" -c "$OUT/backend.conf"
BACKEND="http://127.0.0.1:$BACKEND_PORT"

declare -A URL PG
RUNS=()
proxy() { # NAME BINARY
    local port
    port=$(free_port)
    llmlb_conf "$port" "$BACKEND" >"$OUT/$1.toml"
    start "$1" "$2" serve --config "$OUT/$1.toml"
    PG[$1]=$PGID
    URL[$1]="http://127.0.0.1:$port"
    RUNS+=("$1")
}
proxy llmlb "$LLMLB"
for extra in ${SC_EXTRA:-}; do proxy "$(basename "$extra")" "$extra"; done
FLOOR_MODE=pooled proxy floor "$FLOOR"
NG_PORT=$(free_port)
nginx_proxy_conf "$NG_PORT" "$BACKEND_PORT" | sed 's/worker_processes auto;/worker_processes 1;/' >"$OUT/nginx-proxy.conf"
start nginx-proxy "$NGINX" -p "$OUT" -c "$OUT/nginx-proxy.conf"
PG[nginx]=$PGID
URL[nginx]="http://127.0.0.1:$NG_PORT"
RUNS+=(nginx)

stream=true extra=""
if [ "$ANSWER" = json ]; then stream=false; extra='wrk.headers["X-Answer"] = "json"'; fi
cat >"$OUT/load.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$extra
wrk.body = '{"model":"instant","prompt":"How far is the moon?","max_tokens":16,"stream":$stream}'
LUA
for run in "${RUNS[@]}"; do
    for i in $(seq 100); do
        curl -sf -m 1 -o /dev/null -H 'content-type: application/json' -H 'x-answer: json' \
            -d '{"model":"instant","prompt":"hi","max_tokens":16}' "${URL[$run]}/v1/completions" && break
        sleep 0.1
    done
done

# pids PGID: the processes of a group, comma-separated (nginx: its workers).
pids() {
    ps -o pid= -g "$1" | tr -d ' ' | paste -sd, -
}
requests() { awk '/requests in/ {print $1}' "$1"; }

echo "date: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), $ANSWER answers, $CONNS connections, ${SECS} s"
for run in "${RUNS[@]}"; do
    p=$(pids "${PG[$run]}")
    perf trace -s -p "$p" -o "$OUT/$run.trace" &
    tracer=$!
    sleep 1
    wrk -t1 -c"$CONNS" -d"${SECS}s" -s "$OUT/load.lua" "${URL[$run]}/v1/completions" >"$OUT/$run-trace.wrk" 2>&1
    kill -INT "$tracer"; wait "$tracer" 2>/dev/null
    perf stat -x, -e raw_syscalls:sys_enter,context-switches,cpu-migrations -p "$p" -o "$OUT/$run.stat" &
    tracer=$!
    sleep 1
    wrk -t1 -c"$CONNS" -d"${SECS}s" -s "$OUT/load.lua" "${URL[$run]}/v1/completions" >"$OUT/$run-stat.wrk" 2>&1
    kill -INT "$tracer"; wait "$tracer" 2>/dev/null
done

python3 - "$OUT" "${RUNS[@]}" <<'PY'
import collections, re, sys
out, runs = sys.argv[1], sys.argv[2:]
def reqs(name):
    return int(re.search(r"(\d+) requests in", open(f"{out}/{name}.wrk").read()).group(1))
calls, stats = {}, {}
for run in runs:
    n = reqs(f"{run}-trace")
    c = collections.Counter()
    for line in open(f"{out}/{run}.trace"):
        m = re.match(r"\s+(\w+)\s+(\d+)\s+\d+\s+[\d.]+", line)
        if m:
            c[m.group(1)] += int(m.group(2))
    calls[run] = {k: v / n for k, v in c.items()}
    n = reqs(f"{run}-stat")
    s = {}
    for line in open(f"{out}/{run}.stat"):
        f = line.strip().split(",")
        if len(f) > 2 and f[0].replace(".", "").isdigit():
            s[f[2]] = float(f[0]) / n
    stats[run] = s
names = sorted({k for c in calls.values() for k, v in c.items() if v >= 0.05},
               key=lambda k: -max(c.get(k, 0) for c in calls.values()))
print("| per request | " + " | ".join(runs) + " |")
print("|---|" + "---|" * len(runs))
for k in names:
    print(f"| {k} | " + " | ".join(f"{calls[r].get(k, 0):.2f}" for r in runs) + " |")
print("| all system calls (perf trace) | " + " | ".join(f"{sum(calls[r].values()):.2f}" for r in runs) + " |")
for ev in ("raw_syscalls:sys_enter", "context-switches", "cpu-migrations"):
    print(f"| {ev} (perf stat) | " + " | ".join(f"{stats[r].get(ev, 0):.2f}" for r in runs) + " |")
PY
