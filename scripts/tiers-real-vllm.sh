#!/usr/bin/env bash
# A paid and a free tier through one llmlb in front of one real vLLM CPU
# replica of ../shared/vllm-cpu (started with `--scheduling-policy priority`
# and a small batch, MAX_NUM_SEQS), the same load once per pool variant.
# Prints each tier's time to first token per run.
#
# Usage: scripts/tiers-real-vllm.sh
# Env:   LLMLB (default target/release/llmlb), FREE and PAID (requests per
#        second, default 14 and 2), SECS (seconds of load, 20), SEQS (the
#        replica's max_num_seqs, 2), PORT (18000), CORE (0), LLMLB_SHARED (the
#        shared directory, default ../shared beside the checkout),
#        INPUT_LEN (256), OUTPUT_LEN (64), VARIANTS (the pool's extra TOML
#        lines per run, runs separated by `;`, lines by `\n`; default
#        `send_priority` off, on, off, on: requests queue in the replica).
#        E.g. the prefill bound behind llmlb's own queue:
#        SEQS=8 VARIANTS='max_inflight = 8;max_inflight = 8\nmax_prefilling = 2;max_inflight = 8;max_inflight = 8\nmax_prefilling = 2'
# Needs ../shared/vllm-cpu installed (its README). Every load is bounded in
# requests and by a 120 s timeout; the replica is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMLB=$(realpath "${LLMLB:-target/release/llmlb}")
FREE=${FREE:-14} PAID=${PAID:-2} SECS=${SECS:-20} SEQS=${SEQS:-2}
PORT=${PORT:-18000} CORE=${CORE:-0}
INPUT_LEN=${INPUT_LEN:-256} OUTPUT_LEN=${OUTPUT_LEN:-64}
VARIANTS=${VARIANTS:-send_priority = false;send_priority = true;send_priority = false;send_priority = true}
VLLM=$(realpath "${LLMLB_SHARED:-../shared}/vllm-cpu/setup_and_serve.sh")
work=$(mktemp -d /tmp/llmlb-send-priority.XXXXXX)
lb=""
cleanup() {
  [[ -n $lb ]] && kill "$lb" 2>/dev/null
  PORT=$PORT "$VLLM" stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
EXTRA_ARGS='--scheduling-policy priority' MAX_NUM_SEQS=$SEQS PORT=$PORT CORE=$CORE "$VLLM" serve >/dev/null

IFS=';' read -r -a variants <<<"$VARIANTS"
for variant in "${variants[@]}"; do
  pool=$(printf '%b' "$variant")
  cat >"$work/llmlb.toml" <<EOT
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[gateway]
tier_header = "x-llmlb-tier"
default_tier = "free"
[[tiers]]
name = "paid"
priority = "high"
[[tiers]]
name = "free"
priority = "low"
[[pools]]
name = "p"
models = ["tiny-llama"]
$pool
[[pools.replicas]]
url = "http://127.0.0.1:$PORT"
EOT
  "$LLMLB" --log-format json serve --config "$work/llmlb.toml" 2>"$work/lb.log" &
  lb=$!
  for _ in $(seq 100); do grep -q '"addr"' "$work/lb.log" && break; sleep 0.1; done
  addr=$(grep -m1 -o '"addr":"[^"]*"' "$work/lb.log" | cut -d'"' -f4)
  tier() { # name rate
    "$LLMLB" bench --target "http://$addr" --model tiny-llama --workload random \
      --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --rate "$2" \
      --requests "$(python3 -c "print(int($2 * $SECS))")" --duration 120s --timeout 120s \
      --header "x-llmlb-tier:$1" --seed 7 --no-progress --out "$work/$1.json" >"$work/$1.txt" 2>&1
  }
  tier free "$FREE" &
  f=$!
  tier paid "$PAID" &
  p=$!
  wait $f $p
  python3 - "$work" "$variant" <<'PY'
import json, sys
work, variant = sys.argv[1:]
for t in ["paid", "free"]:
    r = json.load(open(f"{work}/{t}.json"))
    ttft = r["ttft_ms"]
    print(f"[{variant}] {t}: completed={r['completed']} failed={r['failed']} "
          f"ttft_p50_ms={ttft['p50']:.0f} ttft_p99_ms={ttft['p99']:.0f}")
PY
  kill "$lb"
  wait "$lb" 2>/dev/null || true
  lb=""
done
