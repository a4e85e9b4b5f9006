#!/usr/bin/env python3
"""Checks of the files in deploy/ that no schema validator covers; called by
scripts/validate-manifests.sh.

  deploy_checks.py configmaps OUTDIR MANIFEST...
      Writes the TOML of every ConfigMap key ending in .toml to
      OUTDIR/<manifest>--<configmap>--<key>, one path per line on stdout, so
      `llmlb check` can run on each. Fails when a manifest holds no such key
      although it mounts a config (a ConfigMap named llmlb-*).

  deploy_checks.py metric-names SRC_DIR DASHBOARD.json RULES.yml...
      Every metric name used in the dashboard's PromQL and in the alert rules
      must be one that llmlb exports or one of vLLM's (both as named in the
      Rust sources under SRC_DIR; histogram and counter suffixes allowed), a
      recording rule defined in RULES, or Prometheus' own `up`.

Needs PyYAML (installed by validate-manifests.sh).
"""
import json
import os
import re
import sys

import yaml

SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on",
                "ignoring", "group_left", "group_right", "inf", "nan", "le"}


def configmaps(outdir, manifests):
    os.makedirs(outdir, exist_ok=True)
    failed = False
    for path in manifests:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            if doc.get("kind") != "ConfigMap":
                continue
            name = doc["metadata"]["name"]
            tomls = {k: v for k, v in (doc.get("data") or {}).items() if k.endswith(".toml")}
            if name.startswith("llmlb") and not tomls:
                print(f"{path}: ConfigMap {name} has no *.toml key", file=sys.stderr)
                failed = True
            for key, text in tomls.items():
                base = os.path.basename(path).rsplit(".", 1)[0]
                parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
                out = os.path.join(outdir, f"{parent}-{base}--{name}--{key}")
                with open(out, "w") as f:
                    f.write(text)
                print(out)
    return 1 if failed else 0


def known_names(src_dir):
    pattern = re.compile(r'"((?:llmlb_|vllm:)[a-z0-9_:]+)"')
    names = set()
    for root, _, files in os.walk(src_dir):
        for fname in files:
            if fname.endswith(".rs"):
                with open(os.path.join(root, fname)) as f:
                    names.update(pattern.findall(f.read()))
    return names


def metric_refs(expr):
    """Metric names referenced by one PromQL expression."""
    e = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)      # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                      # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                     # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    refs = []
    for m in re.finditer(r"(?<![\w$.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        refs.append(word)
    return refs


def dashboard_exprs(dash):
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query" and q:
            inner = re.match(r"label_values\((.*),\s*\w+\)$", q)
            out.append((f"variable {var['name']}", inner.group(1) if inner else q))
    return out


def metric_names(src_dir, dashboard, rule_files):
    known = known_names(src_dir)
    if not any(n.startswith("llmlb_") for n in known) or not any(n.startswith("vllm:") for n in known):
        print(f"found no metric names under {src_dir}", file=sys.stderr)
        return 1
    exprs = []
    records = {"up"}
    with open(dashboard) as f:
        dash = json.load(f)
    exprs += [(f"{dashboard}: {where}", e) for where, e in dashboard_exprs(dash)]
    for path in rule_files:
        with open(path) as f:
            doc = yaml.safe_load(f)
        if "groups" not in doc:
            continue
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    records.add(rule["record"])
                exprs.append((f"{path}: {rule.get('alert') or rule.get('record')}", rule["expr"]))
    unknown = 0
    for where, expr in exprs:
        refs = metric_refs(expr)
        if not refs:
            print(f"{where}: no metric in {expr!r}", file=sys.stderr)
            unknown += 1
        for name in refs:
            if name in records or any(name == k + s for k in known for s in SUFFIXES):
                continue
            print(f"{where}: unknown metric {name}", file=sys.stderr)
            unknown += 1
    print(f"{len(exprs)} PromQL expressions, metric names checked against "
          f"{len(known)} names exported by llmlb and vLLM")
    return 1 if unknown else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "configmaps":
        return configmaps(argv[2], argv[3:])
    if len(argv) >= 4 and argv[1] == "metric-names":
        return metric_names(argv[2], argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
