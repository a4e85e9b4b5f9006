#!/usr/bin/env bash
# Instructions per proxied request (valgrind's callgrind), llmlb and nginx
# side by side: counts do not depend on the machine's load, so two builds
# or two proxies compare on a shared, noisy machine.
#
# Each measurement runs the proxy under callgrind twice, with N1 and N2
# requests sent one after another on one kept-alive connection, and prints
# (instructions at N2 - instructions at N1) / (N2 - N1): start-up and
# shutdown cancel out. Background loops (health checks, scrapes) still
# count for as long as a run lasts, so repeat runs differ by about 1.5 k.
#
# Usage: scripts/callgrind_overhead.sh [BINARY...]
#   BINARY: llmlb binaries to measure (default: this tree's release build);
#   nginx is measured too when it is installed. A BINARY may also be a link
#   to `examples/hyper_floor` named `...-answer`, `...-pooled` or
#   `...-inline` (the bare proxy on llmlb's HTTP stack; `answer` for the
#   json and sse cases only, it sends nothing upstream).
#   Build llmlb on its own (`cargo build --release --bin llmlb`) and the
#   floor apart (`--example hyper_floor`): built together, llmlb gets the
#   example's dev-dependency features, tokio's `test-util` among them, whose
#   clock reads take a lock (0.5-2.8 k more instructions a request).
# Env:   CG_CASES  "json sse stream" (default all three):
#          json    the instant nginx backend's JSON answer (249 bytes)
#          sse     its 16-event SSE answer, which arrives in one read
#          stream  a streaming `llmlb replica-sim --profile fast` replica, 16 and
#                  64 tokens per request: per request and per event
#        CG_N1, CG_N2  request counts (default 200 and 1200; 100 and 400
#                  for `stream`)
#        CG_OUT    where logs and callgrind files go (default target/callgrind)
#        CG_ACCESS_LOG  `on`: llmlb writes its default access log (to the
#                  run's log file); default off
#        SSE_USAGE_NULL  1: every content event of the sse case carries
#                  `"usage":null`, as servers that follow OpenAI's API send
#                  it (vLLM leaves the key out)
#        CG_VALGRIND_ARGS  more callgrind options for the BINARYs (not nginx), e.g.
#                  "--cache-sim=yes --branch-sim=yes": the cache and branch
#                  misses then sit beside the instructions in the .callgrind
#                  files (`callgrind_annotate --show=I1mr`)
#
# llmlb runs with one pool of one replica, `least_connections`, and its
# access log off unless CG_ACCESS_LOG=on (nginx runs with `access_log off`).
# Needs valgrind, nginx (Debian packages) and python3. Every process started runs in its own
# process group and is stopped on exit.

set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${CG_OUT:-$ROOT/target/callgrind}"
CASES="${CG_CASES:-json sse stream}"
LLMLB="${CARGO_TARGET_DIR:-$ROOT/target}/release/llmlb"
BINARIES=("$@")
[ ${#BINARIES[@]} -eq 0 ] && BINARIES=("$LLMLB")

# shellcheck source=scripts/proxy_helpers.sh
source "$ROOT/scripts/proxy_helpers.sh"
require_tools "$LLMLB" valgrind
TEMP="$OUT/tmp"
mkdir -p "$TEMP"

wait_up() { # PORT: until the proxy answers anything (60 s: valgrind starts slowly)
    local i
    for i in $(seq 300); do
        curl -s -m 2 -o /dev/null "http://127.0.0.1:$1/v1/models" && return 0
        sleep 0.2
    done
    return 1
}

# load PORT N MODE [TOKENS]: N requests on one kept-alive connection.
load() {
    python3 - "$@" <<'PY'
import http.client, json, sys
port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 16
body = {"model": "instant", "prompt": "How far is the moon?", "max_tokens": tokens,
        "stream": mode != "json"}
if mode == "stream":
    body.update(min_tokens=tokens, ignore_eos=True)
headers = {"content-type": "application/json"}
if mode == "json":
    headers["x-answer"] = "json"
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
ok = events = 0
for _ in range(n):
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    data = resp.read()
    ok += resp.status == 200
    events += data.count(b"data:")
if ok != n:
    sys.exit(f"{n - ok} of {n} requests failed")
print(events / n)
PY
}

# count PROXY BACKEND_URL N MODE [TOKENS]: total instructions of one run.
# PROXY is an llmlb binary or "nginx".
count() {
    local proxy="$1" backend="$2" n="$3" mode="$4" tokens="${5:-16}" port name cg
    port=$(free_port)
    name="$(basename "$proxy")-$mode-$tokens-$n"
    cg="$OUT/$name.callgrind"
    if [ "$proxy" = nginx ]; then
        nginx_proxy_conf "$port" "${backend##*:}" |
            sed 's/worker_processes auto;/worker_processes 1;\nmaster_process off;/' >"$OUT/$name.conf"
        start "$name" valgrind --tool=callgrind --callgrind-out-file="$cg" "$NGINX" -p "$OUT" -c "$OUT/$name.conf"
    else
        local extra=$'drain_delay = "0s"'
        [ "${CG_ACCESS_LOG:-off}" = on ] || extra+=$'\n[telemetry.access_log]\nenabled = false'
        llmlb_conf "$port" "$backend" "$extra" >"$OUT/$name.toml"
        start "$name" valgrind --tool=callgrind ${CG_VALGRIND_ARGS:-} --callgrind-out-file="$cg" "$proxy" serve --config "$OUT/$name.toml"
    fi
    local pg=$PGID
    wait_up "$port" || { echo "$name: proxy did not start (see $OUT/$name.log)" >&2; exit 1; }
    load "$port" "$n" "$mode" "$tokens" >"$OUT/$name.events" || exit 1
    # callgrind writes its counts at exit: wait for it (60 s) rather than kill.
    kill -TERM -- "-$pg" 2>/dev/null
    local i
    for i in $(seq 300); do kill -0 -- "-$pg" 2>/dev/null || break; sleep 0.2; done
    stop "$pg"
    awk '/^totals:/ {print $2}' "$cg" | grep . || { echo "$name: no callgrind totals in $cg" >&2; exit 1; }
}

# per_request PROXY BACKEND MODE N1 N2 [TOKENS]: instructions per request.
per_request() {
    local a b
    a=$(count "$1" "$2" "$4" "$3" "${6:-16}")
    b=$(count "$1" "$2" "$5" "$3" "${6:-16}")
    python3 -c "print(($b - $a) / ($5 - $4))"
}

PROXIES=("${BINARIES[@]}" nginx)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "| proxy | case | instructions per request | per event |"
echo "|---|---|---|---|"
for case in $CASES; do
    if [ "$case" = stream ]; then
        sim_port=$(free_port)
        start sim "$LLMLB" replica-sim --profile fast --model instant --port "$sim_port"
        SIM_PG=$PGID
        backend="http://127.0.0.1:$sim_port"
        n1="${CG_N1:-100}" n2="${CG_N2:-400}"
        for p in "${PROXIES[@]}"; do
            short=$(per_request "$p" "$backend" stream "$n1" "$n2" 16)
            long=$(per_request "$p" "$backend" stream "$n1" "$n2" 64)
            ev_short=$(cat "$OUT/$(basename "$p")-stream-16-$n2.events")
            ev_long=$(cat "$OUT/$(basename "$p")-stream-64-$n2.events")
            per_event=$(python3 -c "print(f'{($long - $short) / ($ev_long - $ev_short) / 1000:.1f} k')")
            printf '| %s | stream, 16 tokens | %.1f k | %s |\n' "$(basename "$p")" "$(python3 -c "print($short/1000)")" "$per_event"
            printf '| %s | stream, 64 tokens | %.1f k | %s |\n' "$(basename "$p")" "$(python3 -c "print($long/1000)")" "$per_event"
        done
        stop "$SIM_PG"
    else
        backend_port=$(free_port)
        nginx_backend_conf "$backend_port" >"$OUT/backend.conf"
        start backend "$NGINX" -p "$OUT" -c "$OUT/backend.conf"
        BACKEND_PG=$PGID
        n1="${CG_N1:-200}" n2="${CG_N2:-1200}"
        for p in "${PROXIES[@]}"; do
            v=$(per_request "$p" "http://127.0.0.1:$backend_port" "$case" "$n1" "$n2")
            printf '| %s | %s | %.1f k | - |\n' "$(basename "$p")" "$case" "$(python3 -c "print($v/1000)")"
        done
        stop "$BACKEND_PG"
    fi
done
