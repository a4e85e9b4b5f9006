#!/usr/bin/env python3
"""Checks README.md and docs/ the way a reader would use them.

1. Every relative link resolves to a file, and every #anchor to a heading
   of that file (GitHub's anchor rules).
2. Every ```toml block is a config `llmlb check` accepts, unless its fence
   says it is a fragment (```toml fragment): a piece of a config shown
   alone, or a replica-sim profile (```toml replica-sim), which is not an
   llmlb config (the profiles in config/sim/ are loaded by the tests).
3. A block introduced by a line "`config/NAME.toml`:" is that file.
4. The README's quick path (the ```sh block after `<!-- quick-path -->`)
   runs verbatim in a scratch copy of the repository's config/, with
   `./target/release/llmlb` standing for the binary under test, and every
   command in it succeeds.

Usage: scripts/check_docs.py [--bin PATH] [--skip-quick-path]
  --bin PATH   the llmlb binary (default: target/release/llmlb, else
               target/debug/llmlb)
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(```+|~~~+)\s*([^\s`]*)\s*(.*)$")
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def doc_files():
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return files


def blocks_and_text(text):
    """(prose lines with code blocks blanked, [(info, rest, first line, body)])."""
    prose, blocks = [], []
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = (m.group(1), m.group(2), m.group(3), n, [])
            prose.append("")
        elif fence is not None and line.startswith(fence[0]) and line.strip() == fence[0]:
            blocks.append((fence[1], fence[2], fence[3], "\n".join(fence[4])))
            fence = None
            prose.append("")
        elif fence is not None:
            fence[4].append(line)
            prose.append("")
        else:
            prose.append(line)
    return prose, blocks


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        prose, _ = blocks_and_text(path.read_text())
        seen, found = {}, set()
        for line in prose:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            k = seen.get(s, 0)
            found.add(s if k == 0 else f"{s}-{k}")
            seen[s] = k + 1
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', path.read_text()):
            found.add(m.group(1))
        cache[path] = found
    return cache[path]


def check_links(errors):
    for f in doc_files():
        prose, _ = blocks_and_text(f.read_text())
        for n, line in enumerate(prose, 1):
            line = re.sub(r"`[^`]*`", "", line)
            for m in LINK.finditer(line):
                target = m.group(1) or m.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                path_part, _, frag = target.partition("#")
                dest = (f.parent / path_part).resolve() if path_part else f
                where = f"{f.relative_to(ROOT)}:{n}"
                if not dest.exists():
                    errors.append(f"{where}: link to {target}: {path_part} does not exist")
                    continue
                if frag and dest.suffix == ".md" and frag not in anchors(dest):
                    errors.append(f"{where}: link to {target}: no heading with anchor #{frag}")


def check_toml(binary, errors):
    with tempfile.TemporaryDirectory() as tmp:
        for f in doc_files():
            _, blocks = blocks_and_text(f.read_text())
            for info, rest, line, body in blocks:
                if info != "toml" or {"fragment", "replica-sim"} & set(rest.split()):
                    continue
                path = Path(tmp) / "block.toml"
                path.write_text(body + "\n")
                where = f"{f.relative_to(ROOT)}:{line}"
                cmd = [binary, "check", "--config", str(path)]
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
                if r.returncode != 0:
                    msg = (r.stderr or r.stdout).strip().replace(str(path), "block")
                    errors.append(
                        f"{where}: this TOML block is not a valid config (mark it ```toml fragment "
                        f"if it is a piece of one):\n    {msg}"
                    )


def shown_files(errors):
    """A block introduced by a line "`config/NAME.toml`:" is that file, verbatim."""
    for f in doc_files():
        text = f.read_text()
        for m in re.finditer(r"^`(config/[^`]+)`:\s*$", text, re.M):
            _, blocks = blocks_and_text(text[m.end():])
            shown = blocks[0][3] + "\n" if blocks else ""
            path = ROOT / m.group(1)
            if not path.exists() or path.read_text() != shown:
                errors.append(f"{f.relative_to(ROOT)}: the block shown as {m.group(1)} differs from the file")


def quick_path(binary, errors):
    text = (ROOT / "README.md").read_text()
    marker = text.find("<!-- quick-path -->")
    if marker < 0:
        errors.append("README.md: no <!-- quick-path --> block")
        return
    _, blocks = blocks_and_text(text[marker:])
    if not blocks or blocks[0][0] != "sh":
        errors.append("README.md: the block after <!-- quick-path --> is not ```sh")
        return
    script = blocks[0][3]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "config", Path(tmp) / "config")
        (Path(tmp) / "target" / "release").mkdir(parents=True)
        os.symlink(os.path.abspath(binary), Path(tmp) / "target" / "release" / "llmlb")
        # Every command must succeed; background jobs are stopped on exit.
        wrapped = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script + "\n"
        r = subprocess.run(
            ["bash", "-c", wrapped],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0:
            errors.append(
                f"README.md quick path failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
        else:
            print(r.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--skip-quick-path", action="store_true")
    args = ap.parse_args()
    binary = args.bin
    if binary is None:
        for b in ("target/release/llmlb", "target/debug/llmlb"):
            if (ROOT / b).exists():
                binary = str(ROOT / b)
                break
    if binary is None:
        sys.exit("no llmlb binary: build one or pass --bin")
    errors = []
    check_links(errors)
    check_toml(binary, errors)
    shown_files(errors)
    if not args.skip_quick_path:
        quick_path(binary, errors)
    for e in errors:
        print(e)
    if errors:
        print(f"docs: {len(errors)} problem(s)")
        sys.exit(1)
    print("docs: links, TOML blocks and the README quick path are ok")


if __name__ == "__main__":
    main()
