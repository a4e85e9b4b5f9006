#!/usr/bin/env bash
# Validates everything under deploy/ offline, and exits non-zero on the first
# kind of failure it finds (after reporting every file of that kind):
#   1. every Kubernetes manifest against the API schemas of two Kubernetes
#      versions, strictly (unknown fields are errors), with kubernetes-validate
#      (PyPI; it ships the schemas, so no network at validation time);
#   2. the llmlb config embedded in every ConfigMap, with `llmlb check`;
#   3. the Prometheus scrape config and alert rules with promtool
#      (`check config`, `check rules`, and the rule unit tests);
#   4. the Grafana dashboard: valid JSON, and every metric name in its PromQL
#      and in the alert rules exported by llmlb or vLLM;
#   5. the systemd unit, with systemd-analyze verify where systemd exists.
# The container image (deploy/Dockerfile) is not built here.
# It installs what it needs into target/deploy-tools (a Python venv from PyPI,
# promtool unpacked from Debian's prometheus package without installing the
# server) and reuses it on the next run.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSIONS=${K8S_VERSIONS:-"1.29.0 1.37.0"}
KUBERNETES_VALIDATE_VERSION=1.37.0
TOOLS=${LLMLB_DEPLOY_TOOLS:-$PWD/target/deploy-tools}
mkdir -p "$TOOLS"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- tools ---------------------------------------------------------------
VENV=$TOOLS/venv
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KUBERNETES_VALIDATE_VERSION"; then
    echo "== installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        as_root apt-get install -y -q python3-venv >/dev/null
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
PY=$VENV/bin/python

PROMTOOL=$(command -v promtool || true)
if [ -z "$PROMTOOL" ]; then
    PROMTOOL=$TOOLS/prometheus/usr/bin/promtool
    if [ ! -x "$PROMTOOL" ]; then
        echo "== fetching promtool from Debian's prometheus package (unpacked, not installed)"
        (
            cd "$TOOLS"
            apt-get download prometheus >/dev/null 2>&1 \
                || { as_root apt-get update -q >/dev/null && apt-get download prometheus >/dev/null 2>&1; }
            dpkg-deb -x prometheus_*.deb prometheus
            rm -f prometheus_*.deb
        )
    fi
fi

echo "== cargo build --bin llmlb"
cargo build --quiet --bin llmlb
LLMLB=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/llmlb

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0

# --- 1. Kubernetes schemas -----------------------------------------------
mapfile -t MANIFESTS < <(find deploy/kubernetes -name '*.yaml' -o -name '*.yml' | sort)
[ "${#MANIFESTS[@]}" -gt 0 ] || { echo "no manifests under deploy/kubernetes"; exit 1; }
for v in $K8S_VERSIONS; do
    echo "== kubernetes-validate --strict -k $v (${#MANIFESTS[@]} files)"
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "${MANIFESTS[@]}" || fail=1
done
[ "$fail" = 0 ] || { echo "FAILED: Kubernetes schema validation"; exit 1; }

# --- 2. llmlb configs inside ConfigMaps ----------------------------------
echo "== llmlb check on every ConfigMap's TOML"
mapfile -t TOMLS < <("$PY" scripts/deploy_checks.py configmaps "$WORK/configs" "${MANIFESTS[@]}")
[ "${#TOMLS[@]}" -gt 0 ] || { echo "no llmlb config found in any ConfigMap"; exit 1; }
for t in "${TOMLS[@]}"; do
    "$LLMLB" check --config "$t" >/dev/null 2>"$WORK/check.err" \
        && echo "   ok   $(basename "$t")" \
        || { echo "   FAIL $(basename "$t")"; cat "$WORK/check.err"; fail=1; }
done
[ "$fail" = 0 ] || { echo "FAILED: llmlb check"; exit 1; }

# --- 3. Prometheus -------------------------------------------------------
echo "== promtool ($("$PROMTOOL" --version 2>&1 | head -1))"
"$PROMTOOL" check rules deploy/prometheus/llmlb-alerts.yml || fail=1
(cd deploy/prometheus && "$PROMTOOL" test rules llmlb-alerts.test.yml) || fail=1
if ! "$PROMTOOL" check config deploy/prometheus/prometheus.yml >"$WORK/promcfg.out" 2>&1; then
    if grep -q 'field kubernetes_sd_configs not found' "$WORK/promcfg.out"; then
        # Debian builds Prometheus without Kubernetes discovery; check the
        # rest of the file with the discovery blocks swapped for empty
        # static targets.
        echo "   (this promtool lacks kubernetes_sd_configs; checking the rest of prometheus.yml)"
        "$PY" - deploy/prometheus/prometheus.yml "$WORK/prometheus.yml" <<'PYEOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
for job in doc.get("scrape_configs", []):
    if job.pop("kubernetes_sd_configs", None) is not None:
        job["static_configs"] = [{"targets": []}]
yaml.safe_dump(doc, open(sys.argv[2], "w"))
PYEOF
        cp deploy/prometheus/llmlb-alerts.yml "$WORK/"
        "$PROMTOOL" check config "$WORK/prometheus.yml" || fail=1
    else
        cat "$WORK/promcfg.out"
        fail=1
    fi
else
    cat "$WORK/promcfg.out"
fi
[ "$fail" = 0 ] || { echo "FAILED: promtool"; exit 1; }

# --- 4. Grafana dashboard ------------------------------------------------
echo "== Grafana dashboard"
for d in deploy/grafana/*.json; do
    "$PY" -m json.tool "$d" >/dev/null || { echo "   invalid JSON: $d"; fail=1; }
    "$PY" scripts/deploy_checks.py metric-names src "$d" deploy/prometheus/llmlb-alerts.yml || fail=1
done
[ "$fail" = 0 ] || { echo "FAILED: dashboard"; exit 1; }

# --- 5. systemd unit ----------------------------------------------------
if command -v systemd-analyze >/dev/null; then
    echo "== systemd-analyze verify deploy/systemd/llmlb.service"
    # Point the unit at the binary just built; any warning is a failure.
    sed "s#/usr/local/bin/llmlb#$LLMLB#g" deploy/systemd/llmlb.service >"$WORK/llmlb.service"
    if ! systemd-analyze verify "$WORK/llmlb.service" >"$WORK/unit.out" 2>&1 || [ -s "$WORK/unit.out" ]; then
        cat "$WORK/unit.out"
        echo "FAILED: systemd unit"
        exit 1
    fi
else
    echo "== systemd-analyze not found: systemd unit not checked"
fi

echo "deploy/ is valid"
