#!/usr/bin/env python3
"""Captures a vLLM replica's raw KV-cache event frames for llmlb's decoder tests.

Run with the vLLM venv's python (it has pyzmq), against one replica started with
--kv-events-config (endpoint tcp://*:5557, replay_endpoint tcp://*:5558):
  python scripts/capture-kv-events.py --http 18000 --zmq 5557 --replay 5558 --out tests/fixtures/kv_events
Writes vllm_live.hex (one message a line, frames in hex separated by spaces) and
vllm_replay_from5.hex (the replay endpoint's answer from sequence 5; '-' is an empty frame)."""
import argparse, json, threading, time, urllib.request
import zmq

ap = argparse.ArgumentParser()
ap.add_argument("--http", type=int, default=18000)
ap.add_argument("--zmq", type=int, default=5557)
ap.add_argument("--replay", type=int, default=5558)
ap.add_argument("--out", default="tests/fixtures/kv_events")
ap.add_argument("--words", type=int, default=300)
a = ap.parse_args()

def hexline(frames):
    return " ".join(f.hex() if f else "-" for f in frames)

def post(messages, max_tokens):
    body = {"model": "tiny-llama", "max_tokens": max_tokens, "messages": messages}
    req = urllib.request.Request(f"http://127.0.0.1:{a.http}/v1/chat/completions",
                                 json.dumps(body).encode(), {"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["usage"]

def workload():
    system = "You are a helpful assistant. " * 40
    print(post([{"role": "system", "content": system}, {"role": "user", "content": "hi"}], 4))
    print(post([{"role": "system", "content": system}, {"role": "user", "content": "hello there"}], 4))
    for i in range(6):  # distinct long prompts: overflow the cache, so blocks are evicted
        text = f"Context number {i}: " + " ".join(f"word{i}_{j}" for j in range(a.words))
        print(post([{"role": "user", "content": text}], 2))
    print(post([{"role": "system", "content": system}, {"role": "user", "content": "hi"}], 4))

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(f"tcp://127.0.0.1:{a.zmq}")
sub.setsockopt(zmq.SUBSCRIBE, b"")
time.sleep(1.0)
sender = threading.Thread(target=workload)
sender.start()
live = []
deadline = time.time() + 120
while time.time() < deadline:
    if sub.poll(2000):
        live.append(hexline(sub.recv_multipart()))
    elif not sender.is_alive():
        break
open(f"{a.out}/vllm_live.hex", "w").write("\n".join(live) + "\n")

dealer = ctx.socket(zmq.DEALER)
dealer.connect(f"tcp://127.0.0.1:{a.replay}")
dealer.send_multipart([b"", (5).to_bytes(8, "big")])
replay = []
while dealer.poll(3000):
    frames = dealer.recv_multipart()
    replay.append(hexline(frames))
    if frames[-2:] == [b"\xff" * 8, b""]:
        break
open(f"{a.out}/vllm_replay_from5.hex", "w").write("\n".join(replay) + "\n")
print(f"{len(live)} live messages, {len(replay)} replayed")
