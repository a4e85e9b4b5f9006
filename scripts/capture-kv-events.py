#!/usr/bin/env python3
"""Captures a vLLM replica's raw KV-cache event frames for llmlb's decoder tests.

Run with the vLLM venv's python (it has pyzmq), against one replica started with
--kv-events-config (endpoint tcp://*:5557, replay_endpoint tcp://*:5558):
  python scripts/capture-kv-events.py --http 18000 --zmq 5557 --replay 5558 --out tests/fixtures/kv_events
Writes vllm_live.hex (one message a line, frames in hex separated by spaces) and
vllm_replay_from5.hex (the replay endpoint's answer from sequence 5; '-' is an empty frame).

With --eviction it sends instead a fixed sequence of token-id prompts to
/v1/completions, one at a time (each answered before the next is sent), chosen
so that prefixes are shared, a whole-block prompt is recomputed and stored
twice, and the cache overflows; it writes vllm_eviction.hex (the frames) and
vllm_eviction_requests.json (the prompts, output lengths and the replica's
block size and block count), which tests/it/sim_eviction_order.rs replays
through the simulator's engine."""
import argparse, json, random, re, threading, time, urllib.request
import zmq

ap = argparse.ArgumentParser()
ap.add_argument("--http", type=int, default=18000)
ap.add_argument("--zmq", type=int, default=5557)
ap.add_argument("--replay", type=int, default=5558)
ap.add_argument("--out", default="tests/fixtures/kv_events")
ap.add_argument("--words", type=int, default=300)
ap.add_argument("--eviction", action="store_true")
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

def eviction_requests():
    """Token-id prompts (ids below the tiny model's 4,096), output lengths kept
    so that no block holding an output token fills up (the outputs differ)."""
    rng = random.Random(40)
    tokens = lambda n: [rng.randrange(1, 4000) for _ in range(n)]
    shared = tokens(512)  # four blocks of 128
    whole = shared + tokens(128)  # exactly five blocks
    reqs = [(shared + tokens(100), 1), (shared + tokens(228), 1), (whole, 1), (whole, 1)]
    distinct = [tokens(900) for _ in range(6)]  # 7 full blocks each: the cache overflows
    reqs += [(p, 1) for p in distinct]
    reqs += [(shared + tokens(100), 1), (tokens(300), 4), (distinct[-1], 1), (whole, 2)]
    return reqs

def complete(prompt, max_tokens):
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{a.http}/v1/completions",
                                 json.dumps(body).encode(), {"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())["usage"]

def num_gpu_blocks():
    text = urllib.request.urlopen(f"http://127.0.0.1:{a.http}/metrics", timeout=30).read().decode()
    m = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', text)
    b = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', text)
    return int(m.group(1)), int(b.group(1))

if a.eviction:
    reqs = eviction_requests()
    blocks, block_size = num_gpu_blocks()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{a.zmq}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(1.0)
    frames = []
    def drain(wait_ms):
        while sub.poll(wait_ms):
            frames.append(hexline(sub.recv_multipart()))
    usages = []
    for prompt, max_tokens in reqs:
        usages.append(complete(prompt, max_tokens))
        print(usages[-1], flush=True)
        drain(300)  # this request's events arrive before the next is sent
    drain(1000)
    open(f"{a.out}/vllm_eviction.hex", "w").write("\n".join(frames) + "\n")
    json.dump({"block_size": block_size, "num_gpu_blocks": blocks,
               "requests": [{"prompt": p, "max_tokens": m,
                             "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens")}
                            for (p, m), u in zip(reqs, usages)]},
              open(f"{a.out}/vllm_eviction_requests.json", "w"))
    print(f"{len(frames)} messages, {len(reqs)} requests, {blocks} blocks of {block_size}")
    raise SystemExit(0)

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
