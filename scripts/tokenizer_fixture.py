#!/usr/bin/env python3
"""Writes the expected token ids for llmlb's tokenizer tests.

Renders chat requests with the model directory's chat template the way
transformers' `apply_chat_template` does (jinja2 sandbox, trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, special
tokens from tokenizer_config.json, add_generation_prompt=True), after turning
each message's content into what vLLM hands the template (text parts joined
with a newline when the template treats content as a string; a list of
`{"type": "text", "text": ...}` parts when it loops over it). Chat prompts are
encoded without special tokens (vLLM's chat default), completion texts with
them (vLLM's completions default).

Usage: pip install tokenizers jinja2
       python3 scripts/tokenizer_fixture.py ../shared/tokenizers/tiny-llama \
           > tests/fixtures/tokenizer_tiny_llama.json
"""

import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from tokenizers import Tokenizer

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog near the river bank today.",
    "naïve café — 東京タワー 🚀 Ünïcödé façade",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "  leading spaces\n\ttabs\tand  double  spaces  ",
    "Numbers 1234567890 and symbols !@#$%^&*()_+-=[]{};':\",./<>?",
]

SYSTEM = ("You are a careful assistant for a shipping company. "
          "Answer in two sentences at most, and name the parcel id you refer to. ")

CHATS = [
    ("plain", [{"role": "user", "content": "What is Rust?"}]),
    ("system", [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Where is parcel 17?"}]),
    ("multi_turn", [{"role": "system", "content": "Be terse."},
                    {"role": "user", "content": "Name a river."},
                    {"role": "assistant", "content": "The Danube."},
                    {"role": "user", "content": "And one in Asia?"}]),
    ("content_parts", [{"role": "user",
                        "content": [{"type": "text", "text": "Summarise this:"},
                                    {"type": "text", "text": "Rivers flow to the sea."}]}]),
    ("single_part", [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                     {"role": "user", "content": "Cancel order 7."}]),
    ("unicode", [{"role": "user", "content": "Übersetze: 東京は大きい都市です。🚀 ¿Qué tal?"}]),
    ("long_system", [{"role": "system", "content": SYSTEM * 12},
                     {"role": "user", "content": "Where is parcel 3?"}]),
]


def special(config, name):
    v = config.get(name)
    if isinstance(v, dict):
        return v.get("content")
    return v


def loops_over_content(source):
    """vLLM's test: does the template iterate over a message's content?"""
    env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols])
    ast = env.parse(source)
    for loop in ast.find_all(jinja2.nodes.For):
        for node in loop.iter.find_all((jinja2.nodes.Getitem, jinja2.nodes.Getattr, jinja2.nodes.Name)):
            key = getattr(node, "attr", None) or getattr(node, "name", None)
            arg = getattr(node, "arg", None)
            if key == "content" or (isinstance(arg, jinja2.nodes.Const) and arg.value == "content"):
                return True
    return False


def to_template(messages, openai_format):
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            parts = [content]
        else:
            parts = [p["text"] for p in content if p.get("type") == "text"]
        if openai_format:
            c = [{"type": "text", "text": t} for t in parts]
        else:
            c = "\n".join(parts)
        out.append({"role": m["role"], "content": c})
    return out


def main():
    model_dir = sys.argv[1]
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(path):
        with open(path) as f:
            source = f.read()
    else:
        source = config["chat_template"]

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)
    openai_format = loops_over_content(source)
    specials = {k: special(config, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}

    texts = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True).ids
        texts.append({"text": text, "ids": ids, "count": len(ids)})
    chats = []
    for name, messages in CHATS:
        rendered = template.render(messages=to_template(messages, openai_format),
                                   add_generation_prompt=True, **specials)
        ids = tok.encode(rendered, add_special_tokens=False).ids
        chats.append({"name": name, "messages": messages, "rendered": rendered,
                      "ids": ids, "count": len(ids)})
    json.dump({"content_format": "openai" if openai_format else "string",
               "texts": texts, "chats": chats}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
