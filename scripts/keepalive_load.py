#!/usr/bin/env python3
"""Sends N completion requests one after another on one kept-alive HTTP/1.1
connection to 127.0.0.1:PORT and prints how many got a 200. Used to count
a proxy's instructions per request under callgrind (docs/BENCHMARKS.md).

Usage: keepalive_load.py PORT N {json,sse}
  json: "stream": false and the header `x-answer: json` (the instant
        backend of scripts/proxy_helpers.sh then answers one JSON body)
  sse:  "stream": true (the 16-chunk SSE answer)
"""
import http.client
import json
import sys

port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = json.dumps({"model": "instant", "prompt": "How far is the moon?", "max_tokens": 16,
                   "stream": mode == "sse"})
headers = {"content-type": "application/json"}
if mode == "json":
    headers["x-answer"] = "json"
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
ok = 0
for _ in range(n):
    conn.request("POST", "/v1/completions", body, headers)
    resp = conn.getresponse()
    resp.read()
    ok += resp.status == 200
print(ok)
