#!/usr/bin/env bash
# `llmlb calibrate` against one real vLLM CPU replica, then the fidelity
# table of `llmlb replica-sim` with the profile it wrote beside the same
# replica (scripts/sim_fidelity.py: TTFT p50/p99, inter-token latency and
# output tokens/s at concurrency 1, 16 and 64, three prompt-sharing
# scenarios).
#
# The replica runs on core 0 (port 18000), the client on core 1; then the
# replica is stopped and `llmlb replica-sim --profile` takes its place on
# core 0. If a replica already answers on the port (started beforehand, so
# that a measurement hold does not include vLLM's start), it is used as it
# is; either way it is stopped, with its whole process group, at the end.
#
# Usage: scripts/calibrate-fidelity.sh OUTDIR
#   (for figures: flock /tmp/llmlb-vllm.lock bash scripts/calibrate-fidelity.sh OUTDIR)
# Writes OUTDIR/profile.toml, calibration.json, vllm.jsonl, sim.jsonl,
# table.md and times.txt. Environment: PORT (18000), SIM_PORT (18100),
# LLMLB (target/release/llmlb), VLLM_START_WAIT (seconds, 900), REPEAT (3:
# every cell is run three times, round the cells, and the table gives each
# cell's median, so that one slow spell of this shared machine does not
# decide a cell), API_NICE (-10, the API server's priority).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:?usage: calibrate-fidelity.sh OUTDIR}"
PORT="${PORT:-18000}"
SIM_PORT="${SIM_PORT:-18100}"
LLMLB="${LLMLB:-$ROOT/target/release/llmlb}"
REPEAT="${REPEAT:-3}"
REPLICA="$ROOT/scripts/vllm_replica.py"
mkdir -p "$OUT"
SIM_PID=""

cleanup() {
  [ -n "$SIM_PID" ] && kill "$SIM_PID" 2>/dev/null || true
  python3 "$REPLICA" stop --port "$PORT" || true
}
trap cleanup EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(load)" | tee "$OUT/times.txt"

if ! curl -sf -o /dev/null "http://127.0.0.1:$PORT/health"; then
  python3 "$REPLICA" serve --port "$PORT" --core 0
fi

# vLLM's API server shares core 1 with its engine core's polling loop and
# the client. At the default priority it is sometimes held off the CPU while
# the engine runs, and a response then reaches the client whole at its end;
# at nice -10 (API_NICE) that was not seen
# (docs/lab/fidelity-vllm-against-itself.md).
API_PID="$(pgrep -f "vllm serve .*--port $PORT" | head -1 || true)"
if [ -z "$API_PID" ] || ! renice -n "${API_NICE:--10}" -p "$API_PID" >/dev/null; then
  echo "warning: vLLM's API server keeps its priority" | tee -a "$OUT/times.txt"
fi

t0=$(date +%s.%N)
taskset -c 1 "$LLMLB" calibrate --url "http://127.0.0.1:$PORT" \
  --max-num-seqs 32 --max-num-batched-tokens 2048 \
  -o "$OUT/profile.toml" --out "$OUT/calibration.json"
t1=$(date +%s.%N)
echo "calibrate: $(echo "$t1 - $t0" | bc) s wall, load $(load)" | tee -a "$OUT/times.txt"

# The replica's processes (API server, EngineCore, worker) share a process
# group: each run reports their CPU time (cpu_ms).
PGID="$(ps -o pgid= -p "$(cat "${VLLMCPU_DIR:-$HOME/.cache/llmlb-vllm-cpu}/vllm-$PORT.pid")" | tr -d ' ' || echo 0)"
taskset -c 1 python3 "$ROOT/scripts/sim_fidelity.py" --url "http://127.0.0.1:$PORT" \
  --label vLLM --repeat "$REPEAT" --cpu-group "${PGID:-0}" > "$OUT/vllm.jsonl"
echo "fidelity on vLLM done, load $(load)" | tee -a "$OUT/times.txt"
python3 "$REPLICA" stop --port "$PORT"

taskset -c 0 "$LLMLB" replica-sim --profile "$OUT/profile.toml" --port "$SIM_PORT" \
  --model tiny-llama > "$OUT/sim.log" 2>&1 &
SIM_PID=$!
for _ in $(seq 1 60); do
  curl -sf -o /dev/null "http://127.0.0.1:$SIM_PORT/health" && break
  sleep 0.5
done
taskset -c 1 python3 "$ROOT/scripts/sim_fidelity.py" --url "http://127.0.0.1:$SIM_PORT" \
  --label sim --repeat "$REPEAT" > "$OUT/sim.jsonl"
echo "fidelity on replica-sim done, load $(load)" | tee -a "$OUT/times.txt"
kill "$SIM_PID"; wait "$SIM_PID" 2>/dev/null || true; SIM_PID=""

python3 "$ROOT/scripts/sim_fidelity.py" --table "$OUT/vllm.jsonl" "$OUT/sim.jsonl" | tee "$OUT/table.md"
