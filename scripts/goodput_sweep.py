#!/usr/bin/env python3
"""Goodput curves: the same workload at rising arrival rates, a fresh
simulated fleet per point, through each router; per point the throughput,
TTFT p50 / p99, goodput (requests/s whose TTFT met the objective), the
busiest replica over the mean, and the replicas' own prefix-cache hit rate.

Routers: llmlb's policies (`llmlb-round_robin`, `llmlb-least_connections`,
`llmlb-jsq`, `llmlb-hash`, `llmlb-cache`, ...: a prefix mode name puts that
prefix affinity in front of least_connections; `-replicate` after it turns
on hot-prefix replication; `llmlb-exact` has the fleet publish KV events) and, when installed in the
venv that `scripts/peers.sh` makes (~/.cache/llmlb-peers), the SGLang router
(`sglang-cache_aware`) and the vLLM router (`vllm-router`).

Usage (from the repository root, after `cargo build --release`):
  scripts/goodput_sweep.py --workload shared-prefix --rates 4,8,12,16,24
  scripts/goodput_sweep.py --workload trace --rates 0.05,0.1,0.2 \\
      --routers llmlb-jsq,llmlb-cache,sglang-cache_aware
  scripts/goodput_sweep.py ... --json sweep.json --svg sweep.svg

llmlb runs with its own scrape settings (every 500 ms) unless
`--llmlb-scrape 100ms` (or another interval) says otherwise; the sweeps in
docs/BENCHMARKS.md before 2026-12-02 04:35 UTC used 100 ms.

For the trace workload `--rates` multiply the arrival rate of the trace as
replayed at `--time-scale` (2 = twice as fast). Every run is bounded by a request
count and a duration; every process started is stopped at the end.
Only the standard library.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_VENV = os.environ.get("PEERS_CACHE", os.path.expanduser("~/.cache/llmlb-peers")) + "/venv"
TRACE = os.path.join(ROOT, "..", "shared", "traces", "conversation_trace.jsonl")
PREFIX_MODES = ("hash", "cache", "exact")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def counters(urls):
    """Per replica: prefix-cache queries and hits, finished requests."""
    out = []
    for u in urls:
        c = {"q": 0.0, "h": 0.0, "n": 0.0}
        for line in get(u + "/metrics").splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            key = {"vllm:prefix_cache_queries_total": "q", "vllm:prefix_cache_hits_total": "h",
                   "vllm:request_success_total": "n"}.get(name)
            if key:
                c[key] += float(line.rsplit(" ", 1)[1])
        out.append(c)
    return out


class Procs:
    def __init__(self, tmp):
        self.tmp, self.live = tmp, []

    def start(self, name, cmd):
        f = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.live.append(p)
        return p

    def stop(self, p):
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self):
        for p in list(self.live):
            self.stop(p)


def start_fleet(procs, args, name, events_port=None):
    cmd = [args.llmlb, "replica-sim", "--replicas", str(args.replicas), "--port", "0",
           "--profile", args.profile, "--num-blocks", str(args.num_blocks),
           "--max-model-len", str((args.num_blocks - 1) * 16)]
    if events_port:
        cmd += ["--kv-events-port", str(events_port)]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    p = procs.start("fleet-" + name, cmd)
    logf = os.path.join(procs.tmp, "fleet-" + name + ".log")
    deadline = time.time() + 20
    while time.time() < deadline:
        text = open(logf).read()
        urls = re.findall(r"replica (http://[0-9.:]+)", text)
        if len(urls) >= args.replicas:
            model = re.search(r'model "([^"]*)"', text)
            return p, urls[: args.replicas], model.group(1) if model else "llmlb-sim"
        if p.poll() is not None:
            break
        time.sleep(0.1)
    procs.stop(p)
    raise RuntimeError(f"fleet did not start (see {logf})")


def start_router(procs, args, router, urls, model, name, events_port=None):
    port = free_port()
    if router.startswith("llmlb-"):
        policy = router[len("llmlb-"):]
        replicate = policy.endswith("-replicate")
        policy = policy.removesuffix("-replicate")
        lines = ["[server]", f'listen = "127.0.0.1:{port}"',
                 f'admin_listen = "127.0.0.1:{free_port()}"', "replica_header = true",
                 "[[pools]]", 'name = "sim"', f'models = ["{model}"]']
        if policy in PREFIX_MODES:
            lines += ['balancer = "least_connections"', "[pools.prefix]", f'mode = "{policy}"']
            if replicate:
                lines.append("replicate = true")
        else:
            lines.append(f'balancer = "{policy}"')
        if args.llmlb_scrape != "default":
            t = args.llmlb_scrape
            lines += ["[pools.scrape]", f'interval = "{t}"', f'timeout = "{t}"', 'staleness = "1s"']
        if args.tokenizer:
            lines += ["[pools.tokenizer]", f'dir = "{os.path.abspath(args.tokenizer)}"']
        for i, u in enumerate(urls):
            lines += ["[[pools.replicas]]", f'url = "{u}"']
            if policy == "exact" and events_port:
                lines.append(f'kv_events = "tcp://127.0.0.1:{events_port + i}"')
        cfg = os.path.join(procs.tmp, name + ".toml")
        open(cfg, "w").write("\n".join(lines) + "\n")
        p = procs.start("router-" + name, [args.llmlb, "serve", "--config", cfg])
    elif router == "sglang-cache_aware":
        p = procs.start("router-" + name, [PEERS_VENV + "/bin/python", "-m", "sglang_router.launch_router",
                                           "--host", "127.0.0.1", "--port", str(port),
                                           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                                           "--worker-urls", *urls, "--policy", "cache_aware", "--log-level", "warn"])
    elif router == "vllm-router":
        p = procs.start("router-" + name, [PEERS_VENV + "/bin/vllm-router", "--host", "127.0.0.1",
                                           "--port", str(port), "--worker-urls", *urls])
    else:
        raise SystemExit(f"unknown router {router}")
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}).encode()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
            urllib.request.urlopen(req, timeout=5).read()
            return p, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{router} not ready (see {procs.tmp}/router-{name}.log)")


def workload_args(args, rate):
    if args.workload == "shared-prefix":
        return ["--workload", "shared-prefix", "--groups", str(args.groups), "--prompts-per-group", "8",
                "--system-len", "1536", "--question-len", "64", "--output-len", "64",
                "--rate", str(rate), "--requests", str(args.requests), "--duration", f"{args.seconds}s"]
    return ["--workload", "trace", "--trace", args.trace, "--time-scale", str(args.time_scale / rate),
            "--length-scale", str(args.length_scale), "--max-requests", str(args.requests),
            "--duration", f"{args.seconds}s"]


def point(procs, args, router, rate):
    name = f"{router}-{rate}"
    # `exact` reads the replicas' KV events: the fleet publishes them, on
    # consecutive ports from a free one; another process may hold one of
    # the others, so a fleet that cannot bind is tried again elsewhere.
    exact = router.startswith("llmlb-exact")
    for attempt in range(3 if exact else 1):
        events = free_port() if exact else None
        try:
            fleet, urls, model = start_fleet(procs, args, f"{name}-{attempt}" if attempt else name, events)
            break
        except RuntimeError:
            if attempt == 2 or not exact:
                raise
            log(f"{name}: fleet did not start, trying other event ports")
    try:
        rp, url = start_router(procs, args, router, urls, model, name, events)
        try:
            time.sleep(0.3)
            before = counters(urls)
            out = os.path.join(procs.tmp, name + ".json")
            cmd = [args.llmlb, "bench", "--target", url, "--model", model, *workload_args(args, rate),
                   "--seed", "1", "--timeout", "120s", "--no-progress", "--name", name,
                   "--slo", f"ttft={args.objective_ms}", "--out", out]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(procs.tmp, name + ".bench.log"), "w"),
                           timeout=args.seconds + 180)
            after = counters(urls)
        finally:
            procs.stop(rp)
    finally:
        procs.stop(fleet)
    r = json.load(open(out))
    served = [a["n"] - b["n"] for a, b in zip(after, before)]
    q = sum(a["q"] - b["q"] for a, b in zip(after, before))
    h = sum(a["h"] - b["h"] for a, b in zip(after, before))
    mean = sum(served) / len(served) if served else 0
    return {
        "router": router, "rate": rate, "completed": r["completed"], "failed": r["failed"],
        "throughput": r["request_throughput"], "ttft_p50_ms": r["ttft_ms"]["p50"],
        "ttft_p99_ms": r["ttft_ms"]["p99"], "goodput": r.get("goodput") or 0.0,
        "busiest_over_mean": max(served) / mean if mean else 0.0,
        "hit_rate": h / q if q else 0.0,
    }


def svg(rows, routers, rates, path, objective_ms):
    """Two panels: goodput and p99 TTFT against the arrival rate."""
    w, h, pad = 900, 380, 60
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    xs = sorted(rates)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>']
    for panel, (key, title, log_y) in enumerate([("goodput", f"goodput (req/s with TTFT <= {objective_ms} ms)", False),
                                                 ("ttft_p99_ms", "TTFT p99 (ms, log scale)", True)]):
        x0 = pad + panel * (w // 2)
        pw, ph = w // 2 - pad - 20, h - 2 * pad
        vals = [r[key] for r in rows if r[key] is not None]
        if log_y:
            import math
            lo, hi = math.log10(max(1.0, min(vals or [1]))), math.log10(max(vals or [10]) * 1.2)
            fy = lambda v: pad + ph - (math.log10(max(v, 1.0)) - lo) / max(hi - lo, 1e-9) * ph
        else:
            hi = max(vals or [1]) * 1.1 or 1
            fy = lambda v: pad + ph - v / hi * ph
        fx = lambda x: x0 + (xs.index(x)) / max(len(xs) - 1, 1) * pw
        parts.append(f'<text x="{x0}" y="{pad - 20}" font-weight="bold">{title}</text>')
        parts.append(f'<line x1="{x0}" y1="{pad + ph}" x2="{x0 + pw}" y2="{pad + ph}" stroke="black"/>')
        parts.append(f'<line x1="{x0}" y1="{pad}" x2="{x0}" y2="{pad + ph}" stroke="black"/>')
        for x in xs:
            parts.append(f'<text x="{fx(x)}" y="{pad + ph + 16}" text-anchor="middle">{x}</text>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{pad + ph + 34}" text-anchor="middle">arrival rate</text>')
        if log_y:
            parts.append(f'<line x1="{x0}" y1="{fy(objective_ms)}" x2="{x0 + pw}" y2="{fy(objective_ms)}" stroke="#999" stroke-dasharray="4"/>')
        for i, router in enumerate(routers):
            pts = [(fx(r["rate"]), fy(r[key])) for r in rows if r["router"] == router and r[key] is not None]
            if not pts:
                continue
            c = colors[i % len(colors)]
            parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                         % (c, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
            if panel == 0:
                parts.append(f'<text x="{x0 + 10}" y="{pad + 14 + 14 * i}" fill="{c}">{router}</text>')
    parts.append("</svg>")
    open(path, "w").write("\n".join(parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["shared-prefix", "trace"], default="shared-prefix")
    ap.add_argument("--rates", default="4,8,12,16,24")
    ap.add_argument("--routers", default="llmlb-round_robin,llmlb-jsq,llmlb-hash,llmlb-cache,sglang-cache_aware")
    ap.add_argument("--llmlb", default=os.path.join(ROOT, "target", "release", "llmlb"))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--profile", default="h100-8b")
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--objective-ms", type=int, default=2000)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--tokenizer", help="a model directory: the replicas and llmlb tokenize with it "
                    "(replica-sim --tokenizer, [pools.tokenizer] dir)")
    ap.add_argument("--time-scale", type=float, default=0.1, help="trace: base time scale (rate 1)")
    ap.add_argument("--length-scale", type=float, default=0.05)
    ap.add_argument("--llmlb-scrape", default="default",
                    help="llmlb's scrape interval (and timeout; staleness 1s), or `default` for "
                         "llmlb's own settings (500 ms); before 2026-12-02 the sweep always used 100ms")
    ap.add_argument("--json")
    ap.add_argument("--svg")
    args = ap.parse_args()
    if not os.path.exists(args.llmlb):
        sys.exit(f"{args.llmlb} not found: run `cargo build --release` first")
    rates = [float(r) if "." in r else int(r) for r in args.rates.split(",")]
    routers = []
    for r in args.routers.split(","):
        if r in ("sglang-cache_aware", "vllm-router") and not os.path.exists(PEERS_VENV + "/bin/python"):
            print(f"skipping {r}: no peer venv at {PEERS_VENV} (scripts/peers.sh installs it)")
            continue
        routers.append(r)
    tmp = tempfile.mkdtemp(prefix="llmlb-sweep-")
    procs = Procs(tmp)
    rows = []
    try:
        for rate in rates:
            for router in routers:
                log(f"== {router} at rate {rate}")
                try:
                    rows.append(point(procs, args, router, rate))
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                    print(f"{router} at rate {rate}: {e}")
    finally:
        procs.stop_all()
    print(f"\n{args.workload}, {args.replicas} x {args.profile} replicas, TTFT objective {args.objective_ms} ms\n")
    print("| router | rate | completed | failed | req/s | TTFT p50 ms | TTFT p99 ms | goodput req/s | busiest/mean | prefix hits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (routers.index(r["router"]), r["rate"])):
        print(f"| {r['router']} | {r['rate']} | {r['completed']} | {r['failed']} | {r['throughput']:.2f} | "
              f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['goodput']:.2f} | "
              f"{r['busiest_over_mean']:.2f} | {100 * r['hit_rate']:.1f} % |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=2)
    if args.svg:
        svg(rows, routers, rates, args.svg, args.objective_ms)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
