#!/usr/bin/env bash
# A cost-model change judged on the virtual clock (`llmlb fleet-sim`) across
# the cases where cache-aware routing is known to be fragile: the
# shared-prefix workload at and past saturation with default and small KV
# caches, a skewed trace, and slices of the conversation trace. Every case
# runs under five seeds with 2 ms of arrival jitter, because single runs
# near saturation swing by tens of percent from one seed to the next; the
# line per case is the mean over the seeds.
#
# usage: scripts/virtual_clock_suite.sh LLMLB_BINARY CONFIG [POLICY]
#   CONFIG  an llmlb config whose pool serves model "m" (its replicas are
#           resized by --replicas; the addresses are never contacted)
#   POLICY  as `llmlb fleet-sim --policies` takes it (default: config)
# prints: case, mean goodput (requests/s with TTFT <= 2 s), mean prefix
# hit %, mean and worst busiest/mean replica load.
set -euo pipefail
BIN=${1:?llmlb binary}
CONFIG=${2:?config file}
POLICY=${3:-config}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRACE=$ROOT/../shared/traces/conversation_trace.jsonl
WORK=${SUITE_DIR:-${TMPDIR:-/tmp}/llmlb-vc-suite}
mkdir -p "$WORK"
[[ -s $WORK/skew-120.jsonl ]] || python3 "$ROOT/scripts/skewed_trace.py" --rate 120 >"$WORK/skew-120.jsonl"

SP=(--workload shared-prefix --groups 32 --prompts-per-group 8 --system-len 1536
    --question-len 64 --output-len 64 --requests 256 --replicas 4 --profile h100-8b)
TR=(--trace "$TRACE" --length-scale 0.05 --profile h100-8b --num-blocks 2048 --max-model-len 32752)

case_line() {
    local name=$1
    shift
    for seed in 1 2 3 4 5; do
        "$BIN" fleet-sim "$@" --config "$CONFIG" --model m --policies "$POLICY" \
            --seed "$seed" --arrival-jitter 2ms 2>/dev/null |
            awk 'NR > 2 && $2 ~ /^[0-9]+$/ && $3 ~ /s$/ { print; exit }'
    done | awk -v n="$name" '{ g += $9; h += $10; m += $11; if ($11 > w) w = $11; c++ }
        END { printf "%-10s goodput %6.2f  hit %5.1f  busiest/mean %4.2f (worst %4.2f)\n", n, g / c, h / c, m / c, w }'
}

for rate in 64 80; do
    case_line "sp-$rate" "${SP[@]}" --num-blocks 2048 --max-model-len 32752 --rate "$rate"
done
for blocks in 1024 768; do
    for rate in 32 64; do
        case_line "nb$blocks-$rate" "${SP[@]}" --num-blocks "$blocks" --max-model-len 12000 --rate "$rate"
    done
done
case_line skew-120 --trace "$WORK/skew-120.jsonl" --replicas 8 --profile h100-8b
case_line t4-20 "${TR[@]}" --replicas 4 --max-requests 256 --rate-scale 20
case_line t8-20 "${TR[@]}" --replicas 8 --max-requests 512 --rate-scale 40
case_line t4-40 "${TR[@]}" --replicas 4 --max-requests 256 --rate-scale 40
case_line t8-40 "${TR[@]}" --replicas 8 --max-requests 512 --rate-scale 80
