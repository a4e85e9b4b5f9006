#!/usr/bin/env python3
"""Folded stacks ("a;b;c COUNT" lines) to a flame graph SVG (root at the bottom).

Usage: flamegraph.py TITLE < stacks.folded > out.svg
"""
import html, sys, zlib

title = sys.argv[1] if len(sys.argv) > 1 else "flame graph"
root = {"n": 0, "kids": {}}
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line:
        continue
    stack, _, count = line.rpartition(" ")
    n = int(count)
    root["n"] += n
    node = root
    for frame in stack.split(";"):
        node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
        node["n"] += n

WIDTH, ROW, PAD = 1600, 16, 30
total = max(root["n"], 1)
rects = []

def depth(node):
    return 1 + max((depth(k) for k in node["kids"].values()), default=0)

levels = depth(root)
height = levels * ROW + PAD * 2

def walk(node, x, level):
    for name, kid in sorted(node["kids"].items()):
        w = kid["n"] / total * (WIDTH - 20)
        if w >= 0.3:
            rects.append((name, x, level, w, kid["n"]))
            walk(kid, x, level + 1)
        x += w

walk(root, 10.0, 0)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
       f'font-family="monospace" font-size="11">',
       f'<rect width="100%" height="100%" fill="#fdfdf6"/>',
       f'<text x="{WIDTH/2}" y="18" text-anchor="middle" font-size="14">{html.escape(title)}'
       f' ({total} samples; hover a frame for its share)</text>']
for name, x, level, w, n in rects:
    y = height - PAD - (level + 1) * ROW
    h = zlib.crc32(name.encode()) 
    color = f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{40 + (h >> 16) % 50})"
    label = html.escape(name)
    share = 100.0 * n / total
    out.append(f'<g><title>{label} ({n} samples, {share:.2f}%)</title>'
               f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW-1}" fill="{color}"/>')
    chars = int(w / 6.6)
    if chars >= 3:
        text = name if len(name) <= chars else name[: chars - 2] + ".."
        out.append(f'<text x="{x+2:.1f}" y="{y+ROW-4}">{html.escape(text)}</text>')
    out.append("</g>")
out.append("</svg>")
print("\n".join(out))
