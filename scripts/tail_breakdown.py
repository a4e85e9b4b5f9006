#!/usr/bin/env python3
"""Why the slowest requests waited, from a `real_vllm_check.py --runs-json`
file: for every request whose TTFT is above round-robin's p99 of the same
round, what was ahead of it on the replica it was sent to when it was sent.

Per request (from `llmlb bench`'s record of it and the x-llmlb-replica
header): the requests in flight on its replica at its send, how many of them
had not yet produced a first token (their prefill was ahead of it, or
running) and their prompt tokens, and the same counts on the other replica.
Per run: the replicas' preemptions (vLLM's counter over the run). When the
run has the replicas' sampled load (`samples`, from real_vllm_check.py), also
what the request's replica did while it waited for its first token: its
prefill rate (prompt tokens/s) against its median rate in the run's busy
intervals, the longest stretch in which it had requests and produced no
token (prompt or output; prompt only in runs sampled before the output
counter was), the preemptions it counted and its highest KV-cache usage;
a request whose replica prefilled at under half its busy median meanwhile
counts as waiting on a stalled replica, one whose replica produced nothing
for a second or more as waiting on a frozen one.

usage: scripts/tail_breakdown.py RUNS_JSON [--backend vllm]
prints one table of the tail requests per policy, then a summary line per
policy: tail requests, how many were sent to the busier replica, mean
prefills ahead on theirs and on the other, preemptions in those runs.
"""
import argparse
import json

# A replica with requests that produces no token for this long is frozen
# (its engine or API server not getting the CPU, or stuck).
FROZEN_S = 1.0


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


def busy_median(samples, replica, rows, t, tok, run_, wait):
    """A replica's median prefill rate over the run's busy intervals,
    worked out once per run and replica (kept in `samples`)."""
    known = samples.setdefault("busy_medians", {})
    if replica not in known:
        busy = sorted((rows[i + 1][tok] - rows[i][tok]) / ((rows[i + 1][t] - rows[i][t]) / 1000.0)
                      for i in range(len(rows) - 1)
                      if rows[i][run_] + rows[i][wait] > 0 and rows[i + 1][t] > rows[i][t])
        known[replica] = percentile(busy, 50)
    return known[replica]


def during(samples, replica, begin, end):
    """The replica's prefill rate (tokens/s), preemptions and highest KV
    usage from the last sample at or before `begin` to the first at or after
    `end`, and its median prefill rate over the run's busy intervals; None
    without samples."""
    if not samples:
        return None
    cols = samples["columns"]
    rows = samples["replicas"].get(replica) or []
    if len(rows) < 2:
        return None
    t, tok, pre = cols.index("t_ms"), cols.index("vllm:prompt_tokens_total"), \
        cols.index("vllm:num_preemptions_total")
    run_, wait, kv = cols.index("vllm:num_requests_running"), \
        cols.index("vllm:num_requests_waiting"), cols.index("vllm:kv_cache_usage_perc")
    a = max((i for i, r in enumerate(rows) if r[t] <= begin), default=0)
    b = min((i for i, r in enumerate(rows) if r[t] >= end), default=len(rows) - 1)
    b = max(b, a + 1) if a + 1 < len(rows) else b
    dt = (rows[b][t] - rows[a][t]) / 1000.0
    rate = (rows[b][tok] - rows[a][tok]) / dt if dt > 0 else None
    # The longest stretch in which the replica had requests and produced no
    # token, prompt or output (older runs sampled prompt tokens only).
    counters = [tok]
    if "vllm:generation_tokens_total" in cols:
        counters.append(cols.index("vllm:generation_tokens_total"))
    frozen, since = 0.0, None
    for i in range(a, b + 1):
        busy_now = rows[i][run_] + rows[i][wait] > 0
        moved = i > a and any(rows[i][c] != rows[i - 1][c] for c in counters)
        if moved or not busy_now:
            since = rows[i][t] if busy_now else None
            continue
        since = rows[i][t] if since is None else since
        frozen = max(frozen, (rows[i][t] - since) / 1000.0)
    return {
        "rate": rate,
        "frozen_s": frozen,
        "busy_median": busy_median(samples, replica, rows, t, tok, run_, wait),
        "preemptions": rows[b][pre] - rows[a][pre],
        "kv_max": max(r[kv] for r in rows[a:b + 1]),
    }


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
          "before first token there / other | their prompt tokens there / other | "
          "its replica's prefill tok/s meanwhile (busy median) | longest stretch with no token "
          "there, s | preemptions meanwhile | KV max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        bound = rr.get(run["round"])
        if bound is None:
            continue
        reqs = [q for q in run["requests"] if q.get("replica")]
        names = sorted({q["replica"] for q in reqs})
        s = summary.setdefault(run["policy"], {"tail": 0, "busier": 0, "pre_own": 0, "pre_other": 0,
                                               "preempt": 0, "runs": 0, "requests": 0,
                                               "stalled": 0, "frozen": 0, "sampled": 0})
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
            d = during(run.get("samples"), q["replica"], q["start_ms"], q["start_ms"] + q["ttft_ms"])
            state = "- | - | - | -"
            if d and d["rate"] is not None:
                s["sampled"] += 1
                s["stalled"] += d["rate"] < 0.5 * (d["busy_median"] or 0)
                s["frozen"] += d["frozen_s"] >= FROZEN_S
                state = (f"{d['rate']:.0f} ({d['busy_median'] or 0:.0f}) | {d['frozen_s']:.1f} | "
                         f"{d['preemptions']:.0f} | {100 * d['kv_max']:.0f} %")
            print(f"| {run['policy']} | {run['round'] + 1} | {q['ttft_ms']:.0f} | {q.get('input_tokens')} | "
                  f"{q['replica']} | {own[0]} / {alt[0]} | {own[1]} / {alt[1]} | {own[2]} / {alt[2]} | "
                  f"{state} |")
    print()
    print("| policy | runs | requests | above round-robin's p99 | sent to the busier replica | "
          "mean before first token there / other | preemptions | on a stalled replica | "
          f"on a replica that produced no token for {FROZEN_S:.0f} s or more |")
    print("|---|---|---|---|---|---|---|---|---|")
    for policy, s in summary.items():
        n = s["tail"] or 1
        print(f"| {policy} | {s['runs']} | {s['requests']} | {s['tail']} | {s['busier']} | "
              f"{s['pre_own'] / n:.1f} / {s['pre_other'] / n:.1f} | {s['preempt']:.0f} | "
              f"{s['stalled']} of {s['sampled']} sampled | {s['frozen']} |")


if __name__ == "__main__":
    main()
