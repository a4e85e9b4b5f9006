#!/usr/bin/env python3
"""Run one small, bounded workload against an OpenAI-compatible replica on
127.0.0.1 (a real vLLM or `llmlb replica-sim`) and print what it measured.

Prompts are sent as token ids (`/v1/completions` accepts a list of ids), so
vLLM and the simulator see exactly the same prompt lengths and shared
prefixes whatever their tokenizers. Three scenarios, each at several
concurrency levels:

  identical  every request sends the same prompt
  shared     a shared "system prompt" prefix, then a distinct tail
  distinct   nothing shared

Per run: TTFT and inter-token latency (mean / p50 / p99, client-side, from
SSE chunk arrival), output-token throughput, and from the replica's own
/metrics (deltas over the run): the prefix-cache hit rate (hits / queries),
preemptions, and the server-side mean TTFT and inter-token latency.

Usage:
  scripts/sim_fidelity.py --url http://127.0.0.1:18000 --model tiny-llama --label vllm > vllm.jsonl
  scripts/sim_fidelity.py --url http://127.0.0.1:18100 --model tiny-llama --label sim  > sim.jsonl
  scripts/sim_fidelity.py --table vllm.jsonl sim.jsonl
  (--repeat N runs every cell N times; the table gives each cell's median)
  scripts/sim_fidelity.py --url ... --calibrate      # step-time probes for a profile
  scripts/sim_fidelity.py --fit calibration.jsonl    # cost constants fitted to the probes

Only the standard library; every loop is bounded in count and time.
"""
import argparse
import http.client
import json
import os
import queue
import random
import statistics
import sys
import threading
import time
import urllib.parse

VOCAB = 4000          # token ids stay below the tiny model's vocabulary (4096)
TIMEOUT = 120         # seconds, per request


def metrics(url):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("vllm:"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                    "vllm:num_preemptions_total", "vllm:generation_tokens_total",
                    "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                    "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def group_cpu(pgid):
    """CPU seconds (user + system) of each process in process group `pgid`,
    by its name (vLLM's API server, EngineCore, workers), from /proc."""
    out = {}
    if not pgid:
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            name = open(f"/proc/{d}/comm").read().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) != pgid:
            continue
        out[f"{name}/{d}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def one_request(url, model, prompt, max_tokens, result, pool=None):
    """One streamed completion. With `pool` (a queue of connections), the
    request reuses a kept-alive connection, as a proxy in front of the
    replica would; without, it opens a connection of its own."""
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True, "temperature": 0})
    t0 = time.perf_counter()
    stamps = []
    usage = None
    c = None
    try:
        c = pool.get() if pool else None
        if c is None:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            result.update(error=f"HTTP {r.status}: {r.read()[:200]!r}")
            return
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            # One chunk per engine step that produced a token, its text
            # empty or not: a random-weight model's tokens often detokenize
            # to nothing until a later one completes the character, and
            # vLLM still streams a chunk (with empty text) for each.
            if any(ch.get("text") is not None for ch in ev.get("choices", [])):
                stamps.append(time.perf_counter())
        if pool:
            r.read()  # the end of the chunked body, so the connection is reusable
            pool.put(c)
        else:
            c.close()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        result.update(error=repr(e))
        if pool:
            if c is not None:
                c.close()
            pool.put(None)
        return
    result.update(t0=t0, stamps=stamps, usage=usage, end=time.perf_counter())


def prompts(scenario, n, length, salt, rng):
    shared_len = length * 3 // 4
    head = [salt % VOCAB] + [rng.randrange(1, VOCAB) for _ in range(length - 1)]
    out = []
    for i in range(n):
        if scenario == "identical":
            out.append(list(head))
        elif scenario == "shared":
            tail = [rng.randrange(1, VOCAB) for _ in range(length - shared_len)]
            out.append(head[:shared_len] + tail)
        else:
            out.append([(salt + i + 1) % VOCAB] + [rng.randrange(1, VOCAB) for _ in range(length - 1)])
    return out


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(url, model, scenario, concurrency, n, length, max_tokens, salt, seed, pgid=None,
        keep_alive=False):
    rng = random.Random(seed)
    ps = prompts(scenario, n, length, salt, rng)
    before = metrics(url)
    cpu_before = group_cpu(pgid)
    own_before = os.times()
    results = [dict() for _ in ps]
    sem = threading.Semaphore(concurrency)
    pool = None
    if keep_alive:
        pool = queue.Queue()
        for _ in range(concurrency):
            pool.put(None)  # opened on first use

    def worker(i):
        with sem:
            one_request(url, model, ps[i], max_tokens, results[i], pool)

    t_start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    wall = time.perf_counter() - t_start
    cpu_after = group_cpu(pgid)
    own_after = os.times()
    after = metrics(url)
    ok = [r for r in results if "stamps" in r and r["stamps"]]
    errors = [r["error"] for r in results if "error" in r]
    ttft = [r["stamps"][0] - r["t0"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    out_tokens = sum(len(r["stamps"]) for r in ok)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    q = d.get("vllm:prefix_cache_queries_total", 0)

    def server_mean(base):
        n = d.get(base + "_count", 0)
        return 1000 * d.get(base + "_sum", 0) / n if n else None

    return {
        "scenario": scenario, "concurrency": concurrency, "requests": n, "ok": len(ok),
        "errors": errors[:3], "prompt_len": length, "max_tokens": max_tokens,
        "ttft_mean_ms": 1000 * statistics.fmean(ttft) if ttft else None,
        "ttft_p50_ms": 1000 * pct(ttft, 0.5), "ttft_p99_ms": 1000 * pct(ttft, 0.99),
        "itl_mean_ms": 1000 * statistics.fmean(itl) if itl else None,
        "itl_p50_ms": 1000 * pct(itl, 0.5), "itl_p99_ms": 1000 * pct(itl, 0.99),
        "throughput_tok_s": out_tokens / wall, "wall_s": wall,
        "server_ttft_mean_ms": server_mean("vllm:time_to_first_token_seconds"),
        "server_itl_mean_ms": server_mean("vllm:inter_token_latency_seconds"),
        "prefix_hit_rate": (d.get("vllm:prefix_cache_hits_total", 0) / q) if q else None,
        "preemptions": d.get("vllm:num_preemptions_total", 0),
        # Per request, in start order: sent, first token and last token, in
        # ms from the run's start (for a look at a cell's timeline).
        "timeline": [[round(1000 * (r["t0"] - t_start), 2),
                      round(1000 * (r["stamps"][0] - t_start), 2),
                      round(1000 * (r["stamps"][-1] - t_start), 2)]
                     for r in sorted(ok, key=lambda r: r["t0"])],
        # CPU ms of each process of the replica's process group (--cpu-group).
        "client_cpu_ms": round(1000 * (own_after.user + own_after.system
                                       - own_before.user - own_before.system), 1),
        "cpu_ms": {k: round(1000 * (v - cpu_before.get(k, 0)), 1)
                   for k, v in cpu_after.items() if v - cpu_before.get(k, 0) > 0},
    }


# The targets the simulator is held to against a real replica: within 20 %
# for these, within a factor 1.5 for preemptions (with a floor of 2, so that
# 0 against 1 is no miss).
WITHIN_20 = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "throughput_tok_s")


def outside(key, real, sim):
    if real is None or sim is None:
        return False
    if key in WITHIN_20:
        return abs(sim - real) > 0.2 * real
    if key == "preemptions":
        return max(real, sim) > 2 and max(real, sim) > 1.5 * min(real, sim)
    return False


def table(files):
    rows = {}
    labels = []
    runs = {}
    for f in files:
        lines = [json.loads(line) for line in open(f)]
        label = lines[0].get("label", f) if lines else f
        if label in labels:  # two runs of one replica: tell them by file
            label = f"{label} ({f})"
        for r in lines:
            runs.setdefault((r["scenario"], r["concurrency"], label), []).append(r)
        labels.append(label)
    # With --repeat, each cell's figure is the median over its runs.
    for (sc, conc, label), rs in runs.items():
        merged = {}
        for key in {k for r in rs for k in r}:
            vals = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
            merged[key] = statistics.median(vals) if vals else rs[0].get(key)
        rows.setdefault((sc, conc), {})[label] = merged
    repeats = max(len(rs) for rs in runs.values())
    if repeats > 1:
        print(f"Each figure is the median over {repeats} runs of its cell.\n")
    latency = [("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"),
               ("server TTFT mean", "server_ttft_mean_ms"),
               ("ITL p50", "itl_p50_ms"), ("ITL p99", "itl_p99_ms"),
               ("server ITL mean", "server_itl_mean_ms")]
    volume = [("prefix hit %", "prefix_hit_rate"), ("output tok/s", "throughput_tok_s"),
              ("preemptions", "preemptions")]
    misses = []
    cols_names = [(k, n) for n, k in latency + volume]
    for title, cols in (("Latency, milliseconds", latency), ("Cache and throughput", volume)):
        print(f"{title} ({' / '.join(labels)} in each cell):\n")
        print("| scenario | concurrency | " + " | ".join(c for c, _ in cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for (sc, conc), by in sorted(rows.items()):
            cells = []
            for _, key in cols:
                vals = []
                for l in labels:
                    v = by.get(l, {}).get(key)
                    if v is None:
                        vals.append("-")
                    elif key == "prefix_hit_rate":
                        vals.append(f"{100 * v:.0f}")
                    elif key in ("preemptions", "throughput_tok_s"):
                        vals.append(f"{v:.0f}")
                    else:
                        vals.append(f"{v:.1f}")
                cell = " / ".join(vals)
                if len(labels) == 2 and outside(key, *(by.get(l, {}).get(key) for l in labels)):
                    cell = f"**{cell}**"
                    misses.append(f"{sc} at {conc}: {dict(cols_names)[key]} {cell.strip('*')}")
                cells.append(cell)
            print(f"| {sc} | {conc} | " + " | ".join(cells) + " |")
        print()
    if len(labels) == 2:
        cells = [(by, key) for by in rows.values() for key in WITHIN_20]
        within = sum(1 for by, key in cells
                     if not outside(key, *(by.get(l, {}).get(key) for l in labels)))
        print(f"Within 20 %: {within} of {len(cells)} cells (TTFT p50 and p99, ITL p50, "
              "output tok/s).\n")
        print(f"Outside the targets (bold above): {len(misses)} cells" + (":" if misses else "."))
        for m in misses:
            print(f"- {m}")


def solve(rows):
    """Least squares for a small dense system: rows of (x..., y)."""
    n = len(rows[0]) - 1
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    aty = [sum(r[i] * r[n] for r in rows) for i in range(n)]
    for c in range(n):  # Gaussian elimination with partial pivoting
        p = max(range(c, n), key=lambda k: abs(ata[k][c]))
        ata[c], ata[p], aty[c], aty[p] = ata[p], ata[c], aty[p], aty[c]
        for k in range(c + 1, n):
            f = ata[k][c] / ata[c][c]
            ata[k] = [x - f * y for x, y in zip(ata[k], ata[c])]
            aty[k] -= f * aty[c]
    x = [0.0] * n
    for c in reversed(range(n)):
        x[c] = (aty[c] - sum(ata[c][k] * x[k] for k in range(c + 1, n))) / ata[c][c]
    return x


def fit(path, per_context_token, max_num_seqs):
    """Cost constants from `--calibrate` probes (seconds), printed as a [cost] table.

    - decode probes (short and long contexts): client median inter-token
      latency against batch size B and context, fitted as step_overhead +
      decode_per_seq B + per_context_token B (prompt + output / 2) (without
      long-context probes per_context_token is kept as given);
    - prefill probes: the server's mean time to first token against prompt
      length L, fitted as a + b L + c L(L+1)/2 (c: prefill_attention);
    - the requests probe: wall time per one-token request at concurrency 32
      minus the engine's share of it (its steps hold up to max_num_seqs
      requests) is the API server's per-request work.
    """
    probes = [json.loads(line) for line in open(path)]
    by = lambda kind: [p for p in probes if p.get("probe") == kind and p.get("ok")]
    dec = by("decode")
    # Context attended per step: the batch times the mean context (the prompt
    # plus half the output). With long-context probes it is fitted too.
    ctx = lambda p: p["concurrency"] * (p["prompt_len"] + p["max_tokens"] / 2)
    dec += by("decode-long")
    if by("decode-long"):
        step, per_seq, per_context_token = solve(
            [(1.0, p["concurrency"], ctx(p), p["itl_p50_ms"] / 1000) for p in dec])
        per_context_token = max(per_context_token, 0.0)
    else:
        step, per_seq = solve([(1.0, p["concurrency"], p["itl_p50_ms"] / 1000
                                - per_context_token * ctx(p)) for p in dec])
    pre = by("prefill")
    a, b, c = solve([(1.0, p["prompt_len"], p["prompt_len"] * (p["prompt_len"] + 1) / 2,
                      p["server_ttft_mean_ms"] / 1000) for p in pre])
    c = max(c, 0.0)
    prefill_per_token = max(b - per_context_token, 0.0)
    api_req = 0.0
    for p in by("requests"):
        k = min(p["concurrency"], max_num_seqs)
        L = p["prompt_len"]
        engine = (step + max(a - step, 0.0) + k * L * b + c * k * L * (L + 1) / 2) / k
        api_req = max(p["wall_s"] / p["ok"] - engine, 0.0)
    prefill_overhead = max(a - step, 0.0)  # a lone request meets an idle engine: no front-end queue
    print(f"# fitted from {path}: {len(dec)} decode, {len(pre)} prefill probes")
    for l in sorted({p["prompt_len"] for p in pre}):
        got = [p["server_ttft_mean_ms"] for p in pre if p["prompt_len"] == l][0]
        model = 1000 * (a + b * l + c * l * (l + 1) / 2)
        print(f"#   server TTFT at {l} tokens: {got:.2f} ms measured, {model:.2f} ms fitted")
    print("[cost]")
    for k, v in [("step_overhead", step), ("prefill_overhead", prefill_overhead),
                 ("prefill_per_token", prefill_per_token), ("decode_per_seq", per_seq),
                 ("per_context_token", per_context_token), ("prefill_attention", c),
                 ("api_per_request", api_req), ("api_per_output_token", 0.0)]:
        print(f"{k} = {v:.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--label", default="replica")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--scenarios", default="identical,shared,distinct")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--table", nargs="+")
    ap.add_argument("--fit", metavar="CALIBRATION_JSONL")
    ap.add_argument("--per-context-token", type=float, default=5e-8,
                    help="kept by --fit when the probes hold no long-context decode")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--keep-alive", action="store_true",
                    help="reuse one connection per concurrent client (as a proxy does) "
                         "instead of a new connection per request")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every cell this many times; --table reports each cell's median")
    ap.add_argument("--cpu-group", type=int, default=0,
                    help="process group whose processes' CPU time each run reports (cpu_ms)")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    if a.fit:
        fit(a.fit, a.per_context_token, a.max_num_seqs)
        return
    u = urllib.parse.urlparse(a.url or "")
    if u.hostname not in ("127.0.0.1", "localhost"):
        sys.exit("only 127.0.0.1 targets are allowed")
    salt = 1000
    if a.calibrate:
        # Prefill: lone distinct prompts of growing length, 2 output tokens.
        for length in (16, 128, 256, 512, 1024, 1536):
            r = run(a.url, a.model, "distinct", 1, 12, length, 2, salt, a.seed)
            salt += 50
            r.update(label=a.label, probe="prefill")
            print(json.dumps(r), flush=True)
        # Decode: batches of growing size, short prompts, long outputs.
        for conc in (1, 4, 16, 32):
            r = run(a.url, a.model, "distinct", conc, conc * 3, 16, 96, salt, a.seed)
            salt += 100
            r.update(label=a.label, probe="decode")
            print(json.dumps(r), flush=True)
        # Request handling: many one-token requests with short prompts, so the
        # engine's share is small and the API server's per-request work shows.
        r = run(a.url, a.model, "distinct", 32, 160, 16, 1, salt, a.seed)
        salt += 200
        r.update(label=a.label, probe="requests")
        print(json.dumps(r), flush=True)
        # Decode over long contexts.
        for conc in (1, 8):
            r = run(a.url, a.model, "distinct", conc, conc * 3, 1024, 64, salt, a.seed)
            salt += 100
            r.update(label=a.label, probe="decode-long")
            print(json.dumps(r), flush=True)
        return
    # Repeats go round all the cells, so that a slow spell of the machine
    # falls on different cells each time.
    for repeat in range(a.repeat):
        for scenario in a.scenarios.split(","):
            for conc in (int(c) for c in a.concurrency.split(",")):
                n = {1: 16}.get(conc, 4 * conc)
                r = run(a.url, a.model, scenario, conc, n, a.prompt_len, a.max_tokens, salt,
                        a.seed + conc + 1000 * repeat, a.cpu_group, a.keep_alive)
                r["keep_alive"] = a.keep_alive
                salt += 137
                r["label"] = a.label
                r["repeat"] = repeat
                print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
