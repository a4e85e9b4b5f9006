#!/usr/bin/env bash
# Two real vLLM CPU replicas through llmlb, disaggregated (producer +
# consumer with vLLM's example shared-storage connector) and then
# aggregated (the same two replicas without it, round-robin): the same
# greedy prompts through both; answers compared, TTFT and inter-token
# figures printed. Run under the vLLM lock (and `quiet` for figures):
#   flock /tmp/llmlb-vllm.lock bash scripts/pd-real-vllm.sh
# Knobs: N (prompts, 24), WORDS (prompt words, 360: about 1,600 tokens),
# MAX_TOKENS (64), CONC (concurrency, 1 2), LLMLB (binary), OUT (dir).
set -euo pipefail
cd "$(dirname "$0")/.."
S=/work/shared/vllm-cpu/setup_and_serve.sh
LLMLB=${LLMLB:-target/release/llmlb}
N=${N:-24}; WORDS=${WORDS:-360}; MAX_TOKENS=${MAX_TOKENS:-64}; CONC=${CONC:-"1 2"}
OUT=${OUT:-$(mktemp -d /tmp/llmlb-pd.XXXX)}
KV=$(mktemp -d /tmp/llmlb-pd-kv.XXXX)
PY=python3
LB_PORT=18090; ADMIN_PORT=18091
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  PORT=18000 $S stop || true; PORT=18001 $S stop || true
  rm -rf "$KV"
}
trap cleanup EXIT

serve_llmlb() { # $1: config file
  "$LLMLB" serve --config "$1" > "$OUT/llmlb-$(basename "$1" .toml).log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz" && return; sleep 0.1; done
  echo "llmlb did not become ready"; exit 1
}
stop_llmlb() { kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; }

common="[server]
listen = \"127.0.0.1:$LB_PORT\"
admin_listen = \"127.0.0.1:$ADMIN_PORT\"
replica_header = true"

cat > "$OUT/disaggregated.toml" <<TOML
$common
[[pools]]
name = "chat"
models = ["tiny-llama"]
balancer = "least_tokens"
[pools.disaggregation]
prefill_pool = "chat-prefill"
when = "always"
[[pools.replicas]]
url = "http://127.0.0.1:18001"
[[pools]]
name = "chat-prefill"
role = "prefill"
balancer = "least_tokens"
[[pools.replicas]]
url = "http://127.0.0.1:18000"
TOML
cat > "$OUT/aggregated.toml" <<TOML
$common
[[pools]]
name = "chat"
models = ["tiny-llama"]
balancer = "least_tokens"
[[pools.replicas]]
url = "http://127.0.0.1:18000"
[[pools.replicas]]
url = "http://127.0.0.1:18001"
TOML

echo "== disaggregated: producer 18000, consumer 18001, storage $KV"
conn() { echo "{\"kv_connector\":\"ExampleConnector\",\"kv_role\":\"$1\",\"kv_connector_extra_config\":{\"shared_storage_path\":\"$KV\"}}"; }
EXTRA_ARGS="--kv-transfer-config $(conn kv_producer)" PORT=18000 CORE=0 $S serve
EXTRA_ARGS="--kv-transfer-config $(conn kv_consumer)" PORT=18001 CORE=1 $S serve
serve_llmlb "$OUT/disaggregated.toml"
for c in $CONC; do
  echo -n "disaggregated c=$c: "
  rm -rf "${KV:?}"/*
  $PY scripts/pd_real_vllm.py "http://127.0.0.1:$LB_PORT" "$N" "$WORDS" "$MAX_TOKENS" "$c" "$OUT/disaggregated-c$c.jsonl"
done
du -sh "$KV" || true
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^llmlb_(disaggregation|prefill)' > "$OUT/disaggregated-metrics.txt" || true
grep -c "External Cache Hit" ~/.cache/llmlb-vllm-cpu/vllm-18001.log | sed 's/^/consumer external cache hits logged: /' || true
stop_llmlb
PORT=18000 $S stop; PORT=18001 $S stop

echo "== aggregated: the same two replicas, no connector"
PORT=18000 CORE=0 $S serve
PORT=18001 CORE=1 $S serve
serve_llmlb "$OUT/aggregated.toml"
for c in $CONC; do
  echo -n "aggregated c=$c: "
  $PY scripts/pd_real_vllm.py "http://127.0.0.1:$LB_PORT" "$N" "$WORDS" "$MAX_TOKENS" "$c" "$OUT/aggregated-c$c.jsonl"
done
stop_llmlb

echo "== answers compared (greedy)"
for c in $CONC; do
  $PY - "$OUT/disaggregated-c$c.jsonl" "$OUT/aggregated-c$c.jsonl" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = sum(x["text"] == y["text"] for x, y in zip(a, b))
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {same}/{len(a)} answers equal to the aggregated ones; "
      f"consumer cached tokens per request {[x['cached_tokens'] for x in a][:6]}...")
PYEOF
done
echo "results in $OUT"
