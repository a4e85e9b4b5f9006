#!/usr/bin/env python3
"""Per-request breakdown of `llmlb fleet-sim --requests-out FILE`: per
policy, the TTFT p99, the busiest replica over the mean (by requests and by
prompt tokens), the cached prompt tokens llmlb predicted against those the
replicas found (total, and requests predicted to find at least half their
prompt that found none), and, with `--above S`, the requests slower than S
seconds per replica with their mean prompt length.

usage: scripts/sim_requests.py REQS.csv [--above 1.35]
Only the standard library.
"""
import argparse
import collections
import csv


def p99(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--above", type=float)
    args = ap.parse_args()
    by_policy = collections.defaultdict(list)
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            by_policy[r["policy"]].append(r)
    for policy, rows in by_policy.items():
        ttft = [float(r["ttft_s"]) for r in rows if r["ttft_s"]]
        count = collections.Counter(r["replica"] for r in rows)
        tokens = collections.Counter()
        for r in rows:
            tokens[r["replica"]] += int(r["prompt_tokens"])
        done = [r for r in rows if r["cached"]]
        found = sum(int(r["cached"]) for r in done)
        predicted = sum(int(r["predicted_cached"] or 0) for r in done)
        lost = sum(1 for r in done if int(r["predicted_cached"] or 0) * 2 >= int(r["prompt_tokens"])
                   and int(r["cached"]) == 0)
        busiest = max(count.values()) * len(count) / len(rows)
        busiest_tokens = max(tokens.values()) * len(tokens) / sum(tokens.values())
        ratio = f"{predicted / found:.2f}" if found else "-"
        print(f"{policy}: {len(rows)} requests, TTFT p99 {p99(ttft):.2f} s; busiest/mean "
              f"{busiest:.2f} by requests, {busiest_tokens:.2f} by prompt tokens; cached tokens "
              f"predicted/found {ratio}; predicted a hit and found nothing: {lost}")
        if args.above is not None:
            slow = [r for r in rows if r["ttft_s"] and float(r["ttft_s"]) > args.above]
            per = dict(sorted(collections.Counter(r["replica"] for r in slow).items()))
            mean = sum(int(r["prompt_tokens"]) for r in slow) / max(1, len(slow))
            print(f"  above {args.above:g} s: {len(slow)} (per replica {per}), "
                  f"mean prompt {mean:.0f} tokens")


if __name__ == "__main__":
    main()
