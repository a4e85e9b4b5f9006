#!/usr/bin/env python3
"""Inclusive share of each frame (counted once per stack) in a folded file.

Usage: perf_inclusive.py stacks.folded [REGEX [TOP]]
"""
import sys, re, collections
path = sys.argv[1]; pat = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
total = 0; incl = collections.Counter()
for line in open(path):
    stack, n = line.rsplit(" ", 1); n = int(n); total += n
    seen = set()
    for f in stack.split(";"):
        f = re.sub(r"\{\{closure\}\}", "{closure}", f)
        if f in seen: continue
        seen.add(f)
        if pat is None or pat.search(f): incl[f] += n
for f, n in incl.most_common(int(sys.argv[3]) if len(sys.argv) > 3 else 60):
    print(f"{100*n/total:6.2f}%  {f[:150]}")
print("total samples", total)
