#!/usr/bin/env bash
# The fairness scenario (`llmlb demo --scenario fairness`) as separate
# processes, with longer runs and every request kept: two `h100-8b`
# replica simulators, `max_inflight = 2` each, one llmlb; tenant `light`
# sends one stream at a time, tenant `heavy` twelve (from 1 s before the
# light run to 1 s after it). One result line; the light tenant's TTFTs go
# to OUT_DIR for pooling (docs/lab/fair-share.md).
#
#   scripts/fair-share-lab.sh VARIANT SEED
#     VARIANT  solo (light alone), fifo, fair
#     SEED     workload and replica seed
# Env: LLMLB (binary, default target/debug/llmlb), RUN_SECONDS (light's
#      run, 30), ANTICIPATE (`[pools.queue] anticipate`, default: unset),
#      OUT_DIR (default: a temporary directory, removed).
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT=$1 SEED=$2
LLMLB=${LLMLB:-target/debug/llmlb}
RUN=${RUN_SECONDS:-30}
work=$(mktemp -d /tmp/llmlb-fair-lab.XXXXXX)
out=${OUT_DIR:-$work}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

base=$(( 20000 + (RANDOM % 2000) * 8 ))
"$LLMLB" replica-sim --replicas 2 --port "$base" --profile h100-8b --model m \
  --seed "$SEED" 2>"$work/sim.log" &
pids+=($!)
for i in 0 1; do
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$((base + i))/health" >/dev/null && break; sleep 0.05; done
done

fairness=tenants
[[ $VARIANT == fifo ]] && fairness=fifo
anticipate=""
[[ -n ${ANTICIPATE:-} ]] && anticipate="anticipate = \"$ANTICIPATE\""
cat >"$work/llmlb.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[pools]]
name = "p"
models = ["m"]
balancer = "least_connections"
max_inflight = 2
[pools.queue]
max_depth = 64
max_wait = "120s"
timeout = "120s"
fairness = "$fairness"
$anticipate
[pools.scrape]
interval = "100ms"
timeout = "100ms"
staleness = "1000ms"
[[pools.replicas]]
url = "http://127.0.0.1:$base"
[[pools.replicas]]
url = "http://127.0.0.1:$((base + 1))"
EOF
RUST_LOG=warn,llmlb=info "$LLMLB" --log-format json serve --config "$work/llmlb.toml" 2>"$work/lb.log" &
pids+=($!)
for _ in $(seq 200); do grep -q '"addr"' "$work/lb.log" 2>/dev/null && break; sleep 0.05; done
addr=$(grep -m1 -o '"addr":"[^"]*"' "$work/lb.log" | cut -d'"' -f4)
sleep 0.5

tenant() { # name streams seconds seed
  "$LLMLB" bench --target "http://$addr" --model m --workload random --input-len 512 \
    --output-len 16..112 --concurrency "$2" --requests 100000 --duration "${3}s" \
    --timeout 120s --header "x-llmlb-tenant:$1" --seed "$4" --no-progress \
    --out "$work/$1.json" >"$work/$1.txt" 2>&1
}
if [[ $VARIANT == solo ]]; then
  tenant light 1 "$RUN" "$SEED"
else
  tenant heavy 12 "$((RUN + 2))" "$((SEED + 1))" &
  hp=$!
  sleep 1
  tenant light 1 "$RUN" "$SEED"
  wait $hp
fi

python3 - "$work" "$out" "$VARIANT" "$SEED" <<'PY'
import json, os, sys
work, out, variant, seed = sys.argv[1:5]
light = json.load(open(f"{work}/light.json"))
ttfts = [r["ttft_ms"] for r in light["requests"] if r.get("ttft_ms") is not None]
with open(f"{out}/light-{variant}-{seed}.txt", "w") as f:
    f.write("\n".join(f"{t:.3f}" for t in ttfts) + "\n")
line = (f"variant={variant} seed={seed} light_n={len(ttfts)} "
        f"light_p50_ms={light['ttft_ms']['p50']:.0f} light_p99_ms={light['ttft_ms']['p99']:.0f} "
        f"light_out_tps={light['output_throughput']:.0f} light_failed={light['failed']}")
if os.path.exists(f"{work}/heavy.json"):
    heavy = json.load(open(f"{work}/heavy.json"))
    # Mean time between two slot releases: the heavy run's length over the
    # requests completed in it (both tenants).
    gap = 1000 * heavy["duration_s"] / (heavy["completed"] + light["completed"])
    line += (f" heavy_p99_ms={heavy['ttft_ms']['p99']:.0f} heavy_out_tps={heavy['output_throughput']:.1f}"
             f" heavy_failed={heavy['failed']} release_gap_ms={gap:.0f}")
print(line)
PY
