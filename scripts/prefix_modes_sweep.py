#!/usr/bin/env python3
"""`exact` against `cache` (and any other policies) on the virtual clock,
at arrival rates from below to far above the fleet's saturation, on the
conversation trace and on a shared-prefix workload: one `llmlb fleet-sim`
run per workload and rate (every policy on the same arrivals), then one
table per workload with each policy's prefix hits and TTFT p50 / p99, and
per rate whether the first policy's hits are at least the second's and its
p99 at most the second's.

Saturation is given, not searched: `--trace-saturation` (a `--rate-scale`
of the trace) and `--shared-saturation` (requests/s); `--find-saturation`
prints, per workload, round-robin's completed requests/s at doubling rates
so the knee can be read off (where it stops growing with the rate).

usage (from the repository root, after `cargo build --release`; `--config FILE`
simulates that llmlb config's pool, e.g. with `[pools.prefix] homes = true`):
  scripts/prefix_modes_sweep.py --find-saturation
  scripts/prefix_modes_sweep.py --trace-saturation 6 --shared-saturation 16 \\
      --multiples 0.5,1,2,4 --seeds 1,2,3
Only the standard library.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "..", "shared", "traces", "conversation_trace.jsonl")


def fleet_sim(args, workload, rate, policies, seed):
    cmd = [args.llmlb, "fleet-sim", "--replicas", str(args.replicas), "--profile", args.profile,
           "--num-blocks", str(args.num_blocks), "--max-model-len", str((args.num_blocks - 1) * 16),
           "--policies", policies, "--seed", str(seed), "--jobs", "1"]
    if args.config:
        cmd += ["--config", args.config]
    if args.arrival_jitter:
        cmd += ["--arrival-jitter", args.arrival_jitter]
    if workload == "trace":
        cmd += ["--trace", args.trace, "--length-scale", str(args.length_scale),
                "--max-requests", str(args.trace_requests), "--rate-scale", str(rate)]
    else:
        cmd += ["--workload", "shared-prefix", "--groups", str(args.groups),
                "--prompts-per-group", str(args.per_group), "--system-len", str(args.system_len),
                "--question-len", "64", "--output-len", "64", "--rate", str(rate),
                "--requests", str(args.groups * args.per_group)]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(cmd + ["--out", out.name], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, RUST_LOG="error"))
        with open(out.name) as f:
            return json.load(f)["runs"]


def rows_of(runs):
    return {r["policy"]: r for r in runs}


def find_saturation(args):
    for workload, start in (("trace", args.trace_probe), ("shared-prefix", args.shared_probe)):
        print(f"\n{workload}: round_robin, arrival rate → completed requests/s, TTFT p99")
        rate = start
        for _ in range(args.probe_steps):
            r = rows_of(fleet_sim(args, workload, rate, "round_robin", args.seeds[0]))["round_robin"]
            print(f"  {rate:g}: {r['outcomes']['completed'] / r['duration_s']:.2f} req/s, "
                  f"p99 {r['ttft_s']['p99']:.2f} s")
            rate *= 2


def sweep(args):
    policies = args.policies.split(",")
    a, b = policies[0], policies[1]
    verdict = True
    for workload, sat in (("trace", args.trace_saturation), ("shared-prefix", args.shared_saturation)):
        if sat is None:
            continue
        print(f"\n### {workload} (saturation {sat:g}; seeds {','.join(map(str, args.seeds))}, "
              f"means over seeds)\n")
        print("| × saturation | policy | prefix hits | TTFT p50 s | TTFT p99 s |")
        print("|---|---|---|---|---|")
        checks = []
        for m in args.multiples:
            acc = {p: [0.0, 0.0, 0.0] for p in policies}
            # Seeds in which the first policy had at least the second's hits,
            # and at most its p99: how the means' verdict holds run by run.
            hits_won = p99_won = 0
            for seed in args.seeds:
                got = rows_of(fleet_sim(args, workload, sat * m, ",".join(policies), seed))
                hits_won += got[a]["prefix_hit_rate"] >= got[b]["prefix_hit_rate"]
                p99_won += got[a]["ttft_s"]["p99"] <= got[b]["ttft_s"]["p99"]
                for p in policies:
                    r = got[p]
                    acc[p][0] += r["prefix_hit_rate"] / len(args.seeds)
                    acc[p][1] += r["ttft_s"]["p50"] / len(args.seeds)
                    acc[p][2] += r["ttft_s"]["p99"] / len(args.seeds)
            for p in policies:
                h, p50, p99 = acc[p]
                print(f"| {m:g} | {p} | {100 * h:.1f} % | {p50:.2f} | {p99:.2f} |", flush=True)
            ok = acc[a][0] >= acc[b][0] and acc[a][2] <= acc[b][2]
            verdict &= ok
            checks.append(f"{m:g}×: {a} hits {100 * acc[a][0]:.1f} vs {100 * acc[b][0]:.1f} %, "
                          f"p99 {acc[a][2]:.2f} vs {acc[b][2]:.2f} s: {'holds' if ok else 'does not hold'} "
                          f"(seeds: hits at least in {hits_won}, p99 at most in {p99_won}, "
                          f"of {len(args.seeds)})")
        print("\n" + "\n".join(checks))
    return verdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmlb", default=os.path.join(ROOT, "target", "release", "llmlb"))
    ap.add_argument("--policies", default="exact,cache,round_robin",
                    help="the first two are compared")
    ap.add_argument("--config", help="an llmlb config whose pool is simulated (its prefix "
                    "settings other than the mode apply to every prefix policy)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--profile", default="h100-8b")
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--length-scale", type=float, default=0.05)
    ap.add_argument("--trace-requests", type=int, default=2048)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=1536)
    ap.add_argument("--trace-saturation", type=float)
    ap.add_argument("--shared-saturation", type=float)
    ap.add_argument("--multiples", default="0.5,1,2,4")
    ap.add_argument("--seeds", default="1", help="comma-separated, or a range such as 1-16")
    ap.add_argument("--arrival-jitter", default=None,
                    help="fleet-sim's --arrival-jitter (e.g. 20ms): the seed then sets the "
                         "trace's arrivals too, so seeds give a spread")
    ap.add_argument("--find-saturation", action="store_true")
    ap.add_argument("--trace-probe", type=float, default=1.0)
    ap.add_argument("--shared-probe", type=float, default=4.0)
    ap.add_argument("--probe-steps", type=int, default=6)
    args = ap.parse_args()
    args.multiples = [float(m) for m in args.multiples.split(",")]
    if "-" in args.seeds:
        first, last = args.seeds.split("-")
        args.seeds = list(range(int(first), int(last) + 1))
    else:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    if not os.path.exists(args.llmlb):
        sys.exit(f"{args.llmlb} not found: run `cargo build --release` first")
    if args.find_saturation:
        find_saturation(args)
        return
    sys.exit(0 if sweep(args) else 1)


if __name__ == "__main__":
    main()
