#!/usr/bin/env bash
# The grid of scripts/pd-sim-sweep.sh on the virtual clock (llmlb fleet-sim,
# h100-8b profile): prefill + decode splits (2P2D, 3P1D, 1P3D, always
# disaggregated, least_tokens) against 4 aggregated replicas under each
# aggregated balancer, long prompts (4,096 tokens, 256 output) at rising
# arrival rates; then a mixed short/long trace through 2P2D, decided per
# request (`auto`) against always disaggregated, each part's TTFT apart.
# Prints one table per part.
#   bash scripts/pd-fleet-sim-sweep.sh
# Knobs: LLMLB (binary), RATES ("1 2 3 4 5 6 7 8"), REQUESTS (400), OUT
# (dir), GOODPUT ("--goodput-ttft 1s --goodput-tpot 20ms"), SPLITS
# ("2,2 3,1 1,3": prefill,decode), AGGREGATED
# ("least_tokens,least_connections,jsq,round_robin").
set -euo pipefail
cd "$(dirname "$0")/.."
LLMLB=${LLMLB:-target/release/llmlb}
RATES=${RATES:-"1 2 3 4 5 6 7 8"}
REQUESTS=${REQUESTS:-400}
GOODPUT=${GOODPUT:-"--goodput-ttft 1s --goodput-tpot 20ms"}
SPLITS=${SPLITS:-"2,2 3,1 1,3"}
AGGREGATED=${AGGREGATED:-"least_tokens,least_connections,jsq,round_robin"}
OUT=${OUT:-$(mktemp -d /tmp/llmlb-pd-fleet.XXXX)}

sim() { # NAME ARGS...
  local name=$1; shift
  # shellcheck disable=SC2086
  "$LLMLB" fleet-sim --profile h100-8b $GOODPUT --out "$OUT/$name.json" "$@" > "$OUT/$name.txt"
}

started=$(date +%s.%N)
for rate in $RATES; do
  long=(--workload random --input-len 4096 --output-len 256 --rate "$rate" --requests "$REQUESTS" --seed 7)
  sim "agg-r$rate" "${long[@]}" --replicas 4 --policies "$AGGREGATED"
  for s in $SPLITS; do
    p=${s%,*}; d=${s#*,}
    sim "${p}p${d}d-r$rate" "${long[@]}" --replicas "$d" --prefill-replicas "$p" \
      --disaggregate always --policies least_tokens
  done
done

# Mixed: short prompts (128 tokens) at 4/s beside long ones (4,096) at
# 1.5/s, 256 output tokens each, as a Mooncake trace (no shared prefix).
python3 - "$OUT/mixed.jsonl" <<'PY'
import json, random, sys
rng = random.Random(11)
rows, block = [], 10**9
for rate, n, tokens in ((4.0, 400, 128), (1.5, 150, 4096)):
    t = 0.0
    for _ in range(n):
        blocks = -(-tokens // 512)
        rows.append((t, tokens, list(range(block, block + blocks))))
        block += blocks
        t += rng.expovariate(rate)
rows.sort(key=lambda r: r[0])
with open(sys.argv[1], "w") as f:
    for t, tokens, ids in rows:
        f.write(json.dumps({"timestamp": int(t * 1000), "input_length": tokens,
                            "output_length": 256, "hash_ids": ids}) + "\n")
PY
for when in always auto; do
  sim "mixed-$when" --trace "$OUT/mixed.jsonl" --replicas 2 --prefill-replicas 2 \
    --disaggregate "$when" --policies least_tokens --requests-out "$OUT/mixed-$when.csv"
done
ended=$(date +%s.%N)

python3 - "$OUT" "$RATES" "$SPLITS" "$started" "$ended" <<'PY'
import csv, json, sys
out, rates, splits = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
ms = lambda s: round(s * 1000, 1)
def row(name, r):
    return (f"| {name} | {ms(r['ttft_s']['p50'])} | {ms(r['ttft_s']['p99'])} | "
            f"{ms(r['itl_s']['p50'])} | {ms(r['itl_s']['p99'])} | {r['goodput_rps']:.2f} |")
print("| rate | run | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | goodput/s |")
print("|---|---|---|---|---|---|---|")
for rate in rates:
    agg = json.load(open(f"{out}/agg-r{rate}.json"))["runs"]
    best = max(agg, key=lambda r: (r["goodput_rps"], -r["itl_s"]["p99"]))
    print(f"| {rate} " + row(f"4 aggregated, best ({best['policy']})", best))
    low = min(agg, key=lambda r: r["itl_s"]["p99"])
    if low is not best:
        print(f"| {rate} " + row(f"4 aggregated, lowest ITL p99 ({low['policy']})", low))
    for s in splits:
        p, d = s.split(",")
        r = json.load(open(f"{out}/{p}p{d}d-r{rate}.json"))["runs"][0]
        print(f"| {rate} " + row(f"{p}P{d}D", r))
print()
print("| mixed | part | TTFT p50 ms | TTFT p99 ms | requests | decisions |")
print("|---|---|---|---|---|---|")
for when in ("always", "auto"):
    run = json.load(open(f"{out}/mixed-{when}.json"))["runs"][0]
    parts = {}
    for line in csv.DictReader(open(f"{out}/mixed-{when}.csv")):
        if line["ttft_s"]:
            parts.setdefault(int(line["prompt_tokens"]) < 1000, []).append(float(line["ttft_s"]))
    for short, v in sorted(parts.items(), reverse=True):
        v.sort()
        q = lambda p: v[min(len(v) - 1, int(p / 100 * len(v)))]
        print(f"| {when} | {'short' if short else 'long'} | {ms(q(50))} | {ms(q(99))} | {len(v)} | "
              f"{run['split']['decisions']} |")
    print(f"| {when} | all: ITL p99 {ms(run['itl_s']['p99'])} ms, goodput {run['goodput_rps']:.2f}/s | | | | |")
print(f"\nwall time {float(sys.argv[5]) - float(sys.argv[4]):.1f} s; results in {out}")
PY
