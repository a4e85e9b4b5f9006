#!/usr/bin/env python3
"""Why the slowest requests waited, from a `real_vllm_check.py --runs-json`
file: for every request whose TTFT is above round-robin's p99 of the same
round, what was ahead of it on the replica it was sent to when it was sent.

Per request (from `llmlb bench`'s record of it and the x-llmlb-replica
header): the requests in flight on its replica at its send, how many of them
had not yet produced a first token (their prefill was ahead of it, or
running) and their prompt tokens, and the same counts on the other replica.
Per run: the replicas' preemptions (vLLM's counter over the run).

usage: scripts/tail_breakdown.py RUNS_JSON [--backend vllm]
prints one table of the tail requests per policy, then a summary line per
policy: tail requests, how many were sent to the busier replica, mean
prefills ahead on theirs and on the other, preemptions in those runs.
"""
import argparse
import json


def percentile(values, p):
    """Linear interpolation between closest ranks, as `llmlb bench` does."""
    v = sorted(values)
    if not v:
        return None
    rank = p / 100 * (len(v) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def ahead(reqs, me, replica):
    """Requests on `replica` in flight when `me` was sent, and of those the
    ones still before their first token, with their prompt tokens."""
    t = me["start_ms"]
    flight = [r for r in reqs if r is not me and r.get("replica") == replica
              and r["start_ms"] <= t < r["start_ms"] + r["e2e_ms"]]
    pre = [r for r in flight if r.get("ttft_ms") is None or r["start_ms"] + r["ttft_ms"] > t]
    return len(flight), len(pre), sum(r.get("input_tokens") or 0 for r in pre)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs_json")
    ap.add_argument("--backend", default="vllm")
    args = ap.parse_args()
    with open(args.runs_json) as f:
        runs = json.load(f)[args.backend]
    rr = {r["round"]: percentile([q["ttft_ms"] for q in r["requests"] if q.get("ttft_ms")], 99)
          for r in runs if r["policy"] == "round_robin"}
    summary = {}
    print("| policy | round | TTFT ms | prompt | replica | in flight there / other | "
          "before first token there / other | their prompt tokens there / other |")
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        bound = rr.get(run["round"])
        if bound is None:
            continue
        reqs = [q for q in run["requests"] if q.get("replica")]
        names = sorted({q["replica"] for q in reqs})
        s = summary.setdefault(run["policy"], {"tail": 0, "busier": 0, "pre_own": 0, "pre_other": 0,
                                               "preempt": 0, "runs": 0, "requests": 0})
        s["runs"] += 1
        s["requests"] += len(run["requests"])
        s["preempt"] += run.get("preemptions", 0)
        for q in sorted(reqs, key=lambda q: -(q.get("ttft_ms") or 0)):
            if (q.get("ttft_ms") or 0) <= bound:
                continue
            other = next((n for n in names if n != q["replica"]), None)
            own = ahead(reqs, q, q["replica"])
            alt = ahead(reqs, q, other) if other else (0, 0, 0)
            s["tail"] += 1
            s["busier"] += own[0] > alt[0]
            s["pre_own"] += own[1]
            s["pre_other"] += alt[1]
            print(f"| {run['policy']} | {run['round'] + 1} | {q['ttft_ms']:.0f} | {q.get('input_tokens')} | "
                  f"{q['replica']} | {own[0]} / {alt[0]} | {own[1]} / {alt[1]} | {own[2]} / {alt[2]} |")
    print()
    print("| policy | runs | requests | above round-robin's p99 | sent to the busier replica | "
          "mean before first token there / other | preemptions |")
    print("|---|---|---|---|---|---|---|")
    for policy, s in summary.items():
        n = s["tail"] or 1
        print(f"| {policy} | {s['runs']} | {s['requests']} | {s['tail']} | {s['busier']} | "
              f"{s['pre_own'] / n:.1f} / {s['pre_other'] / n:.1f} | {s['preempt']:.0f} |")


if __name__ == "__main__":
    main()
