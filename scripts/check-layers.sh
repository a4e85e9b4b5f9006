#!/usr/bin/env bash
# The one-way layers of docs/ARCHITECTURE.md ("Allowed imports"), checked on
# the source: each rule names a group of modules and the modules none of
# them may import (`crate::NAME`, in `use` lines and paths alike). No
# exceptions: a violation is fixed in the code, not listed here.
#
# A file's unit tests (a `#[cfg(test)]` module declared inline, which by
# convention closes the file) are not checked: like dev-dependencies, they
# may build their fixtures from a higher layer (routing's tests route on a
# `pool::Topology` built from config text).
set -euo pipefail
cd "$(dirname "$0")/.."

# The edge and the daemon: nothing below imports these.
TOP='server|forwarding|admin|daemon'
# Loops that run beside the request path and write replica state.
LOOPS='signals|health|discovery'
# Tools that stand beside the proxy.
TOOLS='replica_sim|bench|fleet_sim|demo|doctor|calibrate'
# The bottom: plumbing, settings, metrics, tokenizers, the KV-event wire,
# the fleet store, the prefill/decode pairing bodies.
BOTTOM_ONLY="fleet|$TOP|$LOOPS|$TOOLS|gateway|pool|routing|admission|balancing|replica"

failed=0

# The lines of FILE above its inline unit-test module, as `file:line:text`.
code_lines() {
  awk -v f="$1" '
    held != "" && /^(pub(\(crate\))? )?mod [a-z_]+ \{$/ { exit }
    held != "" { print f ":" held_nr ":" held; held = "" }
    /^#\[cfg\(test\)\]$/ { held = $0; held_nr = FNR; next }
    { print f ":" FNR ":" $0 }
    END { if (held != "") print f ":" held_nr ":" held }
  ' "$1"
}

# rule GROUP FORBIDDEN: no file under src/<each of GROUP> imports crate::<FORBIDDEN>.
rule() {
  local group=$1 forbidden=$2 files=() hits=""
  for m in $group; do
    if [[ -d src/$m ]]; then
      while IFS= read -r f; do files+=("$f"); done < <(find "src/$m" -name '*.rs' | sort)
    elif [[ -f src/$m.rs ]]; then
      files+=("src/$m.rs")
    else
      echo "check-layers: no module src/$m" >&2
      failed=1
    fi
  done
  local found
  for f in "${files[@]}"; do
    found=$(code_lines "$f" | grep -E "crate::($forbidden)\b" || true)
    if [[ -n "$found" ]]; then hits+="$found"$'\n'; fi
  done
  if [[ -n "$hits" ]]; then
    echo "layer violation: {$group} may not import crate::{$forbidden}"
    printf '%s' "$hits" | sed 's/^/  /'
    failed=1
  fi
}

# The bottom imports nothing above it.
rule "net config telemetry tokenize kv_events kv_transfer" "$BOTTOM_ONLY"
# Telemetry declares metrics and traces from settings alone; each module
# declares its own metrics through `telemetry::Family`.
rule "telemetry" "$BOTTOM_ONLY|net|tokenize|kv_events"
# The fleet store (what several instances share in Redis) reads settings and
# declares its metrics; the daemon wires it to the replicas, the pools hand
# it their dispatch records.
rule "fleet" "$BOTTOM_ONLY|net|tokenize|kv_events"
# Replica state sits just above the bottom.
rule "replica" "$TOP|$LOOPS|$TOOLS|gateway|pool|routing|admission|balancing"
# The loops that write replica state read the bottom and the replica.
rule "signals health" "$TOP|$TOOLS|discovery|gateway|pool|routing|admission|balancing"
# The pure pickers read replica views; they never reach into the loops.
rule "balancing" "$TOP|$LOOPS|$TOOLS|gateway|pool|routing|admission"
# Routing holds the rules alone: no queue, no health loop, no network.
rule "routing" "$TOP|$LOOPS|$TOOLS|gateway|pool|admission|net"
# Admission may read the caller (`gateway::Caller`) to settle its charge.
rule "admission" "$TOP|$LOOPS|$TOOLS|pool|routing|balancing"
rule "gateway" "$TOP|$LOOPS|$TOOLS|pool|routing|admission|balancing"
# The pool stack sits above routing, admission and balancing.
rule "pool" "$TOP|$LOOPS|$TOOLS|gateway"
# Forwarding and the edge never import the admin listener or the daemon.
rule "forwarding" "server|admin|daemon|$LOOPS|$TOOLS|gateway"
# (`AppState` holds what discovery found, for reloads.)
rule "server" "admin|daemon|signals|health|$TOOLS"
rule "admin" "daemon|$LOOPS|$TOOLS"
# Discovery gets handles (a config getter, a rebuild call), not the state.
rule "discovery" "$TOP|$TOOLS|signals|health|gateway|pool|routing|admission|balancing"
# The replica simulator and the load generator never import the proxy.
rule "replica_sim bench" "$TOP|$LOOPS|fleet_sim|demo|doctor|calibrate|gateway|pool|routing|admission|balancing|replica"
# The fleet simulator runs the product's decisions, not its daemon.
rule "fleet_sim" "$TOP|$LOOPS|demo|doctor|calibrate|gateway"
rule "doctor" "$TOP|health|discovery|replica_sim|bench|fleet_sim|demo|calibrate|gateway|pool|routing|admission|balancing"
# Calibration probes a replica with the load generator's client and writes a
# replica-sim profile: nothing of the proxy.
rule "calibrate" "$TOP|$LOOPS|fleet_sim|demo|doctor|gateway|pool|routing|admission|balancing|replica"
# The command line sits above everything: it starts the daemon and each tool.
rule "admin admission balancing bench calibrate config daemon demo discovery doctor fleet fleet_sim forwarding gateway health kv_events kv_transfer net pool replica replica_sim routing server signals telemetry tokenize" "cli"

# No function on the request path longer than 80 lines (tests aside): a
# step that long is several steps, each wanting a name.
if ! python3 scripts/check-fn-length.py --max 80; then
  echo "split the functions above into named steps (scripts/check-fn-length.py)"
  failed=1
fi

if [[ $failed -ne 0 ]]; then
  exit 1
fi
echo "layers: ok"
