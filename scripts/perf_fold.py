#!/usr/bin/env python3
"""Folds `perf script` output into "frame;frame;... count" lines (root first).

Usage: perf script -i perf.data | perf_fold.py > stacks.folded
"""
import sys, re
stacks = {}
cur = []
def flush():
    if cur:
        key = ";".join(reversed(cur))
        stacks[key] = stacks.get(key, 0) + 1
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush(); cur = []
        continue
    if line.startswith("\t") or line.startswith(" "):
        parts = line.strip().split(None, 1)
        if len(parts) < 2: continue
        sym = parts[1]
        sym = re.sub(r"\s+\(\S*\)$", "", sym)       # drop (dso)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
        sym = sym.replace(";", ":")
        cur.append(sym)
    else:
        flush(); cur = []
flush()
for k, v in stacks.items():
    print(f"{k} {v}")
