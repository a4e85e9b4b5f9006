#!/usr/bin/env python3
"""Writes the expected token ids of chat and completion requests as vLLM
renders and tokenizes them, for llmlb's rendering tests.

Starts vLLM's render-only server (`vllm launch render`, no engine) on the
model directory with a chat template, posts each request to
`/v1/chat/completions/render` or `/v1/completions/render`, and records the
token ids vLLM would compute (and their decoded text, for reading). The
cases cover what vLLM hands the template besides messages: `tools` (dumped
by its request model), `chat_template_kwargs`, `documents`,
`add_generation_prompt`, `continue_final_message`, `reasoning_effort`,
`add_special_tokens`, text content parts, assistant `tool_calls` and tool
results, the `developer` role, and token-id completion prompts.

Usage (the vLLM venv, under the vLLM lock):
  flock /tmp/llmlb-vllm.lock ~/.cache/llmlb-vllm-cpu/venv/bin/python \\
      scripts/render_fixture.py ~/.cache/llmlb-vllm-cpu/tinymodel \\
      tests/fixtures/tiny_tools_template.jinja > tests/fixtures/render_tiny_tools.json
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tokenizers import Tokenizer

PORT = int(os.environ.get("PORT", "18000"))

SYSTEM = ("You are a careful assistant for a shipping company. "
          "Answer in two sentences at most, and name the parcel id you refer to. ")

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name"},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
# Key order differs from the model's, description and parameters left out.
TRACK = {"function": {"name": "track_parcel", "strict": True}, "type": "function"}
REFUND = {"type": "function", "function": {
    "name": "refund", "description": "Refund an order — with ünïcode.",
    "parameters": {"required": ["order"], "type": "object",
                   "properties": {"order": {"type": "integer"}, "reason": {"type": "string"}}}}}

CHATS = [
    ("plain", {"messages": [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "Where is parcel 17?"}]}),
    ("tools", {"messages": [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "Weather in Oslo?"}],
               "tools": [WEATHER, TRACK, REFUND]}),
    ("tools_choice_none", {"messages": [{"role": "user", "content": "Hi"}],
                           "tools": [WEATHER], "tool_choice": "none"}),
    ("thinking", {"messages": [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": "Where is parcel 3?"}],
                  "chat_template_kwargs": {"enable_thinking": True}}),
    ("thinking_off", {"messages": [{"role": "user", "content": "Where is parcel 3?"}],
                      "chat_template_kwargs": {"enable_thinking": False, "unused_flag": 3}}),
    ("kwargs_cannot_drop_generation_prompt",
     {"messages": [{"role": "user", "content": "Hi"}],
      "chat_template_kwargs": {"add_generation_prompt": False}}),
    ("no_generation_prompt", {"messages": [{"role": "user", "content": "Hi"}],
                              "add_generation_prompt": False}),
    ("reasoning_effort", {"messages": [{"role": "user", "content": "Think hard."}],
                          "reasoning_effort": "high"}),
    ("continue_final", {"messages": [{"role": "user", "content": "Count to five."},
                                     {"role": "assistant", "content": "One, two, "}],
                        "add_generation_prompt": False, "continue_final_message": True}),
    ("documents", {"messages": [{"role": "user", "content": "Summarise the documents."}],
                   "documents": [{"title": "Rivers", "text": "Rivers flow to the sea."},
                                 {"title": "Lakes", "text": "Lakes are still."}]}),
    ("add_special_tokens", {"messages": [{"role": "user", "content": "Hi"}],
                            "add_special_tokens": True}),
    ("content_parts", {"messages": [{"role": "user",
                                     "content": [{"type": "text", "text": "Summarise this:"},
                                                 {"type": "text", "text": "Rivers flow."}]}]}),
    ("tool_round_trip", {"messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": [{"type": "text", "text": "4 degrees"}, {"type": "text", "text": "cloudy"}]},
        {"role": "user", "content": "Thanks."}],
        "tools": [WEATHER]}),
    ("assistant_reasoning", {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning": "Greet back."},
        {"role": "user", "content": "Again"}]}),
    ("developer_role", {"messages": [{"role": "system", "content": "Be terse."},
                                     {"role": "developer", "content": "Use metric units."},
                                     {"role": "user", "content": "How far is it?"}]}),
    ("cache_salt", {"messages": [{"role": "user", "content": "Hi"}], "cache_salt": "tenant-a"}),
]

COMPLETIONS = [
    ("text", {"prompt": "The quick brown fox jumps over the lazy dog."}),
    ("token_ids", {"prompt": [0, 47, 372, 425, 9, 9, 12]}),
    ("text_no_special", {"prompt": "Hello world", "add_special_tokens": False}),
]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{path} {body}: {e.code} {e.read().decode()}")


def main():
    model_dir, template = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    server = subprocess.Popen(
        [vllm, "launch", "render", model_dir, "--host", "127.0.0.1", "--port", str(PORT),
         "--served-model-name", "tiny-llama", "--chat-template", template,
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(180):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            raise SystemExit("the render server did not start")
        chats = []
        for name, body in CHATS:
            out = post("/v1/chat/completions/render", {"model": "tiny-llama", **body})
            ids = out["token_ids"]
            chats.append({"name": name, "request": body, "ids": ids,
                          "text": tok.decode(ids, skip_special_tokens=False)})
        completions = []
        for name, body in COMPLETIONS:
            out = post("/v1/completions/render", {"model": "tiny-llama", **body})
            ids = out[0]["token_ids"]
            completions.append({"name": name, "request": body, "ids": ids})
    finally:
        server.terminate()
        server.wait(timeout=30)
    with open(template) as f:
        source = f.read()
    json.dump({"template": os.path.basename(template), "template_source": source,
               "chats": chats, "completions": completions},
              sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
