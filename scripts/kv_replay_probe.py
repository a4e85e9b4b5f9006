#!/usr/bin/env python3
"""Asks a vLLM replica's KV-event replay endpoint for its whole buffer (from
sequence 0), as a starting llmlb does, and prints how many batches came, how
many bytes, how long it took, and whether sequence numbers were skipped or the
end marker never came (vLLM's ROUTER socket drops what a slow reader has no
room for).

Run with the vLLM venv's python (it has pyzmq):
  $VLLMCPU_DIR/venv/bin/python scripts/kv_replay_probe.py 127.0.0.1:15700 [--wait 10]
Several at once (`&` in a shell loop) stand for several llmlb instances
starting together. Bounded: each wait for a message is at most --wait seconds.
"""
import argparse
import time

import zmq

END = (2**64 - 1).to_bytes(8, "big")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint", help="HOST:PORT of the replay socket (loopback only)")
    ap.add_argument("--wait", type=float, default=10.0, help="seconds to wait for each message")
    a = ap.parse_args()
    host, port = a.endpoint.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("only a replica on this machine (127.0.0.1)")
    dealer = zmq.Context().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    start = time.time()
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    batches, size, skipped, last, ended = 0, 0, 0, None, False
    while dealer.poll(int(a.wait * 1000)):
        frames = dealer.recv_multipart()
        if frames[-2] == END:
            ended = True
            break
        seq = int.from_bytes(frames[-2], "big")
        if last is not None and seq > last + 1:
            skipped += seq - last - 1
        last = seq
        batches += 1
        size += len(frames[-1])
    took = time.time() - start - (0 if ended else a.wait)
    print(f"{batches} batches, {size / 1e6:.1f} MB, {took:.2f} s, {skipped} skipped, "
          f"{'ended' if ended else 'no end marker'}")
    dealer.close(0)


if __name__ == "__main__":
    main()
