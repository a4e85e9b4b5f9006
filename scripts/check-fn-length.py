#!/usr/bin/env python3
"""No function on the request path longer than a screen and a half.

Usage: check-fn-length.py [--max N] [--list] [DIR...]

Reports every non-test `fn` in the Rust files under each DIR (default: the
request path, src/{server,forwarding,routing,pool,admission,balancing})
whose span, from the line with `fn` to its closing brace, is longer than N
lines (default 80), and exits 1 if there is one. `--list` prints the
longest functions found whatever their length.

Test code is not checked: items under `#[cfg(test)]` (an inline test module,
a test-only function) or marked `#[test]`/`#[tokio::test]`, and files
declared as test-only modules (`#[cfg(test)] mod name;`). Comments, strings
and character literals are blanked before braces are matched.
"""
import os
import re
import sys

REQUEST_PATH = ["server", "forwarding", "routing", "pool", "admission", "balancing"]
TEST_ATTR = re.compile(r"#\[\s*(cfg\s*\(\s*test\s*\)|test|tokio::test\b[^\]]*)\s*\]")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
MOD_DECL = re.compile(r"\s*(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*;")


def blank(text):
    """The text with comments, string and char literals replaced by spaces
    (newlines kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}', b'x') or a lifetime ('a).
            m = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", re.S).match(text, i)
            if m:
                wipe(i, m.end())
                i = m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching(text, open_at):
    """Offset just past the brace that closes the one at `open_at`."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def item_end(text, start):
    """Offset past the item starting at `start`: its closing brace, or its
    `;` when one comes before any brace (a declaration)."""
    brace, semi = text.find("{", start), text.find(";", start)
    if brace < 0 or (0 <= semi < brace):
        return (semi + 1) if semi >= 0 else len(text)
    return matching(text, brace)


def skip_attrs(text, at):
    """Offset of the first token after the attributes starting at `at`."""
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if text.startswith("#[", at):
            depth, k = 0, at + 1
            while k < len(text):
                if text[k] == "[":
                    depth += 1
                elif text[k] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            at = k + 1
        else:
            return at


def functions(path):
    """(name, first line, lines) of every non-test function in `path`, and
    the test-only module files it declares."""
    text = blank(open(path, encoding="utf-8").read())
    tests, test_files = [], []
    for m in TEST_ATTR.finditer(text):
        start = skip_attrs(text, m.end())
        decl = MOD_DECL.match(text, start)
        if decl:
            test_files.append(decl.group(1))
        tests.append((start, item_end(text, start)))
    found = []
    for m in FN.finditer(text):
        at = m.start()
        if any(a <= at < b for a, b in tests):
            continue
        # The body: the first `{` after the signature, unless a `;` ends it first.
        depth, k, body = 0, m.end(), None
        while k < len(text):
            ch = text[k]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1 if ch != ">" or text[k - 1] != "-" else 0
            elif ch == ";" and depth <= 0:
                break
            elif ch == "{" and depth <= 0:
                body = k
                break
            k += 1
        if body is None:
            continue
        end = matching(text, body)
        first = text.count("\n", 0, at) + 1
        last = text.count("\n", 0, end - 1) + 1
        found.append((m.group(1), first, last - first + 1))
    return found, test_files


def main(argv):
    limit, listing, roots = 80, False, []
    args = iter(argv)
    for a in args:
        if a == "--max":
            limit = int(next(args))
        elif a == "--list":
            listing = True
        else:
            roots.append(a)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = roots or [os.path.join(here, "src", d) for d in REQUEST_PATH]
    results, test_only = [], set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                fns, test_mods = functions(path)
                # `mod x;` in dir/mod.rs or dir.rs names dir/x.rs or dir/x/.
                base = dirpath if name in ("mod.rs", "lib.rs", "main.rs") else path[:-3]
                for t in test_mods:
                    test_only.add(os.path.join(base, t + ".rs"))
                    test_only.add(os.path.join(base, t))
                results += [(path, *f) for f in fns]
    def is_test(path):
        return any(path == t or path.startswith(t + os.sep) for t in test_only)
    results = [r for r in results if not is_test(r[0])]
    rel = lambda p: os.path.relpath(p, here)
    if listing:
        for path, name, line, n in sorted(results, key=lambda r: -r[3])[:20]:
            print(f"{n:4d}  {rel(path)}:{line} {name}")
        return 0
    over = [r for r in results if r[3] > limit]
    for path, name, line, n in sorted(over):
        print(f"{rel(path)}:{line}: fn {name} is {n} lines (at most {limit})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
