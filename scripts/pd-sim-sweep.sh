#!/usr/bin/env bash
# Simulated H100 replicas (replica-sim, h100-8b profile, real time) through
# llmlb: prefill + decode splits (2P2D, 3P1D, 1P3D) against 4 aggregated
# replicas, long prompts (4,096 tokens, 256 output) at rising arrival
# rates; then a mixed short/long workload through the 2+2 fleet, decided
# per request (`auto`) against always disaggregated. Prints one JSON line
# per run. The same grid on the virtual clock: scripts/pd-fleet-sim-sweep.sh.
#   bash scripts/pd-sim-sweep.sh
# Knobs: LLMLB (binary), RATES ("1 2 3 4 5"), REQUESTS (60), OUT (dir),
# SLO ("ttft:1000 tpot:20"), PARTS ("aggregated 2p2d 3p1d 1p3d mixed":
# which runs).
set -euo pipefail
cd "$(dirname "$0")/.."
LLMLB=${LLMLB:-target/release/llmlb}
RATES=${RATES:-"1 2 3 4 5"}
REQUESTS=${REQUESTS:-60}
SLO=${SLO:-"ttft:1000 tpot:20"}
PARTS=${PARTS:-"aggregated 2p2d 3p1d 1p3d mixed"}
part() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=${OUT:-$(mktemp -d /tmp/llmlb-pd-sim.XXXX)}
MODEL=meta-llama/Llama-3.1-8B-Instruct
LB=19190; ADMIN=19191
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

sims() { # PORT N ROLE
  "$LLMLB" replica-sim --profile h100-8b --port "$1" --replicas "$2" --role "$3" --seed 1 \
    > "$OUT/sim-$1.log" 2>&1 &
  pids+=($!)
  for i in $(seq 0 $(($2 - 1))); do
    for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$(($1 + i))/health" && break; sleep 0.1; done
  done
}
serve() { # CONFIG
  "$LLMLB" serve --config "$1" > "$OUT/$(basename "$1" .toml).log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$ADMIN/readyz" && return; sleep 0.1; done
  echo "llmlb not ready"; exit 1
}
stop_all() { cleanup; pids=(); sleep 0.5; }
bench() { # NAME RATE INPUT REQUESTS [extra]
  local name=$1 rate=$2 input=$3 n=$4
  # shellcheck disable=SC2086
  "$LLMLB" bench --target "http://127.0.0.1:$LB" --model "$MODEL" --workload random \
    --input-len "$input" --output-len 256 --rate "$rate" --requests "$n" --seed "${rate/./}$input" \
    --slo $SLO --no-progress --name "$name" --out "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
  python3 - "$OUT/$name.json" "$name" "$rate" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
print(json.dumps({"run": sys.argv[2], "rate": float(sys.argv[3]), "completed": f["completed"], "failed": f["failed"],
  "ttft_p50_ms": round(f["ttft_ms"]["p50"], 1), "ttft_p99_ms": round(f["ttft_ms"]["p99"], 1),
  "itl_p50_ms": round(f["itl_ms"]["p50"], 2), "itl_p99_ms": round(f["itl_ms"]["p99"], 2),
  "tpot_p50_ms": round(f["tpot_ms"]["p50"], 2), "goodput": f.get("goodput"), "good": f.get("good_requests")}))
PY
}

head="[server]
listen = \"127.0.0.1:$LB\"
admin_listen = \"127.0.0.1:$ADMIN\"
[pools.scrape]
interval = \"250ms\""
replicas() { for i in $(seq 0 $(($2 - 1))); do echo "[[pools.replicas]]"; echo "url = \"http://127.0.0.1:$(($1 + i))\""; done; }

cat > "$OUT/aggregated.toml" <<TOML
[server]
listen = "127.0.0.1:$LB"
admin_listen = "127.0.0.1:$ADMIN"
[[pools]]
name = "chat"
models = ["$MODEL"]
balancer = "least_tokens"
$(replicas 19100 4)
TOML
disagg() { # WHEN [DECODE PREFILL]
local d=${2:-2} p=${3:-2}
cat <<TOML
[server]
listen = "127.0.0.1:$LB"
admin_listen = "127.0.0.1:$ADMIN"
[[pools]]
name = "chat"
models = ["$MODEL"]
balancer = "least_tokens"
[pools.disaggregation]
prefill_pool = "chat-prefill"
when = "$1"
$(replicas 19110 "$d")
[[pools]]
name = "chat-prefill"
role = "prefill"
balancer = "least_tokens"
$(replicas 19120 "$p")
TOML
}
disagg always > "$OUT/disaggregated.toml"
disagg auto > "$OUT/auto.toml"

for rate in $RATES; do
  if part aggregated; then
    sims 19100 4 both; serve "$OUT/aggregated.toml"
    bench "aggregated-r$rate" "$rate" 4096 "$REQUESTS"
    stop_all
  fi
  for split in 2p2d 3p1d 1p3d; do
    part $split || continue
    p=${split:0:1}; d=${split:2:1}
    disagg always "$d" "$p" > "$OUT/$split.toml"
    sims 19110 "$d" decode; sims 19120 "$p" prefill; serve "$OUT/$split.toml"
    bench "$split-r$rate" "$rate" 4096 "$REQUESTS"
    stop_all
  done
done
part mixed || { echo "results in $OUT"; exit 0; }

# Mixed: short prompts (128 tokens) at 4/s beside long ones (4,096) at 1.5/s.
for when in always auto; do
  sims 19110 2 decode; sims 19120 2 prefill
  if [ $when = always ]; then serve "$OUT/disaggregated.toml"; else serve "$OUT/auto.toml"; fi
  bench "mixed-$when-short" 4 128 120 &
  b=$!
  bench "mixed-$when-long" 1.5 4096 45
  wait $b
  curl -s "http://127.0.0.1:$ADMIN/metrics" | grep '^llmlb_disaggregation_decisions_total' || true
  stop_all
done
echo "results in $OUT"
