#!/usr/bin/env python3
"""A Mooncake-format trace (timestamp ms, input_length, output_length,
hash_ids) where one system prompt is hot: a share `--hot` of the requests
start with it, the rest with one of `--cold` other system prompts. Every
prompt is `--system-blocks` shared blocks of 512 tokens plus one block of its
own; Poisson arrivals at `--rate` requests/s. For `llmlb fleet-sim --trace`.

Usage: scripts/skewed_trace.py --rate 80 > skew-80.jsonl
Only the standard library.
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, required=True, help="requests per second")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--hot", type=float, default=0.5, help="share of requests with the hot prompt")
    ap.add_argument("--cold", type=int, default=30, help="other system prompts")
    ap.add_argument("--system-blocks", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    t, own = 0.0, 1_000_000
    block = 512
    for _ in range(a.requests):
        t += rnd.expovariate(a.rate) * 1000
        group = 0 if rnd.random() < a.hot else rnd.randrange(1, a.cold + 1)
        ids = [group * a.system_blocks + j for j in range(a.system_blocks)] + [own]
        own += 1
        sys.stdout.write(json.dumps({
            "timestamp": int(t),
            "input_length": (a.system_blocks + 1) * block,
            "output_length": a.output_len,
            "hash_ids": ids,
        }) + "\n")


if __name__ == "__main__":
    main()
