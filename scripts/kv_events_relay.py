#!/usr/bin/env python3
"""A loopback relay for vLLM's KV-cache events.

vLLM binds its event PUB socket only for a wildcard endpoint (`tcp://*:P`,
every interface) and connects it otherwise. To keep everything on
127.0.0.1, start vLLM with `"endpoint": "tcp://127.0.0.1:IN"` (its PUB then
connects here) and let llmlb subscribe to `tcp://127.0.0.1:OUT`: this relay
binds both on loopback and forwards messages (frames unchanged, sequence
numbers included) and subscriptions between them.

Usage: kv_events_relay.py IN OUT   (runs until killed; needs pyzmq, which the
vLLM venv has)
"""
import sys

import zmq


def main():
    port_in, port_out = int(sys.argv[1]), int(sys.argv[2])
    ctx = zmq.Context()
    upstream = ctx.socket(zmq.XSUB)
    upstream.bind(f"tcp://127.0.0.1:{port_in}")
    downstream = ctx.socket(zmq.XPUB)
    downstream.bind(f"tcp://127.0.0.1:{port_out}")
    zmq.proxy(downstream, upstream)


if __name__ == "__main__":
    main()
