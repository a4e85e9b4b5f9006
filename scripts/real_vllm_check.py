#!/usr/bin/env python3
"""Routing policies through llmlb on two real vLLM replicas and on two
simulated ones, with the same workload, side by side.

For each backend (`vllm`: the CPU build from shared/vllm-cpu; `sim`:
`llmlb replica-sim --profile vllm-cpu-tiny`, or `--sim-profile FILE`) two replicas are started, then for each
policy a fresh `llmlb serve` is started in front of them, the replicas' prefix
caches are emptied, and `llmlb bench` sends one bounded shared-prefix
workload (or, with `--workload trace`, the first `--max-requests` of a
Mooncake trace replayed open loop at `--time-scale`, lengths ×
`--length-scale`: the tiny CPU model's 2,048-token context needs about
0.012). Per policy it reports, from the replicas' own /metrics (deltas over
the run): the fleet prefix-cache hit rate, how many requests each replica
served (busiest / mean), preemptions and the mean real prompt length; from
llmlb's /metrics: the cached prompt tokens it predicted against those the
replicas reported (the closed loop) and its routing decisions by branch;
from llmlb's access log, per request, the cached tokens it predicted and
those reported (kept in `--runs-json`; the branch notes say how many
requests predicted to find part of their prompt cached found none);
and from the load generator: TTFT p50 / p99 and throughput; and the CPU
seconds llmlb and the whole host used during the load (from /proc). The policies
`hash_homes`, `cache_homes` and `exact_homes` are `hash`, `cache` and `exact` with
`[pools.prefix] homes = true`, `cache_free` and `exact_free` have
`evictions = "free"`, `cache_own_rates` has `rate_band = 1.0`,
`cache_one_hardware` and `exact_one_hardware` have `rate_band = 2.0` (as
a pool known to be of one hardware may set it),
`cache_kv_wait` and `exact_kv_wait` have `kv_wait = "batch"`,
`cache_no_preempt` and `exact_no_preempt` have `preemptions = "free"`,
`cache_handoff` and `exact_handoff` have `max_inflight = --handoff-inflight`
and `[pools.queue] prefix_handoff = --prefix-handoff`, and
`hash_homes_capped` also has
`[pools.saturation] max_in_flight = --saturation-in-flight`, and `hash_kv`
is `hash` with `[pools.saturation] max_kv_usage = --saturation-kv-usage`
(none of them in the default list). Before the policies, `llmlb doctor` checks the replicas
twice: with the pool's tokenizer (should agree) and with the stand-in
(should name the wrong tokenizer). Last, it says whether the two backends
rank the policies the same way by p99 TTFT and by hit rate. With `--rounds
N` the policy list runs N times (seed + round) and each policy's runs are
pooled: its hits over every run, its TTFT percentiles over every request,
and in how many rounds its p99 was at most round-robin's; the ranking then
reads the pooled figures (one run's p99 of 72 requests is its worst one or
two and spreads by a third between runs).

Usage (from the repository root, after `cargo build --release`):
  scripts/real_vllm_check.py                         # both backends, every policy
  scripts/real_vllm_check.py --backends sim          # simulator only (no venv needed)
  scripts/real_vllm_check.py --json out.json         # also write every figure
  scripts/real_vllm_check.py --rounds 5              # every policy five times, pooled

The real backend needs the venv made by `shared/vllm-cpu/setup_and_serve.sh
install` and `model`; without it that backend is skipped with the reason.
Only the standard library; every wait and every run is bounded in time.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import vllm_replica  # noqa: E402  (beside this script)
SHARED = os.environ.get("LLMLB_SHARED", os.path.join(ROOT, "..", "shared"))
VLLM_DIR = os.environ.get("VLLMCPU_DIR", os.path.expanduser("~/.cache/llmlb-vllm-cpu"))
FIXTURE_TOKENIZER = os.path.join(SHARED, "tokenizers", "tiny-llama")
MODEL = "tiny-llama"
SIM_OFFSET = 40

POLICIES = {
    # name: (balancer, prefix mode)
    "round_robin": ("round_robin", None),
    "least_connections": ("least_connections", None),
    "hash": ("least_connections", "hash"),
    "cache": ("least_connections", "cache"),
    "exact": ("least_connections", "exact"),
    # with [pools.prefix] homes = true
    "hash_homes": ("least_connections", "hash"),
    # with homes and [pools.saturation] max_in_flight = --saturation-in-flight
    "hash_homes_capped": ("least_connections", "hash"),
    # with [pools.saturation] max_kv_usage = --saturation-kv-usage
    "hash_kv": ("least_connections", "hash"),
    "cache_homes": ("least_connections", "cache"),
    "exact_homes": ("least_connections", "exact"),
    # with [pools.prefix] evictions = "free"
    "cache_free": ("least_connections", "cache"),
    "exact_free": ("least_connections", "exact"),
    # with [pools.prefix] rate_band = 1.0 (every replica's own learned rates)
    "cache_own_rates": ("least_connections", "cache"),
    # with [pools.prefix] rate_band = 2.0 (a pool of one hardware)
    "cache_one_hardware": ("least_connections", "cache"),
    "exact_one_hardware": ("least_connections", "exact"),
    # with [pools.prefix] kv_wait = "batch"
    "cache_kv_wait": ("least_connections", "cache"),
    "exact_kv_wait": ("least_connections", "exact"),
    # with [pools.prefix] preemptions = "free"
    "cache_no_preempt": ("least_connections", "cache"),
    "exact_no_preempt": ("least_connections", "exact"),
    # with max_inflight = --handoff-inflight and [pools.queue]
    # prefix_handoff = --prefix-handoff
    "cache_handoff": ("least_connections", "cache"),
    "exact_handoff": ("least_connections", "exact"),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def http_get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def http_post(port, path, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=b"")
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def wait_ready(port, path, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if http_get(port, path, timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def scrape(port):
    """Sums of the vLLM counters this script compares, from one /metrics."""
    _, text = http_get(port, "/metrics")
    wanted = {
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total", "vllm:request_success_total",
        "vllm:prompt_tokens_total",
    }
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if name in wanted:
            out[name] += float(value)
    return out


SAMPLED = ("vllm:prompt_tokens_total", "vllm:num_preemptions_total",
           "vllm:num_requests_running", "vllm:num_requests_waiting",
           "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total")


# llmlb's own view of each replica (labelled `replica="host:port"`).
PROXY_SAMPLED = ("llmlb_replica_in_flight", "llmlb_replica_prefill_tokens_per_second",
                 "llmlb_replica_prefill_seconds_per_request", "llmlb_replica_decode_step_seconds")


def by_label(text, name, label):
    """`{label value: summed value}` of every sample of `name` carrying `label`."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'{label}="' in line:
            series, value = line.rsplit(" ", 1)
            key = series.split(f'{label}="', 1)[1].split('"', 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


class Sampler:
    """Each replica's load, read from its /metrics every `every` seconds
    while a run lasts (for scripts/tail_breakdown.py: what a replica was
    doing while a slow request waited there), and llmlb's own view of it
    (its requests in flight and the rates it learned) from the admin port.
    Times are milliseconds from `start()`, taken just before `llmlb bench`
    starts; its requests' `start_ms` count from its own start, a few tens
    of milliseconds later."""

    def __init__(self, ports, admin_port, every=0.5):
        self.ports, self.admin_port, self.every = ports, admin_port, every
        self.samples = {f"127.0.0.1:{p}": [] for p in ports}
        self.proxy = {f"127.0.0.1:{p}": [] for p in ports}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        self.t0 = time.monotonic()
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            for port in self.ports:
                try:
                    _, text = http_get(port, "/metrics", timeout=2)
                except OSError:
                    continue
                t = (time.monotonic() - self.t0) * 1000.0
                row = [round(t, 1)] + [metric_sum(text, name) for name in SAMPLED]
                self.samples[f"127.0.0.1:{port}"].append(row)
            self.sample_proxy()
            self.stop.wait(self.every)

    def sample_proxy(self):
        try:
            _, text = http_get(self.admin_port, "/metrics", timeout=2)
        except OSError:
            return
        t = round((time.monotonic() - self.t0) * 1000.0, 1)
        values = [by_label(text, name, "replica") for name in PROXY_SAMPLED]
        for replica, rows in self.proxy.items():
            rows.append([t] + [v.get(replica) for v in values])

    def finish(self):
        self.stop.set()
        self.thread.join(5)
        return {"columns": ["t_ms", *SAMPLED], "replicas": self.samples,
                "proxy_columns": ["t_ms", *PROXY_SAMPLED], "proxy": self.proxy}


def metric_sum(text, name):
    """The sum of every sample of `name` in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def branches(text):
    """llmlb's routing decisions by branch, from its own /metrics."""
    return {b: int(n) for b, n in by_label(text, "llmlb_routing_decisions_total", "branch").items()}


def doctor(backend, args, tmp):
    """`llmlb doctor` on the running replicas, with the pool's tokenizer
    and with the stand-in; prints both reports."""
    for label, stand_in in [("pool tokenizer", False), ("stand-in tokenizer", True)]:
        path = os.path.join(tmp, f"{backend.kind}-doctor-{int(stand_in)}.toml")
        with open(path, "w") as f:
            f.write(proxy_config(backend, "exact", args, stand_in=stand_in))
        done = subprocess.run([args.llmlb, "doctor", "--config", path], capture_output=True,
                              text=True, timeout=300)
        print(f"\n#### llmlb doctor on {backend.kind}, {label} (exit {done.returncode})\n")
        print("```\n" + done.stdout.strip() + "\n```")


class Backend:
    """The replicas of one kind (two real ones, or `--sim-replicas`
    simulated), started once for every policy."""

    def __init__(self, kind, args, tmp):
        self.kind, self.args, self.tmp = kind, args, tmp
        # The simulated replicas take ports of their own (SIM_OFFSET above the
        # real ones), so that a relay still bound for vLLM or a socket in
        # TIME_WAIT does not stand in their way; llmlb subscribes to them
        # directly (the simulator binds loopback endpoints itself).
        off = SIM_OFFSET if kind == "sim" else 0
        n = args.sim_replicas if kind == "sim" else 2
        self.ports = [args.replica_port + off + i for i in range(n)]
        self.events = [args.events_port + off + i for i in range(n)]
        self.replays = [args.replay_port + off + i for i in range(n)]
        # Where llmlb subscribes: the replicas' own endpoints, or a relay's.
        sub = args.subscribe_port if args.subscribe_port and kind == "vllm" else self.events[0]
        self.subscribe = [sub + i for i in range(n)]
        self.procs = []

    def available(self):
        if self.kind == "sim":
            return None
        if not os.path.exists(os.path.join(VLLM_DIR, "venv", "bin", "vllm")):
            return f"no vLLM venv at {VLLM_DIR} (run shared/vllm-cpu/setup_and_serve.sh install)"
        if not os.path.exists(os.path.join(VLLM_DIR, "tinymodel", "tokenizer.json")):
            return f"no tiny model at {VLLM_DIR}/tinymodel (run setup_and_serve.sh model)"
        return None

    def tokenizer_dir(self):
        if self.kind == "vllm":
            return os.path.join(VLLM_DIR, "tinymodel")
        return self.args.tokenizer or FIXTURE_TOKENIZER

    def start(self):
        if self.kind == "vllm":
            for i, (port, ev, rp) in enumerate(zip(self.ports, self.events, self.replays)):
                # No spaces: the serve script splits EXTRA_ARGS on them.
                cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://127.0.0.1:{ev}",
                                  "replay_endpoint": f"tcp://127.0.0.1:{rp}", "topic": "kv"},
                                 separators=(",", ":"))
                os.environ["VLLM_SERVER_DEV_MODE"] = "1"
                vllm_replica.serve(port, i, f"--kv-events-config {cfg}", [rp])
            return
        cmd = [self.args.llmlb, "replica-sim", "--replicas", str(len(self.ports)), "--port", str(self.ports[0]),
               "--profile", self.args.sim_profile, "--model", MODEL, "--seed", "1"]
        if self.args.sim_config:
            cmd += ["--config", self.args.sim_config]
        if not self.args.stand_in:
            cmd += ["--tokenizer", self.tokenizer_dir(), "--kv-events-port", str(self.events[0]),
                    "--kv-events-replay-port", str(self.replays[0])]
        self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                           stderr=open(os.path.join(self.tmp, "sim.log"), "w")))
        for p in self.ports:
            if not wait_ready(p, "/health", 30):
                raise RuntimeError(f"sim replica on {p} did not start (see {self.tmp}/sim.log)")

    def reset(self):
        """Empties both replicas' prefix caches between policies."""
        if self.kind == "vllm":
            for p in self.ports:
                status, body = http_post(p, "/reset_prefix_cache")
                if status != 200:
                    raise RuntimeError(f"reset_prefix_cache on {p}: {status} {body}")
            time.sleep(1)
        else:
            self.stop()
            self.start()

    def stop(self):
        if self.kind == "vllm":
            for p in self.ports:
                vllm_replica.stop(p)
            return
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = []


def proxy_config(backend, policy, args, stand_in=None):
    balancer, mode = POLICIES[policy]
    stand_in = args.stand_in if stand_in is None else stand_in
    lines = [
        "[server]",
        f'listen = "127.0.0.1:{args.proxy_port}"',
        f'admin_listen = "127.0.0.1:{args.proxy_port + 1}"',
        "replica_header = true",
        "",
        "[[pools]]",
        'name = "tiny"',
        f'models = ["{MODEL}"]',
        f'balancer = "{balancer}"',
    ]
    if policy.endswith("_handoff"):
        lines.append(f"max_inflight = {args.handoff_inflight}")
        # Closed-loop clients queue rather than take a 429 for a wait of
        # a few seconds.
        lines += ["", "[pools.queue]", f'prefix_handoff = "{args.prefix_handoff}"',
                  'max_wait = "60s"']
    elif args.max_inflight:
        lines.append(f"max_inflight = {args.max_inflight}")
    if mode:
        lines += ["", "[pools.prefix]", f'mode = "{mode}"']
        if mode == "cache":
            lines.append(f"block_size = {args.block_size}")
        if "_homes" in policy:
            lines.append("homes = true")
        if policy.endswith("_free"):
            lines.append('evictions = "free"')
        if policy.endswith("_own_rates"):
            lines.append("rate_band = 1.0")
        if policy.endswith("_one_hardware"):
            lines.append("rate_band = 2.0")
        if policy.endswith("_kv_wait"):
            lines.append('kv_wait = "batch"')
        if policy.endswith("_no_preempt"):
            lines.append('preemptions = "free"')
        if policy.endswith("_capped"):
            lines += ["", "[pools.saturation]", f"max_in_flight = {args.saturation_in_flight}"]
        if policy.endswith("_kv"):
            lines += ["", "[pools.saturation]", f"max_kv_usage = {args.saturation_kv_usage}"]
    if not stand_in:
        lines += ["", "[pools.tokenizer]", f'dir = "{backend.tokenizer_dir()}"']
    for port, ev, rp in zip(backend.ports, backend.subscribe, backend.replays):
        lines += ["", "[[pools.replicas]]", f'url = "http://127.0.0.1:{port}"']
        if mode == "exact":
            lines.append(f'kv_events = "tcp://127.0.0.1:{ev}"')
            lines.append(f'kv_events_replay = "tcp://127.0.0.1:{rp}"')
    return "\n".join(lines) + "\n"


def run_policy(backend, policy, args, tmp, seed):
    backend.reset()
    cfg_path = os.path.join(tmp, f"{backend.kind}-{policy}.toml")
    with open(cfg_path, "w") as f:
        f.write(proxy_config(backend, policy, args))
    # One log per round (its seed), so `--keep` keeps every round's picks.
    log_path = os.path.join(tmp, f"{backend.kind}-{policy}-seed{seed}.log")
    proxy = subprocess.Popen([args.llmlb, "--log-format", "json", "serve", "--config", cfg_path],
                             stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    try:
        if not wait_ready(args.proxy_port + 1, "/readyz", 30):
            raise RuntimeError(f"llmlb serve did not become ready (see {tmp})")
        time.sleep(1.5)  # one scrape and, with events, the subscriptions
        before = [scrape(p) for p in backend.ports]
        out = os.path.join(tmp, f"{backend.kind}-{policy}.json")
        bench = [args.llmlb, "bench", "--target", f"http://127.0.0.1:{args.proxy_port}",
                 "--model", MODEL, "--seed", str(seed),
                 "--timeout", "120s", "--no-progress", "--name", policy, "--out", out]
        if args.workload == "trace":
            bench += ["--workload", "trace", "--trace", args.trace,
                      "--time-scale", str(args.time_scale),
                      "--length-scale", str(args.length_scale),
                      "--max-requests", str(args.max_requests)]
        else:
            bench += ["--workload", "shared-prefix",
                      "--groups", str(args.groups), "--prompts-per-group", str(args.per_group),
                      "--system-len", str(args.system_len), "--question-len", str(args.question_len),
                      "--output-len", str(args.output_len), "--concurrency", str(args.concurrency),
                      "--requests", str(args.groups * args.per_group)]
        sampler = Sampler(backend.ports, args.proxy_port + 1)
        sampler.start()
        cpu_before = (process_cpu_s(proxy.pid), host_busy_s(), time.monotonic())
        try:
            subprocess.run(bench, check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr,
                           timeout=args.run_timeout)
        finally:
            samples = sampler.finish()
        cpu_after = (process_cpu_s(proxy.pid), host_busy_s(), time.monotonic())
        time.sleep(0.5)
        after = [scrape(p) for p in backend.ports]
        _, own = http_get(args.proxy_port + 1, "/metrics")
    finally:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(15)
        except subprocess.TimeoutExpired:
            proxy.kill()
    with open(out) as f:
        report = json.load(f)
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    served = [d["vllm:request_success_total"] for d in delta]
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    mean = sum(served) / len(served) if sum(served) else 0
    ttft = report.get("ttft_ms") or {}
    return {
        "backend": backend.kind, "policy": policy,
        "hit_rate": hits / queries if queries else 0.0,
        "hits": hits, "queries": queries, "seed": seed,
        "ttfts_ms": sorted(r["ttft_ms"] for r in report.get("requests", [])
                           if r.get("ttft_ms") is not None),
        # Every request's timing and replica, for scripts/tail_breakdown.py.
        "requests": [{k: r.get(k) for k in ("start_ms", "ttft_ms", "e2e_ms", "input_tokens", "replica")}
                     for r in report.get("requests", [])],
        # Each replica's load through the run (Sampler).
        "samples": samples,
        "served": served,
        # Each replica's prefix-cache hit rate over the run (in `served`'s order).
        "hit_rate_per_replica": [d["vllm:prefix_cache_hits_total"] / d["vllm:prefix_cache_queries_total"]
                                 if d["vllm:prefix_cache_queries_total"] else 0.0 for d in delta],
        "busiest_over_mean": max(served) / mean if mean else 0.0,
        "preemptions": sum(d["vllm:num_preemptions_total"] for d in delta),
        "mean_prompt_tokens": (sum(d["vllm:prompt_tokens_total"] for d in delta) / sum(served))
        if sum(served) else 0.0,
        "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99"),
        "completed": report.get("completed"), "failed": report.get("failed"),
        "cached_predicted": metric_sum(own, "llmlb_prefix_cached_tokens_predicted_total"),
        "cached_reported": metric_sum(own, "llmlb_prefix_cached_tokens_reported_total"),
        # The cost model's expected time to first token against the streams' own.
        "ttft_predicted_s": metric_sum(own, "llmlb_prefix_ttft_predicted_seconds_total"),
        "ttft_observed_s": metric_sum(own, "llmlb_prefix_ttft_observed_seconds_total"),
        "req_per_s": report.get("request_throughput"),
        "branches": branches(own),
        # llmlb's KV-event subscribers: sequence gaps, missed messages, replays asked.
        "kv_event_gaps": metric_sum(own, "llmlb_kv_events_gaps_total"),
        "kv_events_missed": metric_sum(own, "llmlb_kv_events_missed_total"),
        "kv_event_replays": metric_sum(own, "llmlb_kv_events_replays_total"),
        "kv_stores_dropped": metric_sum(own, "llmlb_kv_events_stores_dropped_total"),
        # CPU seconds during the load: llmlb's own, and every process's on
        # the host (the replicas share its cores with llmlb and the client).
        "llmlb_cpu_s": cpu_after[0] - cpu_before[0],
        "host_busy_s": cpu_after[1] - cpu_before[1],
        "wall_s": cpu_after[2] - cpu_before[2],
        # Per request, from llmlb's access log: where it went, why, and the
        # cached prompt tokens llmlb predicted there against those reported.
        "access": access_lines(log_path),
    }


def access_lines(path):
    """The access-log lines of llmlb's JSON log at `path`, the fields the
    closed loop needs (requests in the order they finished)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if v.get("target") == "llmlb::access" and v.get("path", "").startswith("/v1/"):
                out.append({k: v.get(k) for k in ("replica", "route", "cached_tokens",
                                                  "cached_tokens_predicted", "prompt_tokens",
                                                  "ttft_ms", "queue_ms", "ttft_predicted_ms")})
    return out


def misses(r):
    """The branch note's part on the requests predicted to find part of
    their prompt cached that found none, of those predicted to; empty
    without the access log."""
    lines = [a for a in r.get("access") or [] if a.get("cached_tokens_predicted")]
    if not lines:
        return ""
    found_none = sum(1 for a in lines if not a.get("cached_tokens"))
    return f"; predicted cached and found none: {found_none} / {len(lines)}"


def ttft_loop(r):
    """The branch note's part on the cost model's time to first token: the
    streams' own (from dispatch) over it, summed and per request (median)."""
    p, o = r.get("ttft_predicted_s") or 0, r.get("ttft_observed_s") or 0
    if not p:
        return ""
    ratios = sorted((a["ttft_ms"] - (a.get("queue_ms") or 0)) / a["ttft_predicted_ms"]
                    for a in r.get("access") or []
                    if a.get("ttft_predicted_ms") and a.get("ttft_ms") is not None)
    median = f", median per request {ratios[len(ratios) // 2]:.2f}" if ratios else ""
    return f"; TTFT observed / predicted {o / p:.2f}{median}"


def process_cpu_s(pid):
    """User plus system CPU seconds of process `pid` so far (0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy_s():
    """CPU seconds the host's cores spent busy so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def table(rows):
    head = ("| policy | prefix hits | served per replica | busiest/mean | TTFT p50 ms | TTFT p99 ms "
            "| preemptions | prompt tokens (mean) | cached tokens predicted / reported "
            "| llmlb CPU s / host busy s |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        out.append(f"| {r['policy']} | {100 * r['hit_rate']:.1f} % | "
                   f"{' / '.join(str(int(s)) for s in r['served'])} | {r['busiest_over_mean']:.2f} | "
                   f"{fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} | {r['preemptions']:.0f} | "
                   f"{r['mean_prompt_tokens']:.0f} | {loop(r)} | {cpu(r)} |")
    notes = [f"{r['policy']}: {', '.join(f'{k} {v}' for k, v in sorted(r['branches'].items()))}"
             + misses(r) + ttft_loop(r)
             + (f"; KV events: {r['kv_event_gaps']:.0f} gaps, {r['kv_events_missed']:.0f} missed, "
                f"{r['kv_event_replays']:.0f} replays, {r.get('kv_stores_dropped', 0):.0f} stores dropped"
                if r.get("kv_event_gaps") or r.get("kv_event_replays") else "")
             for r in rows if r.get("branches")]
    if notes:
        out += ["", "routing decisions by branch:"] + notes
    return "\n".join(out)


def cpu(r):
    if "llmlb_cpu_s" not in r:
        return "-"
    return f"{r['llmlb_cpu_s']:.1f} / {r['host_busy_s']:.0f}"


def loop(r):
    p, q = r.get("cached_predicted", 0), r.get("cached_reported", 0)
    if not p and not q:
        return "-"
    return f"{p:.0f} / {q:.0f}" + (f" ({100 * (p - q) / q:+.1f} %)" if q else "")


def percentile(sorted_values, p):
    """Linear interpolation between closest ranks, as `llmlb bench` does."""
    if not sorted_values:
        return None
    rank = p / 100 * (len(sorted_values) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def pooled(rows):
    """One row per policy over all its runs: hits summed over the runs'
    deltas, TTFT percentiles over every request of every run, the worst
    busiest/mean, and in how many runs its p99 was at most round-robin's
    in the same round."""
    rr = {r["round"]: r["ttft_p99_ms"] for r in rows if r["policy"] == "round_robin"}
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        runs = [r for r in rows if r["policy"] == policy]
        ttfts = sorted(t for r in runs for t in r["ttfts_ms"])
        queries = sum(r["queries"] for r in runs)
        paired = [r for r in runs if r["round"] in rr and r["ttft_p99_ms"] is not None]
        out.append({
            "policy": policy, "runs": len(runs),
            "hit_rate": sum(r["hits"] for r in runs) / queries if queries else 0.0,
            "hit_rates": [r["hit_rate"] for r in runs],
            "busiest_over_mean": max(r["busiest_over_mean"] for r in runs),
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99),
            "requests": len(ttfts),
            "p99_at_most_rr": sum(r["ttft_p99_ms"] <= rr[r["round"]] for r in paired),
            "paired": len(paired),
            "llmlb_cpu_ms_per_request": 1000 * sum(r.get("llmlb_cpu_s", 0) for r in runs) / len(ttfts)
            if ttfts and all("llmlb_cpu_s" in r for r in runs) else None,
        })
    return out


def fmt2(v):
    return "-" if v is None else f"{v:.2f}"


def pooled_table(rows):
    head = ("| policy | runs | requests | prefix hits, pooled (range) | busiest/mean, worst "
            "| TTFT p50 ms | TTFT p99 ms | runs with p99 ≤ round_robin's | llmlb CPU ms a request |")
    out = [head, "|" + "---|" * 9]
    for r in rows:
        rng = f"{100 * min(r['hit_rates']):.1f}–{100 * max(r['hit_rates']):.1f}"
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        vs = f"{r['p99_at_most_rr']} of {r['paired']}" if r["paired"] and r["policy"] != "round_robin" else "-"
        out.append(f"| {r['policy']} | {r['runs']} | {r['requests']} | {100 * r['hit_rate']:.1f} % ({rng}) | "
                   f"{r['busiest_over_mean']:.2f} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} | {vs} | "
                   f"{fmt2(r['llmlb_cpu_ms_per_request'])} |")
    return "\n".join(out)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def ranking(rows, key, reverse):
    return [r["policy"] for r in sorted(rows, key=lambda r: (r[key] is None, r[key]), reverse=reverse)]


def discordant(a, b, key):
    """The pairs of policies the two backends order differently by `key`,
    each with both backends' figures, so a reader can tell a swap of near
    ties from a real disagreement."""
    va = {r["policy"]: r[key] for r in a}
    vb = {r["policy"]: r[key] for r in b}
    names = [p for p in va if p in vb and va[p] is not None and vb[p] is not None]
    scale = 100 if key == "hit_rate" else 1
    unit = " %" if key == "hit_rate" else " ms"
    out = []
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            if (va[x] - va[y]) * (vb[x] - vb[y]) < 0:
                out.append(f"{x} / {y}: vllm {scale * va[x]:.1f} / {scale * va[y]:.1f}{unit}, "
                           f"sim {scale * vb[x]:.1f} / {scale * vb[y]:.1f}{unit}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="vllm,sim")
    ap.add_argument("--policies", default="round_robin,least_connections,hash,cache,exact")
    ap.add_argument("--llmlb", default=os.path.join(ROOT, "target", "release", "llmlb"))
    ap.add_argument("--tokenizer", help="tokenizer dir for the simulator (default: the vLLM model's, else the fixture)")
    ap.add_argument("--sim-profile", default="vllm-cpu-tiny",
                    help="the simulated replicas' profile: a built-in name or a file "
                         "(e.g. the one `llmlb calibrate` wrote against the real replica)")
    ap.add_argument("--sim-replicas", type=int, default=2,
                    help="simulated replicas (the real backend always has two)")
    ap.add_argument("--sim-config",
                    help="sim config overriding the profile, e.g. the [cost] that "
                         "`sim_fidelity.py --fit` gives for this machine's vLLM")
    ap.add_argument("--stand-in", action="store_true",
                    help="no real tokenizer and no KV events (llmlb's stand-in tokenizer everywhere)")
    ap.add_argument("--workload", choices=["shared-prefix", "trace"], default="shared-prefix",
                    help="shared-prefix (closed loop, --concurrency) or a Mooncake trace replayed open loop")
    ap.add_argument("--trace", default=os.path.join(SHARED, "traces", "conversation_trace.jsonl"))
    ap.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival times")
    ap.add_argument("--length-scale", type=float, default=0.01, help="trace: multiply lengths")
    ap.add_argument("--max-requests", type=int, default=128, help="trace: replay the first N")
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--per-group", type=int, default=12)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=128, help="cache mode block size (vLLM CPU uses 128)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the policy list this many times (seed + round), then pool each "
                         "policy's runs: hits over all of them, TTFT percentiles over every request")
    ap.add_argument("--saturation-kv-usage", type=float, default=0.9,
                    help="[pools.saturation] max_kv_usage of the *_kv policies")
    ap.add_argument("--saturation-in-flight", type=int, default=5,
                    help="[pools.saturation] max_in_flight of the *_capped policies")
    ap.add_argument("--replica-port", type=int, default=18000)
    ap.add_argument("--events-port", type=int, default=15557)
    ap.add_argument("--replay-port", type=int, default=15567)
    ap.add_argument("--subscribe-port", type=int,
                    help="where llmlb subscribes to events (a relay's ports; default --events-port)")
    ap.add_argument("--max-inflight", type=int,
                    help="every policy's pool gets this max_inflight per replica (the rest wait in llmlb's queue)")
    ap.add_argument("--handoff-inflight", type=int, default=3,
                    help="max_inflight per replica of the *_handoff policies")
    ap.add_argument("--prefix-handoff", default="250ms",
                    help="[pools.queue] prefix_handoff of the *_handoff policies")
    ap.add_argument("--no-doctor", action="store_true", help="skip the llmlb doctor step")
    ap.add_argument("--proxy-port", type=int, default=18080)
    ap.add_argument("--run-timeout", type=int, default=600)
    ap.add_argument("--json")
    ap.add_argument("--runs-json",
                    help="write every run (each request's timing and replica included) here, "
                         "for scripts/tail_breakdown.py")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run directory (each policy's config and its llmlb log per round; "
                         "RUST_LOG=llmlb::prefix_pick=debug logs every prefix pick there)")
    args = ap.parse_args()
    if not os.path.exists(args.llmlb):
        sys.exit(f"{args.llmlb} not found: run `cargo build --release` first")
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            sys.exit(f"unknown policy {p}; known: {', '.join(POLICIES)}")
    tmp = tempfile.mkdtemp(prefix="llmlb-real-check-")
    results = {}
    runs = {}
    vllm_tok = None
    for kind in args.backends.split(","):
        backend = Backend(kind, args, tmp)
        why = backend.available()
        if why:
            print(f"skipping the {kind} backend: {why}")
            continue
        if kind == "vllm":
            vllm_tok = backend.tokenizer_dir()
        elif vllm_tok and not args.tokenizer:
            args.tokenizer = vllm_tok
        log(f"== {kind}: starting {len(backend.ports)} replicas")
        load_before = loadavg()
        backend.start()
        rows = []
        try:
            if not args.stand_in and not args.no_doctor:
                doctor(backend, args, tmp)
            for n in range(args.rounds):
                for p in policies:
                    log(f"== {kind}: {p}" + (f" (round {n + 1} of {args.rounds})" if args.rounds > 1 else ""))
                    row = run_policy(backend, p, args, tmp, args.seed + n)
                    row["round"] = n
                    rows.append(row)
        finally:
            backend.stop()
        print(f"\n### {kind}\n\nload average {load_before} before, {loadavg()} after\n\n"
              f"{table(rows)}\n")
        runs[kind] = rows
        if args.rounds > 1:
            rows = pooled(rows)
            print(f"every run of a policy pooled (seeds {args.seed}..{args.seed + args.rounds - 1}, "
                  f"one per round, the same for every policy of a round):\n\n{pooled_table(rows)}\n")
        results[kind] = rows
    if len(results) == 2:
        a, b = results.values()
        for key, rev, label in [("ttft_p99_ms", False, "p99 TTFT (best first)"),
                                ("hit_rate", True, "prefix hits (best first)")]:
            ra, rb = ranking(a, key, rev), ranking(b, key, rev)
            verdict = "agree" if ra == rb else "differ"
            print(f"ranking by {label}: vllm {ra} / sim {rb}: {verdict}")
            for line in discordant(a, b, key):
                print(f"  {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.runs_json:
        with open(args.runs_json, "w") as f:
            json.dump(runs, f)
    if args.keep:
        log(f"run directory kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
