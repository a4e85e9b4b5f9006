#!/usr/bin/env bash
# The one-way layers of docs/ARCHITECTURE.md ("Allowed imports"), checked on
# the source: each rule names a group of modules and the modules none of
# them may import (`crate::NAME`, in `use` lines and paths alike). No
# exceptions: a violation is fixed in the code, not listed here.
set -euo pipefail
cd "$(dirname "$0")/.."

# The daemon's top: only `server`, `admin`, `demo` and `main.rs` may import these.
TOP='server|forwarding|admin'
# Loops that run beside the request path.
LOOPS='background|discovery'
# Tools that stand beside the proxy.
TOOLS='sim|bench|simulate|demo|calibrate'

failed=0
# rule GROUP FORBIDDEN: no file under src/<each of GROUP> imports crate::<FORBIDDEN>.
rule() {
  local group=$1 forbidden=$2 paths=()
  for m in $group; do
    if [[ -d src/$m ]]; then paths+=("src/$m"); elif [[ -f src/$m.rs ]]; then paths+=("src/$m.rs"); fi
  done
  local hits
  hits=$(grep -rnE "crate::($forbidden)\b" "${paths[@]}" || true)
  if [[ -n "$hits" ]]; then
    echo "layer violation: {$group} may not import crate::{$forbidden}"
    echo "$hits" | sed 's/^/  /'
    failed=1
  fi
}

# The bottom: plumbing, settings, metrics, tokenizers, the KV-event wire.
rule "net config telemetry tokenize tokenizer kv_events" \
  "$TOP|$LOOPS|$TOOLS|gateway|routing|admission|balancing|signals|health"
# Replica state and what feeds it.
rule "balancing signals health" "$TOP|$LOOPS|$TOOLS|gateway|routing|admission"
# The request path's stages below the edge.
rule "admission" "$TOP|$LOOPS|$TOOLS|routing"
rule "gateway routing" "$TOP|$LOOPS|$TOOLS"
rule "forwarding" "server|admin|$LOOPS|$TOOLS|gateway"
# Background loops get handles, not the daemon's state.
rule "background discovery" "$TOP|$TOOLS|gateway|admission"
# The simulator and the load generator never import the proxy.
rule "sim bench" "$TOP|$LOOPS|simulate|demo|calibrate|gateway|routing|admission|balancing|signals|health"
rule "simulate" "$TOP|$LOOPS|demo|gateway|calibrate"
# Calibration probes a replica with the load generator's client and writes
# a simulator profile: nothing of the proxy.
rule "calibrate" "$TOP|$LOOPS|simulate|demo|gateway|routing|admission|balancing|signals|health"

if [[ $failed -ne 0 ]]; then
  exit 1
fi
echo "layers: ok"
