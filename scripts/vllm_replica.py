#!/usr/bin/env python3
"""Start and stop one real vLLM CPU replica (../shared/vllm-cpu) for llmlb's
real-engine checks, more robustly than the serve script alone:

- the replica runs in a process group of its own, and `stop` ends the whole
  group (the API server, its EngineCore and workers), so a replica stopped
  while still starting leaves no engine process holding its ports;
- before starting, the HTTP port and any extra ports it will bind (KV-event
  and replay sockets) must be free; a stale holder is waited for up to 30 s,
  then the start fails and names the port;
- readiness (`/health`) is awaited up to `--wait` seconds (default
  `VLLM_START_WAIT`, else 900), beyond the serve script's own 300 s: on a
  loaded 2-core machine vLLM has taken over five minutes to start.

Command line (also imported by the other scripts):
  scripts/vllm_replica.py serve --port 18000 --core 0 [--extra-ports 5557,15597] [--wait 900] [-- EXTRA vllm ARGS]
  scripts/vllm_replica.py stop --port 18000

Environment as for the serve script (VLLMCPU_DIR, KV_BYTES, MAX_NUM_SEQS,
EXTRA_ARGS, LLMLB_SHARED for the shared directory). Only the standard
library; every wait is bounded.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_DIR = os.environ.get("VLLMCPU_DIR", os.path.expanduser("~/.cache/llmlb-vllm-cpu"))


def serve_script():
    candidates = [os.environ.get("LLMLB_SHARED", ""), os.path.join(ROOT, "..", "shared"),
                  os.path.join(ROOT, "..", "..", "shared")]
    for c in candidates:
        p = os.path.join(c, "vllm-cpu", "setup_and_serve.sh")
        if c and os.path.exists(p):
            return os.path.abspath(p)
    return os.path.abspath(os.path.join(ROOT, "..", "shared", "vllm-cpu", "setup_and_serve.sh"))


def start_wait():
    return int(os.environ.get("VLLM_START_WAIT", "900"))


def port_busy(port):
    """True when something on 127.0.0.1 accepts on the port or it cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def wait_ports_free(ports, timeout=30.0):
    deadline = time.time() + timeout
    while True:
        busy = [p for p in ports if port_busy(p)]
        if not busy:
            return
        if time.time() > deadline:
            raise RuntimeError(f"ports still in use after {timeout:.0f} s: {busy} "
                               "(a replica left from an earlier run? see `ss -ltnp`)")
        time.sleep(1)


def healthy(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def pid_file(port):
    return os.path.join(VLLM_DIR, f"vllm-{port}.pid")


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def serve(port, core, extra_args="", extra_ports=(), wait=None, log=sys.stderr):
    """Starts a replica; returns the seconds it took to answer /health."""
    wait = start_wait() if wait is None else wait
    stop(port, quiet=True)
    wait_ports_free([port, *extra_ports])
    env = dict(os.environ, PORT=str(port), CORE=str(core), EXTRA_ARGS=extra_args)
    t0 = time.time()
    # A new session: the serve script, vLLM and its engine processes share one
    # process group that stop() can end as a whole.
    script = subprocess.Popen(["bash", serve_script(), "serve"], env=env, stdout=log,
                              stderr=log, start_new_session=True)
    deadline = t0 + wait
    while time.time() < deadline:
        if healthy(port):
            break
        code = script.poll()
        if code is not None and code != 0 and not own_pid(port):
            raise RuntimeError(f"vLLM on {port} failed to start (see {VLLM_DIR}/vllm-{port}.log)")
        pid = own_pid(port)
        if pid is not None and not alive(pid):
            raise RuntimeError(f"vLLM on {port} died while starting (see {VLLM_DIR}/vllm-{port}.log)")
        time.sleep(1)
    else:
        stop(port, quiet=True)
        raise RuntimeError(f"vLLM on {port} not ready after {wait} s (stopped it)")
    try:
        script.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    took = time.time() - t0
    print(f"vLLM ready on 127.0.0.1:{port} after {took:.0f} s", file=log, flush=True)
    return took


def own_pid(port):
    try:
        return int(open(pid_file(port)).read().strip())
    except (OSError, ValueError):
        return None


def stop(port, quiet=False, log=sys.stderr):
    """Ends the replica's whole process group: TERM, then KILL after 30 s."""
    pid = own_pid(port)
    if pid is None:
        if not quiet:
            print(f"no replica recorded on port {port}", file=log)
        return
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = None
    if pgid is not None and pgid != os.getpgid(0):
        targets = lambda sig: os.killpg(pgid, sig)  # noqa: E731
        group_alive = lambda: group_exists(pgid)  # noqa: E731
    else:
        targets = lambda sig: os.kill(pid, sig)  # noqa: E731
        group_alive = lambda: alive(pid)  # noqa: E731
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            targets(sig)
        except OSError:
            break
        deadline = time.time() + grace
        while time.time() < deadline and group_alive():
            time.sleep(0.5)
        if not group_alive():
            break
    try:
        os.remove(pid_file(port))
    except OSError:
        pass
    if not quiet:
        print(f"stopped vLLM on port {port} (pid {pid}, group {pgid})", file=log)


def group_exists(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["serve", "stop"])
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--core", default="auto")
    ap.add_argument("--extra-ports", default="", help="comma-separated ports that must be free")
    ap.add_argument("--wait", type=int, default=None, help="seconds to wait for /health")
    a, rest = ap.parse_known_args()
    if a.action == "stop":
        stop(a.port)
        return
    extra = " ".join(x for x in rest if x != "--") or os.environ.get("EXTRA_ARGS", "")
    ports = [int(p) for p in a.extra_ports.split(",") if p]
    try:
        serve(a.port, a.core, extra, ports, a.wait)
    except RuntimeError as e:
        sys.exit(f"vllm_replica: {e}")


if __name__ == "__main__":
    main()
