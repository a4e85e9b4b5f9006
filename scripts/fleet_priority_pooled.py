#!/usr/bin/env python3
"""Pools the requests of `scripts/fleet-priority-lab.sh` runs kept with
`KEEP=DIR`: per tier, every answered request's TTFT through three
instances with `[fleet]` (files TIER-3-1-SEED.json) against one instance
(TIER-1-0-SEED.json), over the seeds both have; p50 and p99 of all of
them, the ratio, and each seed's own p99 ratio.

usage: scripts/fleet_priority_pooled.py DIR [DIR ...]
Only the standard library.
"""
import glob
import json
import os
import sys


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = q * (len(xs) - 1)
    i = int(k)
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (k - i)


def answered(path):
    with open(path) as f:
        report = json.load(f)
    return [r["ttft_ms"] for r in report["requests"]
            if r["outcome"]["kind"] == "ok" and r.get("ttft_ms") is not None]


def seeds_of(d, tier, run):
    return {int(p.rsplit("-", 1)[1][:-len(".json")]) for p in glob.glob(f"{d}/{tier}-{run}-*.json")}


def main(dirs):
    for d in dirs:
        for tier in ("paid", "free"):
            seeds = sorted(seeds_of(d, tier, "3-1") & seeds_of(d, tier, "1-0"))
            three, one, per_seed = [], [], []
            for s in seeds:
                a, b = answered(f"{d}/{tier}-3-1-{s}.json"), answered(f"{d}/{tier}-1-0-{s}.json")
                three += a
                one += b
                per_seed.append(round(quantile(a, 0.99) / quantile(b, 0.99), 2))
            if not seeds:
                continue
            print(f"{os.path.basename(os.path.normpath(d))} {tier}: seeds {seeds[0]}..{seeds[-1]} ({len(seeds)})")
            print(f"  one:   n={len(one)} p50={quantile(one, 0.5):.0f} ms p99={quantile(one, 0.99):.0f} ms")
            print(f"  three: n={len(three)} p50={quantile(three, 0.5):.0f} ms p99={quantile(three, 0.99):.0f} ms")
            print(f"  pooled p99 three/one = {quantile(three, 0.99) / quantile(one, 0.99):.2f}; per seed {per_seed}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
