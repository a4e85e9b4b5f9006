#!/usr/bin/env bash
# Side-by-side comparison of llmlb with other LLM-serving proxies, all on
# 127.0.0.1, in one run:
#
#   1. Proxy overhead: the same closed-loop load (`llmlb bench`) straight to an
#      instant backend (nginx answering a canned SSE stream) and through
#      llmlb, nginx, the SGLang router and the vLLM router. Reports
#      requests/s, added p50/p99 latency and each proxy's CPU time per request.
#   2. Routing quality: a fresh simulated fleet (`llmlb replica-sim`, 4 replicas,
#      small KV cache) per router and workload (shared-prefix, then the
#      conversation trace), through llmlb's balancers and the SGLang router's
#      cache_aware policy. Reports TTFT p50/p99, throughput and the replicas'
#      own prefix-cache hit rate.
#
# Usage: scripts/peers.sh            (about 6 minutes on 2 cores)
# Env:   PEERS_SECONDS   seconds per overhead measurement (default 10)
#        PEERS_ROUNDS    overhead rounds, the order reversed every other round (default 2)
#        PEERS_CACHE     where the Python venv lives (default ~/.cache/llmlb-peers)
#        PEERS_OUT       where reports and logs go (default target/peers)
#        PEERS_TRACE     trace file (default ../shared/traces/conversation_trace.jsonl)
#        LLMLB_PREFIX_BALANCER  a prefix-aware llmlb balancer to add to part 2
#        PEERS_PROXIES   which proxies part 1 runs (default "llmlb nginx sglang vllm-router";
#                        the Python routers are installed only when listed)
#        PEERS_PART1_ONLY  set to 1 to stop after part 1 (proxy overhead)
#        PEERS_LLMLB_BASE  another llmlb binary (an earlier build, say) run in part 1
#                        as `llmlb-base` beside this tree's, same config, same rounds
#
# Part 1 also runs `llmlb-nolog`: llmlb with its access log off, as the
# nginx proxy runs (`access_log off`); `llmlb` keeps llmlb's defaults.
#
# Installs what it needs: Debian's nginx (apt-get), sglang-router and
# vllm-router (pip, in a venv under PEERS_CACHE). A peer that fails to
# install or start is reported as such and skipped. Every process this
# script starts runs in its own process group and is stopped on exit.

set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECS="${PEERS_SECONDS:-10}"
ROUNDS="${PEERS_ROUNDS:-2}"
CACHE="${PEERS_CACHE:-$HOME/.cache/llmlb-peers}"
OUT="${PEERS_OUT:-$ROOT/target/peers}"
TRACE="${PEERS_TRACE:-$ROOT/../shared/traces/conversation_trace.jsonl}"
PREFIX_BALANCER="${LLMLB_PREFIX_BALANCER:-}"
WANTED=" ${PEERS_PROXIES:-llmlb nginx sglang vllm-router} "
PART1_ONLY="${PEERS_PART1_ONLY:-}"
LLMLB_BASE="${PEERS_LLMLB_BASE:-}"
wanted() { [[ "$WANTED" == *" $1 "* ]]; }
LLMLB="$ROOT/target/release/llmlb"
HZ="$(getconf CLK_TCK)"
SCRIPT_START=$SECONDS
# Bound on the whole run: no measurement starts after 15 minutes (each one
# is itself bounded by its --duration and --timeout).
MAX_RUNTIME=900

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/*.toml "$OUT"/*.conf "$OUT"/*.cpu "$OUT"/*.prom "$OUT"/*.txt
NOTES="$OUT/notes.txt"
note() { echo "$*" | tee -a "$NOTES" >&2; }

# ---------------------------------------------------------------- processes
# cleanup, start, stop, free_port, cpu_ticks and the canned $SSE answer.
# shellcheck source=scripts/proxy_helpers.sh
source "$ROOT/scripts/proxy_helpers.sh"

check_budget() {
    if (( SECONDS - SCRIPT_START > MAX_RUNTIME )); then
        note "peers.sh: over ${MAX_RUNTIME}s, stopping"
        exit 1
    fi
}

# wait_http URL SECONDS [METHOD]: until URL answers anything but a refused connection.
wait_http() {
    local url="$1" secs="$2" i
    for i in $(seq $((secs * 10))); do
        curl -s -o /dev/null -m 1 "$url" && return 0
        sleep 0.1
    done
    return 1
}

# ---------------------------------------------------------------- set-up
echo "== set-up" >&2
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    { apt-get update -qq && apt-get install -y nginx; } >"$OUT/apt.log" 2>&1 ||
        note "nginx: apt-get install failed (see $OUT/apt.log)"
fi
NGINX="$(command -v nginx || true)"
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
[ -z "$NGINX" ] && { note "nginx is required for the instant backend; aborting"; exit 1; }

mkdir -p "$CACHE"
if [ ! -x "$CACHE/venv/bin/python" ]; then
    # Debian's python3 needs its venv package first.
    python3 -m venv "$CACHE/venv" >"$OUT/venv.log" 2>&1 || {
        rm -rf "$CACHE/venv"
        { apt-get update -qq && apt-get install -y python3-venv; } >>"$OUT/venv.log" 2>&1
        python3 -m venv "$CACHE/venv" >>"$OUT/venv.log" 2>&1 || note "python venv: could not be created (see $OUT/venv.log)"
    }
fi
PY="$CACHE/venv/bin/python"
for pkg in sglang-router vllm-router; do
    wanted "${pkg%-router}" || wanted "$pkg" || continue
    "$CACHE/venv/bin/pip" show -q "$pkg" >/dev/null 2>&1 ||
        "$CACHE/venv/bin/pip" install -q "$pkg" >"$OUT/pip-$pkg.log" 2>&1 ||
        note "$pkg: pip install failed (see $OUT/pip-$pkg.log)"
done
SGLANG_VERSION="$("$CACHE/venv/bin/pip" show sglang-router 2>/dev/null | awk '/^Version/{print $2}')"
VLLM_ROUTER_VERSION="$("$CACHE/venv/bin/pip" show vllm-router 2>/dev/null | awk '/^Version/{print $2}')"
wanted sglang || SGLANG_VERSION=""
wanted vllm-router || VLLM_ROUTER_VERSION=""

(cd "$ROOT" && cargo build --release --quiet) || { note "cargo build --release failed"; exit 1; }

{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "nginx: $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')"
    echo "sglang-router: ${SGLANG_VERSION:-not installed}"
    echo "vllm-router: ${VLLM_ROUTER_VERSION:-not installed}"
    echo "llmlb: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)"
} | tee "$OUT/machine.txt" >&2

# ---------------------------------------------------------------- part 1
echo "== proxy overhead (${SECS}s per run)" >&2
TEMP="$OUT/nginx-tmp"
mkdir -p "$TEMP"

BACKEND_PORT=$(free_port)
nginx_backend_conf "$BACKEND_PORT" >"$OUT/backend.conf"
start backend "$NGINX" -p "$OUT" -c "$OUT/backend.conf"
BACKEND_PG=$PGID
BACKEND="http://127.0.0.1:$BACKEND_PORT"
wait_http "$BACKEND/health" 10 || { note "nginx backend did not start (see $OUT/backend.log)"; exit 1; }

declare -A URL PG
URL[direct]="$BACKEND"

# llmlb_overhead NAME BINARY [EXTRA TOML]: one llmlb in front of the backend.
llmlb_overhead() {
    local name="$1" bin="$2" extra="${3:-}" port
    port=$(free_port)
    llmlb_conf "$port" "$BACKEND" "$extra" >"$OUT/$name-overhead.toml"
    start "$name-overhead" "$bin" serve --config "$OUT/$name-overhead.toml"
    PG[$name]=$PGID
    URL[$name]="http://127.0.0.1:$port"
}
if wanted llmlb; then
    llmlb_overhead llmlb "$LLMLB"
    llmlb_overhead llmlb-nolog "$LLMLB" $'[telemetry.access_log]\nenabled = false'
    [ -n "$LLMLB_BASE" ] && llmlb_overhead llmlb-base "$LLMLB_BASE"
fi

# nginx as the proxy
if wanted nginx; then
NG_PORT=$(free_port)
nginx_proxy_conf "$NG_PORT" "$BACKEND_PORT" >"$OUT/nginx-proxy.conf"
start nginx-proxy "$NGINX" -p "$OUT" -c "$OUT/nginx-proxy.conf"
PG[nginx]=$PGID
URL[nginx]="http://127.0.0.1:$NG_PORT"
fi

# SGLang router
if [ -n "$SGLANG_VERSION" ]; then
    SG_PORT=$(free_port)
    start sglang-overhead "$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$SG_PORT" \
        --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" \
        --worker-urls "$BACKEND" --policy round_robin --log-level warn
    PG[sglang]=$PGID
    URL[sglang]="http://127.0.0.1:$SG_PORT"
fi

# vLLM router
if [ -n "$VLLM_ROUTER_VERSION" ]; then
    VR_PORT=$(free_port)
    start vllm-router-overhead "$CACHE/venv/bin/vllm-router" --host 127.0.0.1 --port "$VR_PORT" \
        --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" \
        --worker-urls "$BACKEND" --policy round_robin --log-level warning
    PG[vllm-router]=$PGID
    URL[vllm-router]="http://127.0.0.1:$VR_PORT"
fi

# A proxy is ready when a real completion request through it succeeds.
ready() {
    curl -sf -m 2 -o /dev/null -H 'content-type: application/json' \
        -d '{"model":"instant","prompt":"hi","max_tokens":16,"stream":true}' "$1/v1/completions"
}
PROXIES=()
for p in llmlb llmlb-nolog llmlb-base nginx sglang vllm-router; do
    [ -n "${URL[$p]:-}" ] || continue
    ok=""
    deadline=$((SECONDS + 30))
    while (( SECONDS < deadline )); do ready "${URL[$p]}" && { ok=1; break; }; sleep 0.1; done
    if [ -n "$ok" ]; then PROXIES+=("$p"); else note "$p: no successful request within 30 s (see $OUT/*$p*.log); skipped"; fi
done

# overhead RUN CONCURRENCY ROUND: one closed-loop run; writes
# $OUT/overhead-RUN-cC-rR.json and the proxy's CPU ticks to ...cpu.
overhead() {
    local run="$1" c="$2" r="$3" before after name
    name="overhead-$run-c$c-r$r"
    check_budget
    before=0
    [ "$run" != direct ] && before=$(cpu_ticks "${PG[$run]}")
    "$LLMLB" bench --target "${URL[$run]}" --model instant --workload random \
        --input-len 16 --output-len 16 --concurrency "$c" --duration "${SECS}s" \
        --requests 1000000 --timeout 10s --no-progress --name "$run" \
        --out "$OUT/$name.json" >"$OUT/$name.log" 2>&1 ||
        note "$run c=$c round $r: bench failed (see $OUT/$name.log)"
    after=0
    [ "$run" != direct ] && after=$(cpu_ticks "${PG[$run]}")
    echo "$(( after - before ))" >"$OUT/$name.cpu"
}

ORDER=(direct "${PROXIES[@]}")
for r in $(seq "$ROUNDS"); do
    for c in 1 32; do
        for run in "${ORDER[@]}"; do
            echo "   round $r, $run, concurrency $c" >&2
            overhead "$run" "$c" "$r"
        done
    done
    mapfile -t ORDER < <(printf '%s\n' "${ORDER[@]}" | tac)
done

# Keep-alive probe: the first request on a new connection, then the median
# of 20 more on the same connection (a client that keeps its connection).
for run in direct "${PROXIES[@]}"; do
    python3 - "$run" "${URL[$run]}" <<'PY' >>"$OUT/keepalive.txt" 2>&1
import http.client, json, socket, statistics, sys, time, urllib.parse
name, url = sys.argv[1], urllib.parse.urlsplit(sys.argv[2])
body = json.dumps({"model": "instant", "prompt": "hi", "max_tokens": 16, "stream": True})
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
conn.connect()
conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(21):
    t = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    conn.getresponse().read()
    times.append((time.perf_counter() - t) * 1e3)
print(f"{name}: first request {times[0]:.2f} ms, next 20 on the same connection median {statistics.median(times[1:]):.2f} ms")
PY
done

echo "loadavg after part 1: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2
for p in "${PROXIES[@]}"; do stop "${PG[$p]}"; done
stop "$BACKEND_PG"

# ---------------------------------------------------------------- part 2
if [ -z "$PART1_ONLY" ]; then
echo "== routing quality" >&2
SIM_BLOCKS=2048

# fleet: starts 4 fresh replicas; sets FLEET_PG, FLEET_URLS (array), MODEL.
fleet() {
    local name="$1" i n
    start "sim-$name" "$LLMLB" replica-sim --replicas 4 --port 0 --profile h100-8b --num-blocks "$SIM_BLOCKS" --max-model-len $(( (SIM_BLOCKS - 1) * 16 ))
    FLEET_PG=$PGID
    for i in $(seq 100); do
        n=$(grep -c 'replica http://' "$OUT/sim-$name.log" 2>/dev/null)
        [ "${n:-0}" -ge 4 ] && break
        sleep 0.1
    done
    mapfile -t FLEET_URLS < <(grep -o 'replica http://[0-9.:]*' "$OUT/sim-$name.log" | cut -d' ' -f2)
    MODEL="$(grep -m1 -o 'model "[^"]*"' "$OUT/sim-$name.log" | cut -d'"' -f2)"
    [ "${#FLEET_URLS[@]}" -eq 4 ] || { note "sim fleet for $name did not start (see $OUT/sim-$name.log)"; return 1; }
}

# dump_metrics FILE_PREFIX: saves every replica's /metrics page.
dump_metrics() {
    local i
    for i in "${!FLEET_URLS[@]}"; do curl -s -m 2 "${FLEET_URLS[$i]}/metrics" >"$1.r$i.prom"; done
}

workload_args() {
    case "$1" in
        shared-prefix) echo "--workload shared-prefix --groups 32 --prompts-per-group 8 --system-len 1536 --question-len 64 --output-len 64 --rate 12 --requests 256 --duration 60s" ;;
        trace) echo "--workload trace --trace $TRACE --time-scale 0.1 --length-scale 0.05 --max-requests 600 --duration 60s" ;;
    esac
}

# route ROUTER WORKLOAD: fresh fleet, router in front, one run.
route() {
    local router="$1" wl="$2" port url r
    check_budget
    fleet "$router-$wl" || return
    port=$(free_port)
    url="http://127.0.0.1:$port"
    case "$router" in
        sglang-cache_aware)
            start "router-$router-$wl" "$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$port" \
                --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" \
                --worker-urls "${FLEET_URLS[@]}" --policy cache_aware --log-level warn
            ;;
        llmlb-*)
            {
                echo "[server]"
                echo "listen = \"127.0.0.1:$port\""
                echo "admin_listen = \"127.0.0.1:$(free_port)\""
                echo "replica_header = true"
                echo "[[pools]]"
                echo "name = \"sim\""
                echo "models = [\"$MODEL\"]"
                case "${router#llmlb-}" in
                    hash|cache)   # prefix affinity in front of least_connections
                        echo "balancer = \"least_connections\""
                        printf '[pools.prefix]\nmode = "%s"\n' "${router#llmlb-}" ;;
                    *) echo "balancer = \"${router#llmlb-}\"" ;;
                esac
                echo "[pools.scrape]"
                echo "interval = \"100ms\""
                echo "timeout = \"100ms\""
                echo "staleness = \"1s\""
                for r in "${FLEET_URLS[@]}"; do printf '[[pools.replicas]]\nurl = "%s"\n' "$r"; done
            } >"$OUT/$router-$wl.toml"
            start "router-$router-$wl" "$LLMLB" serve --config "$OUT/$router-$wl.toml"
            ;;
    esac
    local router_pg=$PGID ok="" deadline=$((SECONDS + 30))
    while (( SECONDS < deadline )); do
        curl -sf -m 5 -o /dev/null -H 'content-type: application/json' \
            -d "{\"model\":\"$MODEL\",\"prompt\":\"hi\",\"max_tokens\":1}" "$url/v1/completions" && { ok=1; break; }
        sleep 0.1
    done
    if [ -z "$ok" ]; then
        note "$router: not ready within 30 s on the $wl run (see $OUT/router-$router-$wl.log); skipped"
    else
        # Let llmlb's scraper see the fleet once (3 intervals).
        sleep 0.3
        dump_metrics "$OUT/route-$wl-$router.before"
        echo "   $router, $wl" >&2
        # shellcheck disable=SC2046
        "$LLMLB" bench --target "$url" --model "$MODEL" $(workload_args "$wl") --seed 1 \
            --timeout 60s --no-progress --name "$router" --out "$OUT/route-$wl-$router.json" \
            >"$OUT/route-$wl-$router.log" 2>&1 || note "$router $wl: bench failed (see $OUT/route-$wl-$router.log)"
        dump_metrics "$OUT/route-$wl-$router.after"
    fi
    stop "$router_pg"
    stop "$FLEET_PG"
}

ROUTERS=(llmlb-jsq llmlb-least_tokens)
# llmlb's prefix-aware routing: set LLMLB_PREFIX_BALANCER to `cache` or `hash`
# (prefix affinity in front of least_connections) to add it to the comparison.
[ -n "$PREFIX_BALANCER" ] && ROUTERS+=("llmlb-$PREFIX_BALANCER")
[ -n "$SGLANG_VERSION" ] && ROUTERS+=(sglang-cache_aware)
for wl in shared-prefix trace; do
    for router in "${ROUTERS[@]}"; do route "$router" "$wl"; done
done
fi
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

# ---------------------------------------------------------------- report
python3 - "$OUT" "$HZ" "$ROUNDS" "$PREFIX_BALANCER" <<'EOF' | tee "$OUT/summary.md"
import glob, json, os, re, sys
out, hz, rounds, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def prom(path):
    """Sum of the samples of every metric name in one Prometheus text page."""
    sums = {}
    try:
        for line in open(path):
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
            if m:
                sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    except OSError:
        pass
    return sums

print(open(os.path.join(out, "machine.txt")).read())
print("Proxy overhead: llmlb bench closed loop, /v1/completions, 16-token SSE answer from an nginx instant backend")
for r in range(1, rounds + 1):
    for c in (1, 32):
        d = load(f"{out}/overhead-direct-c{c}-r{r}.json")
        print(f"\nround {r}, concurrency {c}")
        print("| path | requests/s | e2e p50 (ms) | e2e p99 (ms) | added p50 (ms) | added p99 (ms) | proxy CPU per request (µs) | errors |")
        print("|---|---|---|---|---|---|---|---|")
        for run in ("direct", "llmlb", "llmlb-nolog", "llmlb-base", "nginx", "sglang", "vllm-router"):
            x = load(f"{out}/overhead-{run}-c{c}-r{r}.json")
            if x is None:
                print(f"| {run} | did not run | | | | | | |")
                continue
            e = x["e2e_ms"]
            add50 = add99 = cpu = "-"
            if run != "direct" and d is not None:
                add50 = f"{e['p50'] - d['e2e_ms']['p50']:+.3f}"
                add99 = f"{e['p99'] - d['e2e_ms']['p99']:+.3f}"
                ticks = int(open(f"{out}/overhead-{run}-c{c}-r{r}.cpu").read())
                if x["completed"]:
                    cpu = f"{ticks / hz / x['completed'] * 1e6:.0f}"
            print(f"| {run} | {x['request_throughput']:,.0f} | {e['p50']:.3f} | {e['p99']:.3f} | {add50} | {add99} | {cpu} | {x['failed']} |")
try:
    print("\nKeep-alive probe (Python http.client with TCP_NODELAY, one streaming request at a time):")
    print(open(f"{out}/keepalive.txt").read())
except OSError:
    pass

if not glob.glob(f"{out}/route-*.json"):
    sys.exit(0)  # part 1 only
print("Routing quality: a fresh 4-replica llmlb replica-sim fleet (h100-8b, 2048 KV blocks each) per run;")
print("prefix-cache hits, requests per replica and preemptions from the replicas' own /metrics")
for wl in ("shared-prefix", "trace"):
    print(f"\n{wl}")
    print("| router | completed | failed | TTFT p50 (ms) | TTFT p99 (ms) | requests/s | output tokens/s | prefix-cache hit rate | busiest/mean replica | preemptions |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    routers = ["llmlb-jsq", "llmlb-least_tokens"]
    routers.append(f"llmlb-{prefix}" if prefix else "llmlb-(prefix-aware)")
    routers.append("sglang-cache_aware")
    for router in routers:
        x = load(f"{out}/route-{wl}-{router}.json")
        if x is None:
            why = "not measured (set LLMLB_PREFIX_BALANCER)" if router == "llmlb-(prefix-aware)" else "did not run"
            print(f"| {router} | {why} | | | | | | | | |")
            continue
        hits = queries = preempt = 0.0
        per_replica = []
        for after in sorted(glob.glob(f"{out}/route-{wl}-{router}.after.r*.prom")):
            a, b = prom(after), prom(after.replace(".after.", ".before."))
            delta = lambda k: a.get(k, 0.0) - b.get(k, 0.0)
            hits += delta("vllm:prefix_cache_hits_total")
            queries += delta("vllm:prefix_cache_queries_total")
            preempt += delta("vllm:num_preemptions_total")
            per_replica.append(delta("vllm:request_success_total"))
        rate = f"{hits / queries:.1%}" if queries else "-"
        mean = sum(per_replica) / len(per_replica) if per_replica else 0
        spread = f"{max(per_replica) / mean:.2f}" if mean else "-"
        t = x["ttft_ms"]
        print(f"| {router} | {x['completed']} | {x['failed']} | {t['p50']:.0f} | {t['p99']:.0f} | {x['request_throughput']:.2f} | {x['output_throughput']:.0f} | {rate} | {spread} | {preempt:.0f} |")
EOF
if [ -s "$NOTES" ]; then
    echo
    echo "Notes:"
    cat "$NOTES"
fi
echo "Reports, logs and configs: $OUT" >&2
