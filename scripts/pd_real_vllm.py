#!/usr/bin/env python3
"""Sends the same long prompts through llmlb, streamed and greedy, and
prints each answer's text, time to first token, inter-token gaps and the
replica's reported cached tokens, as JSON lines.

Usage: pd_real_vllm.py URL N_PROMPTS PROMPT_WORDS MAX_TOKENS CONCURRENCY OUT.jsonl
"""
import json
import sys
import threading
import time
import urllib.request

url, n, words, max_tokens, conc, out = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]

VOCAB = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def prompt(i):
    # Distinct from the first word on: no prefix shared between prompts.
    return " ".join(f"{VOCAB[(i * 7 + k * 3) % len(VOCAB)]}{(i * 31 + k) % 97}" for k in range(words))


def one(i):
    body = json.dumps({
        "model": "tiny-llama", "prompt": prompt(i), "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, last, gaps, text, usage = None, None, [], [], None
    with urllib.request.urlopen(req, timeout=300) as r:
        replica = r.headers.get("x-llmlb-replica")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                if c.get("text"):
                    now = time.perf_counter()
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                    text.append(c["text"])
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"i": i, "ttft": first, "gaps": gaps, "text": "".join(text), "replica": replica,
            "prompt_tokens": (usage or {}).get("prompt_tokens"), "cached_tokens": cached}


results, lock, nxt = [], threading.Lock(), [0]


def worker():
    while True:
        with lock:
            i = nxt[0]
            nxt[0] += 1
        if i >= n:
            return
        r = one(i)
        with lock:
            results.append(r)


threads = [threading.Thread(target=worker) for _ in range(conc)]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
with open(out, "w") as f:
    for r in sorted(results, key=lambda r: r["i"]):
        f.write(json.dumps(r) + "\n")
ttfts = sorted(r["ttft"] for r in results)
gaps = sorted(g for r in results for g in r["gaps"])
pct = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] * 1000
print(json.dumps({"requests": n, "concurrency": conc, "wall_s": round(wall, 2),
                  "ttft_p50_ms": round(pct(ttfts, 0.5), 1), "ttft_p99_ms": round(pct(ttfts, 0.99), 1),
                  "itl_p50_ms": round(pct(gaps, 0.5), 2), "itl_p99_ms": round(pct(gaps, 0.99), 2),
                  "prompt_tokens_mean": sum(r["prompt_tokens"] or 0 for r in results) / n,
                  "cached_tokens_mean": sum(r["cached_tokens"] or 0 for r in results) / n}))
