#!/usr/bin/env python3
"""`exact` prefix routing against two real vLLM CPU replicas on requests
that carry tools, template arguments, cache salts and LoRA adapters: how
close llmlb's predicted cached tokens come to what the replicas report, per
request kind, and (with `--placement`) swaps and TTFT by balancer on a
mixed-adapter workload.

Starts two replicas of the tiny model (../shared/vllm-cpu) serving the chat
template `tests/fixtures/tiny_tools_template.jinja` (tools before the
messages, a thinking marker after the generation prompt), with tool
calling (`--enable-auto-tool-choice --tool-call-parser hermes`), two
random-weight LoRA adapters (`scripts/make_lora_adapters.py`, `--enable-lora
--max-loras 1`) and KV events (through `scripts/kv_events_relay.py`, so
every socket stays on 127.0.0.1). Then, through a fresh `llmlb serve` per
run ([pools.tokenizer] dir = the model's tokenizer with the same template):

- `features`: 6 shared system prompts; each request has three tools with
  probability 1/2 and `chat_template_kwargs: {"enable_thinking": true}`
  with probability 1/3 (kind `tools` wins over `template_args`), the
  rest plain; some carry a `cache_salt`. Reports llmlb's
  `llmlb_prefix_cached_tokens_{predicted,reported}_total` by kind.
- `adapters`: the same prompts sent one at a time to the base model and the
  two adapters, reading llmlb's counters after each answer, so the
  prediction is checked per adapter.
- `variants`: the same, one at a time, for request fields the kinds do not
  split out: `documents`, `cache_salt` (two salts on the same prompts),
  message content as text parts, and plain requests beside them.
- `doctor`: `llmlb doctor` against the same replicas (plain, tools and
  `chat_template_kwargs` probes).
- `placement` (with `--placement`): a mixed-adapter workload at
  concurrency, once per balancer in `--balancers` (`NAME` or
  `NAME:key = value` for extra `[pools.lora]` lines, e.g.
  `least_connections:placement = false`; `NAME@PATH` runs that llmlb
  binary instead of `--llmlb`); reports streamed TTFT p50/p99,
  llmlb's `llmlb_lora_swaps_total`, the adapter loads the replicas'
  `vllm:lora_requests_info` showed, and per request (JSON only) the
  adapter, replica, routing branches, TTFT, prompt and cached tokens and
  what ran on that replica when it was sent, with a summary of the
  slowest 5 % and 1 % beside all requests.

Usage (under the vLLM lock, after `cargo build --release`):
  flock /tmp/llmlb-vllm.lock quiet python3 scripts/exact_features_check.py --llmlb target/release/llmlb
Only the standard library (the adapters are written with the vLLM venv's
Python); every wait and every run is bounded in time.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import vllm_replica  # noqa: E402  (beside this script)

VLLM_DIR = os.environ.get("VLLMCPU_DIR", os.path.expanduser("~/.cache/llmlb-vllm-cpu"))
TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "tiny_tools_template.jinja")
MODEL = "tiny-llama"
ADAPTERS = ["sql", "chat"]

WORDS = ("parcel depot tracking weight sender receiver route truck warehouse invoice customs "
         "delay label scan pallet courier hub address signature refund").split()

TOOLS = [
    {"type": "function", "function": {
        "name": "locate_parcel", "description": "Where a parcel is now.",
        "parameters": {"type": "object", "properties": {"tracking": {"type": "string"}},
                       "required": ["tracking"]}}},
    {"type": "function", "function": {
        "name": "parcel_weight", "description": "The weight of a parcel.",
        "parameters": {"type": "object", "properties": {
            "tracking": {"type": "string"}, "unit": {"type": "string", "enum": ["kg", "lb"]}}}}},
    {"type": "function", "function": {
        "name": "reroute", "description": "Send a parcel to another depot.",
        "parameters": {"type": "object", "properties": {
            "tracking": {"type": "string"}, "depot": {"type": "string"}},
            "required": ["tracking", "depot"]}}},
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def request(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def wait_ready(port, path, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if request(port, "GET", path, timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def samples(text, name):
    """(labels dict, value) of every sample of `name`."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, value = line.rsplit(" ", 1)
        labels = {}
        if "{" in series:
            for part in series.split("{", 1)[1].rstrip("}").split('",'):
                if "=" in part:
                    k, v = part.split("=", 1)
                    labels[k.strip()] = v.strip().strip('"')
        out.append((labels, float(value)))
    return out


def by_label(text, name, label):
    out = {}
    for labels, v in samples(text, name):
        out[labels.get(label, "")] = out.get(labels.get(label, ""), 0.0) + v
    return out


def system_prompts(rng, n, words):
    return [f"System {i}: you answer questions about shipping for customer group {i}. "
            + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def body_of(rng, systems, model, kind_p, max_tokens=None):
    system = rng.choice(systems)
    question = " ".join(rng.choice(WORDS) for _ in range(12)) + "?"
    body = {"model": model, "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": question}],
            "max_tokens": max_tokens or 4, "temperature": 0}
    if max_tokens:
        # A set answer length: every answer runs to it.
        body["ignore_eos"] = True
    if kind_p and rng.random() < 0.5:
        body["tools"] = TOOLS
    if kind_p and rng.random() < 1 / 3:
        body["chat_template_kwargs"] = {"enable_thinking": True}
    if kind_p and rng.random() < 0.1:
        body["cache_salt"] = "tenant-" + rng.choice("ab")
    return body


class Fleet:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.ports = [args.replica_port, args.replica_port + 1]
        self.relays = []

    def start(self):
        adapters = self.args.adapters or os.path.join(self.tmp, "adapters")
        if not all(os.path.exists(os.path.join(adapters, a, "adapter_config.json"))
                   for a in ADAPTERS):
            subprocess.run([os.path.join(VLLM_DIR, "venv", "bin", "python"),
                            os.path.join(ROOT, "scripts", "make_lora_adapters.py"), adapters,
                            *ADAPTERS],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=600)
        # Free ports first: a replica left from an earlier run would answer
        # in place of the new one, or keep the event sockets.
        for p in self.ports:
            vllm_replica.stop(p, quiet=True)
        vllm_replica.wait_ports_free(
            [*self.ports] + [port + i for i in range(2) for port in
                             (self.args.events_port, self.args.subscribe_port, self.args.replay_port)])
        for i in range(2):
            self.relays.append(subprocess.Popen(
                [os.path.join(VLLM_DIR, "venv", "bin", "python"),
                 os.path.join(ROOT, "scripts", "kv_events_relay.py"),
                 str(self.args.events_port + i), str(self.args.subscribe_port + i)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        modules = " ".join(f"{a}={adapters}/{a}" for a in ADAPTERS)
        # Both at once (each pinned to its core); readiness is awaited up to
        # --start-timeout, beyond the serve script's own wait.
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
        errors = []

        def one(i, port):
            cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                              "endpoint": f"tcp://127.0.0.1:{self.args.events_port + i}",
                              "replay_endpoint": f"tcp://127.0.0.1:{self.args.replay_port + i}",
                              "topic": "kv"}, separators=(",", ":"))
            extra = (f"--kv-events-config {cfg} --chat-template {TEMPLATE} "
                     "--enable-auto-tool-choice --tool-call-parser hermes "
                     f"--enable-lora --max-loras 1 --max-lora-rank 8 --lora-modules {modules}")
            try:
                vllm_replica.serve(port, i, extra, [self.args.replay_port + i],
                                   wait=self.args.start_timeout)
            except RuntimeError as e:
                errors.append(str(e))

        starting = [threading.Thread(target=one, args=(i, port)) for i, port in enumerate(self.ports)]
        for t in starting:
            t.start()
        for t in starting:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))

    def reset(self):
        for p in self.ports:
            status, body = request(p, "POST", "/reset_prefix_cache")
            if status != 200:
                raise RuntimeError(f"reset_prefix_cache on {p}: {status} {body}")
        time.sleep(1)

    def stop(self):
        for p in self.ports:
            vllm_replica.stop(p)
        for r in self.relays:
            r.terminate()


def model_dir(tmp):
    d = os.path.join(tmp, "model")
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(VLLM_DIR, "tinymodel", f), d)
    shutil.copy(TEMPLATE, os.path.join(d, "chat_template.jinja"))
    return d


def config(args, fleet, tmp, balancer, mode="exact", extra="", replica_header=False):
    lines = ["[server]", f'listen = "127.0.0.1:{args.proxy_port}"',
             f'admin_listen = "127.0.0.1:{args.proxy_port + 1}"',
             *(["replica_header = true"] if replica_header else []), "",
             "[[pools]]", 'name = "tiny"', f'models = ["{MODEL}", {", ".join(json.dumps(a) for a in ADAPTERS)}]',
             f'balancer = "{balancer}"', "", "[pools.prefix]", f'mode = "{mode}"', "",
             "[pools.lora]", f'adapters = [{", ".join(json.dumps(a) for a in ADAPTERS)}]', extra, "",
             "[pools.tokenizer]", f'dir = "{model_dir(tmp)}"']
    for i, port in enumerate(fleet.ports):
        lines += ["", "[[pools.replicas]]", f'url = "http://127.0.0.1:{port}"',
                  f'kv_events = "tcp://127.0.0.1:{args.subscribe_port + i}"',
                  f'kv_events_replay = "tcp://127.0.0.1:{args.replay_port + i}"']
    path = os.path.join(tmp, f"llmlb-{balancer}.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


class Proxy:
    def __init__(self, args, path, tmp, binary=None):
        self.args = args
        self.log = os.path.join(tmp, "llmlb.log")
        self.proc = subprocess.Popen([binary or args.llmlb, "--log-format", "json", "serve", "--config", path],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "a"))
        if not wait_ready(args.proxy_port + 1, "/readyz", 30):
            raise RuntimeError(f"llmlb serve did not become ready (see {tmp}/llmlb.log)")
        time.sleep(2)

    def metrics(self):
        return request(self.args.proxy_port + 1, "GET", "/metrics")[1]

    def access(self, prefix):
        """The access log's lines whose request id starts with `prefix`, by id."""
        out = {}
        with open(self.log) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                fields = ev.get("fields", ev)
                rid = str(fields.get("request_id", ""))
                if rid.startswith(prefix) and ev.get("target") == "llmlb::access":
                    out[rid] = fields
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def send(port, body):
    t0 = time.time()
    status, text = request(port, "POST", "/v1/chat/completions", body)
    dt = time.time() - t0
    if status != 200:
        return {"status": status, "error": text[:300]}
    usage = json.loads(text).get("usage") or {}
    return {"status": 200, "latency_s": dt, "prompt_tokens": usage.get("prompt_tokens"),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def run_concurrent(port, bodies, concurrency, deadline_s, send=send, ids=None):
    """`ids`: a request id per body, sent as `x-request-id` (send takes it)."""
    results = [None] * len(bodies)
    next_i = [0]
    lock = threading.Lock()
    stop_at = time.time() + deadline_s

    def worker():
        while time.time() < stop_at:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(bodies):
                return
            results[i] = send(port, bodies[i], ids[i]) if ids else send(port, bodies[i])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def kind_table(own):
    pred = by_label(own, "llmlb_prefix_cached_tokens_predicted_total", "kind")
    rep = by_label(own, "llmlb_prefix_cached_tokens_reported_total", "kind")
    rows = []
    for kind in sorted(set(pred) | set(rep)):
        p, r = pred.get(kind, 0), rep.get(kind, 0)
        rows.append({"kind": kind, "predicted": p, "reported": r,
                     "error": (p - r) / r if r else None})
    return rows


def features(args, fleet, tmp, rng):
    fleet.reset()
    proxy = Proxy(args, config(args, fleet, tmp, "least_connections"), tmp)
    try:
        systems = system_prompts(rng, 6, args.system_words)
        bodies = [body_of(rng, systems, MODEL, True) for _ in range(args.requests)]
        results = run_concurrent(args.proxy_port, bodies, args.concurrency, 900)
        time.sleep(1)
        own = proxy.metrics()
    finally:
        proxy.stop()
    failed = [r for r in results if not r or r["status"] != 200]
    return {"requests": len(bodies), "failed": len(failed),
            "first_failure": failed[0] if failed else None, "by_kind": kind_table(own),
            "unpredictable": by_label(own, "llmlb_prefix_unpredictable_total", "reason"),
            "branches": by_label(own, "llmlb_routing_decisions_total", "branch")}


def sequential(args, fleet, tmp, bodies):
    """One request at a time, llmlb's counters read after each answer, so
    predicted and reported cached tokens are summed per label. `bodies` is
    a list of (label, body)."""
    fleet.reset()
    proxy = Proxy(args, config(args, fleet, tmp, "least_connections"), tmp)
    per = {}
    pname, rname = ("llmlb_prefix_cached_tokens_predicted_total",
                    "llmlb_prefix_cached_tokens_reported_total")

    def counters(text):
        return (sum(v for _, v in samples(text, pname)), sum(v for _, v in samples(text, rname)),
                sum(v for _, v in samples(text, "llmlb_model_requests_total")))

    try:
        last = counters(proxy.metrics())
        for label, body in bodies:
            r = send(args.proxy_port, body)
            if r["status"] != 200:
                per.setdefault(label, {})
                per[label]["failed"] = per[label].get("failed", 0) + 1
                per[label].setdefault("first_failure", r)
                continue
            # The counters move when the answer's log line is written.
            for _ in range(50):
                now = counters(proxy.metrics())
                if now[2] > last[2]:
                    break
                time.sleep(0.02)
            p = per.setdefault(label, {})
            for k in ("predicted", "reported", "requests", "reported_by_replica"):
                p.setdefault(k, 0)
            p["predicted"] += now[0] - last[0]
            p["reported"] += now[1] - last[1]
            p["reported_by_replica"] += r["cached"] or 0
            p["requests"] += 1
            last = now
    finally:
        proxy.stop()
    for p in per.values():
        if p.get("reported"):
            p["error"] = (p["predicted"] - p["reported"]) / p["reported"]
    return per


def adapters(args, fleet, tmp, rng):
    """The base model and the two adapters in turn, on shared system prompts."""
    systems = system_prompts(rng, 3, args.system_words)
    bodies = []
    for i in range(args.adapter_requests):
        model = [MODEL, *ADAPTERS][i % 3]
        bodies.append((model, body_of(rng, systems, model, False)))
    return sequential(args, fleet, tmp, bodies)


def variants(args, fleet, tmp, rng):
    """Request fields the closed-loop kinds do not split out: `documents`
    (two shared document sets rendered before the messages), `cache_salt`
    (two tenants' salts on the same prompts: blocks never shared across
    salts), message content given as text parts, and plain requests beside
    them."""
    systems = system_prompts(rng, 3, args.system_words)
    doc_sets = [[{"title": f"Manual {k}.{d}",
                  "text": " ".join(rng.choice(WORDS) for _ in range(60))} for d in range(2)]
                for k in range(2)]
    bodies = []
    labels = ["documents", "cache_salt", "content_parts", "plain"]
    for i in range(args.variant_requests):
        label = labels[i % len(labels)]
        body = body_of(rng, systems, MODEL, False)
        if label == "documents":
            body["documents"] = rng.choice(doc_sets)
        elif label == "cache_salt":
            body["cache_salt"] = "tenant-" + rng.choice("ab")
        elif label == "content_parts":
            for m in body["messages"]:
                words = m["content"].split(" ")
                half = len(words) // 2
                m["content"] = [{"type": "text", "text": " ".join(words[:half]) + " "},
                                {"type": "text", "text": " ".join(words[half:])}]
        bodies.append((label, body))
    return sequential(args, fleet, tmp, bodies)


def doctor(args, fleet, tmp):
    """`llmlb doctor` on the same replicas: its plain, tools and
    chat_template_kwargs probes."""
    path = config(args, fleet, tmp, "least_connections")
    p = subprocess.run([args.llmlb, "doctor", "--config", path], capture_output=True, text=True,
                       timeout=300)
    return {"exit": p.returncode, "report": p.stdout.splitlines()}


def lora_info(port):
    """The running adapters of the replica's newest `vllm:lora_requests_info`
    series (vLLM values each series by when it was last set)."""
    _, text = request(port, "GET", "/metrics")
    newest = max(samples(text, "vllm:lora_requests_info"), key=lambda s: s[1], default=None)
    if newest is None:
        return frozenset()
    return frozenset(a for a in newest[0].get("running_lora_adapters", "").split(",") if a)


def observed_swaps(seen):
    """Adapter loads the replicas' own metric showed: per replica, each time
    the running set names an adapter the previous non-empty set did not."""
    swaps, last = 0, {}
    for port, running in seen:
        if not running:
            continue
        if port in last and running - last[port]:
            swaps += 1
        last[port] = running
    return swaps


def send_stream(port, body, request_id=None):
    """A streamed request: time to the first content chunk, and the usage."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"content-type": "application/json"}
    if request_id:
        headers["x-request-id"] = request_id
    t0 = time.time()
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers)
        r = c.getresponse()
        if r.status != 200:
            return {"status": r.status, "error": r.read().decode()[:300]}
        replica = r.getheader("x-llmlb-replica")
        ttft, usage = None, {}
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ttft is None and ev.get("choices"):
                ttft = time.time() - t0
            usage = ev.get("usage") or usage
        return {"status": 200, "ttft_s": ttft, "latency_s": time.time() - t0,
                "start": t0, "end": time.time(), "replica": replica,
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}
    finally:
        c.close()


def per_request(bodies, results, access):
    """One row per answered request: its adapter, replica, llmlb's routing
    branches, TTFT, prompt and cached tokens, and what ran on its replica
    when it was sent (seen from the client: requests sent there earlier and
    not yet answered), so the slow ones can be explained."""
    rows = []
    for i, (b, r) in enumerate(zip(bodies, results)):
        if not r or r["status"] != 200 or r["ttft_s"] is None:
            continue
        a = access.get(r.get("request_id", ""), {})
        rows.append({"i": i, "adapter": b["model"] if b["model"] != MODEL else "",
                     "replica": r["replica"], "branch": a.get("route") or a.get("branch", ""),
                     "ttft_ms": round(r["ttft_s"] * 1000), "start": r["start"], "end": r["end"],
                     "prompt": r["prompt_tokens"] or 0, "cached": r["cached"] or 0})
    for row in rows:
        ahead = [o for o in rows if o["replica"] == row["replica"]
                 and o["start"] < row["start"] < o["end"]]
        row["in_flight"] = len(ahead)
        # With --max-loras 1 a request of another adapter running there
        # makes this one wait for it to drain (base requests never wait).
        row["other_adapter"] = sum(1 for o in ahead if row["adapter"] and o["adapter"]
                                   and o["adapter"] != row["adapter"])
        # Requests sent there after it that got their first token first
        # (vLLM starts the running adapter's later requests before a
        # request waiting for a slot).
        first = row["start"] + row["ttft_ms"] / 1000
        row["overtaken"] = sum(1 for o in rows if o["replica"] == row["replica"]
                               and row["start"] < o["start"] and o["start"] + o["ttft_ms"] / 1000 < first)
    t0 = min((r["start"] for r in rows), default=0)
    for row in rows:
        row["start"], row["end"] = round(row["start"] - t0, 3), round(row["end"] - t0, 3)
    return rows


def tail_summary(rows, share):
    """What the slowest `share` of requests are made of, beside all of them."""
    def describe(xs):
        n = len(xs) or 1
        return {"requests": len(xs),
                "ttft_ms_min": min((x["ttft_ms"] for x in xs), default=None),
                "behind_other_adapter": sum(1 for x in xs if x["other_adapter"]),
                "overtaken": sum(1 for x in xs if x["overtaken"]),
                "mean_in_flight_at_send": round(sum(x["in_flight"] for x in xs) / n, 2),
                "mean_uncached_tokens": round(sum(x["prompt"] - x["cached"] for x in xs) / n),
                "full_miss": sum(1 for x in xs if x["cached"] == 0),
                "by_adapter": {k: sum(1 for x in xs if x["adapter"] == k)
                               for k in sorted({x["adapter"] for x in xs})},
                "by_branch": {k: sum(1 for x in xs if x["branch"] == k)
                              for k in sorted({x["branch"] for x in xs})}}
    slow = sorted(rows, key=lambda x: -x["ttft_ms"])[:max(1, round(len(rows) * share))]
    return {"tail": describe(slow), "all": describe(rows)}


def placement(args, fleet, tmp, rng, balancer, extra, run_no=0, binary=None):
    fleet.reset()
    proxy = Proxy(args, config(args, fleet, tmp, balancer, extra=extra, replica_header=True), tmp,
                  binary)
    seen = []
    try:
        systems = system_prompts(rng, 6, args.system_words)
        # Adapter popularity: the base model and two adapters, one hot.
        models = rng.choices([MODEL, *ADAPTERS], weights=[2, 5, 3], k=args.requests)
        bodies = [body_of(rng, systems, m, False, args.max_tokens) for m in models]
        done = threading.Event()

        def watch():
            while not done.is_set():
                for p in fleet.ports:
                    seen.append((p, lora_info(p)))
                time.sleep(0.2)

        w = threading.Thread(target=watch)
        w.start()
        ids = [f"run{run_no}-{i}" for i in range(len(bodies))]
        results = run_concurrent(args.proxy_port, bodies, args.concurrency, 900, send_stream, ids)
        done.set()
        w.join()
        for rid, r in zip(ids, results):
            if r:
                r["request_id"] = rid
        time.sleep(1)
        own = proxy.metrics()
        rows = per_request(bodies, results, proxy.access(f"run{run_no}-"))
    finally:
        proxy.stop()
    ok = [r for r in results if r and r["status"] == 200 and r["ttft_s"] is not None]

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None

    ttft = [r["ttft_s"] for r in ok]
    swaps = by_label(own, "llmlb_lora_swaps_total", "pool")
    return {"balancer": balancer, "extra": extra, "binary": binary or args.llmlb,
            "requests": len(bodies), "completed": len(ok),
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
            "ttft_p99_s": pct(ttft, 0.99), "latency_p99_s": pct([r["latency_s"] for r in ok], 0.99),
            "llmlb_swaps_caused": sum(swaps.values()), "replica_adapter_loads_seen": observed_swaps(seen),
            "branches": by_label(own, "llmlb_routing_decisions_total", "branch"),
            "by_kind": kind_table(own), "lora_info_samples": len(seen),
            "slowest_5pct": tail_summary(rows, 0.05), "slowest_1pct": tail_summary(rows, 0.01)["tail"],
            "per_request": rows,
            # Every TTFT (ms), so runs of one balancer can be pooled.
            "ttft_ms": sorted(round(t * 1000) for t in ttft)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llmlb", default=os.path.join(ROOT, "target", "release", "llmlb"))
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--adapter-requests", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=220)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--placement", action="store_true")
    ap.add_argument("--max-tokens", type=int,
                    help="answer length of the placement workload (default 4, may stop early)")
    ap.add_argument("--variant-requests", type=int, default=80)
    ap.add_argument("--steps", default="features,adapters,variants,doctor",
                    help="which of features, adapters, variants, doctor to run (comma-separated)")
    ap.add_argument("--balancers", default="least_connections")
    ap.add_argument("--replica-port", type=int, default=18000)
    ap.add_argument("--events-port", type=int, default=5557)
    ap.add_argument("--subscribe-port", type=int, default=15587)
    ap.add_argument("--replay-port", type=int, default=15597)
    ap.add_argument("--proxy-port", type=int, default=18090)
    ap.add_argument("--json")
    ap.add_argument("--adapters", help="reuse (or write once) the adapters in this directory")
    ap.add_argument("--start-timeout", type=int, default=vllm_replica.start_wait(),
                    help="seconds to wait for each vLLM replica (default VLLM_START_WAIT, else 900)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="llmlb-exact-features-")
    fleet = Fleet(args, tmp)
    out = {"machine": {"cores": os.cpu_count(), "load": open("/proc/loadavg").read().split()[:3]},
           "args": vars(args)}
    try:
        fleet.start()
        steps = args.steps.split(",")
        if "features" in steps:
            out["features"] = features(args, fleet, tmp, random.Random(args.seed))
            log(json.dumps(out["features"], indent=1))
        if "adapters" in steps:
            out["adapters"] = adapters(args, fleet, tmp, random.Random(args.seed + 1))
            log(json.dumps(out["adapters"], indent=1))
        if "variants" in steps:
            out["variants"] = variants(args, fleet, tmp, random.Random(args.seed + 3))
            log(json.dumps(out["variants"], indent=1))
        if "doctor" in steps:
            out["doctor"] = doctor(args, fleet, tmp)
            log("\n".join(out["doctor"]["report"]))
        if args.placement:
            out["placement"] = []
            for n, b in enumerate(args.balancers.split(",")):
                name, _, extra = b.partition(":")
                name, _, binary = name.partition("@")
                r = placement(args, fleet, tmp, random.Random(args.seed + 2), name,
                              extra.replace(";", "\n"), n, binary or None)
                out["placement"].append(r)
                log(json.dumps({k: v for k, v in r.items() if k not in ("per_request", "ttft_ms")},
                               indent=1))
    finally:
        fleet.stop()
    out["load_after"] = open("/proc/loadavg").read().split()[:3]
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
