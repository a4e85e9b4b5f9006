#!/usr/bin/env python3
"""What a cached prefix adds to a prefill: one replica (vLLM or
`llmlb replica-sim`), one request at a time, `max_tokens` 1, prompts as
token ids. For each suffix length and prefix length, a fresh random prefix
is sent twice with different suffixes: the first request computes the
whole prompt ("cold"), the second finds the prefix cached ("hit"). Prints
the median and lowest client-side time per case and the cached tokens the
replica reported (`usage.prompt_tokens_details.cached_tokens`).

usage: scripts/cached_prefix_probe.py PORT [REPS] [SEED]
Only 127.0.0.1; REPS pairs per case (default 10); every request times out
after 60 s. Only the standard library.
"""
import json
import random
import statistics
import sys
import time
import urllib.request

SUFFIXES = (16, 256)
PREFIXES = (0, 384, 768, 1152, 1536)


def send(port, tokens):
    body = json.dumps({"model": "tiny-llama", "prompt": tokens, "max_tokens": 1,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        d = json.loads(r.read())
    ms = (time.perf_counter() - t) * 1000
    details = (d.get("usage") or {}).get("prompt_tokens_details") or {}
    return ms, details.get("cached_tokens")


def main():
    port = int(sys.argv[1])
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    toks = lambda n: [rng.randrange(100, 1000) for _ in range(n)]
    res = {}
    for suffix in SUFFIXES:
        for prefix in PREFIXES:
            for _ in range(reps):
                p = toks(prefix)
                for case in ("cold", "hit"):
                    res.setdefault(f"{case} {prefix}+{suffix}", []).append(send(port, p + toks(suffix)))
                    time.sleep(0.03)
    for k, v in res.items():
        ms = [x[0] for x in v]
        cached = sorted({x[1] for x in v}, key=str)
        print(f"{k:14s} median {statistics.median(ms):7.2f} ms  lowest {min(ms):7.2f}  cached {cached}")


if __name__ == "__main__":
    main()
