#!/usr/bin/env python3
"""Writes vLLM's prefix-cache block hashes for requests that differ in
tokens, LoRA adapter and cache salt, and the KV events vLLM publishes for
them, for llmlb's block-keying tests.

Runs vLLM's own request block hasher (`get_request_block_hasher` with
sha256, vLLM's default) and its event encoding of extra keys
(`generate_block_hash_extra_keys`, `to_event_extra_keys`) on stand-in
request objects. llmlb does not reproduce vLLM's hash values (it rehashes
the token ids of each event with its own keyed chain); the test checks that
two blocks get equal llmlb hashes exactly when vLLM's are equal, and that
the events' extra keys are read as vLLM wrote them.

Usage: ~/.cache/llmlb-vllm-cpu/venv/bin/python scripts/block_hash_fixture.py \\
           > tests/fixtures/block_hashes_vllm.json
"""

import json
import sys
from types import SimpleNamespace

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as kcu

BLOCK = 4
BASE = list(range(100, 112))            # three blocks
OTHER_TAIL = BASE[:8] + [7, 7, 7, 7]    # shares two blocks with BASE

REQUESTS = [
    ("base", BASE, None, None),
    ("base_again", BASE, None, None),
    ("other_tail", OTHER_TAIL, None, None),
    ("salt_a", BASE, None, "tenant-a"),
    ("salt_a_other_tail", OTHER_TAIL, None, "tenant-a"),
    ("salt_b", BASE, None, "tenant-b"),
    ("sql", BASE, ("sql", "/adapters/sql"), None),
    ("sql_other_tail", OTHER_TAIL, ("sql", "/adapters/sql"), None),
    ("chat", BASE, ("chat", "/adapters/chat"), None),
    ("sql_salt_a", BASE, ("sql", "/adapters/sql"), "tenant-a"),
]


def request(tokens, lora, salt):
    lora_request = None
    if lora:
        lora_request = SimpleNamespace(lora_name=lora[0], lora_path=lora[1], name=lora[0])
    return SimpleNamespace(
        num_tokens=len(tokens), all_token_ids=tokens, block_hashes=[], mm_features=[],
        lora_request=lora_request, cache_salt=salt, prompt_embeds=None)


def main():
    hash_fn = get_hash_fn_by_name("sha256")
    kcu.init_none_hash(hash_fn)
    hasher = kcu.get_request_block_hasher(BLOCK, hash_fn)
    out = []
    for name, tokens, lora, salt in REQUESTS:
        r = request(tokens, lora, salt)
        hashes = hasher(r)
        extra = [kcu.generate_block_hash_extra_keys(r, i * BLOCK, (i + 1) * BLOCK, 0)[0]
                 for i in range(len(hashes))]
        out.append({
            "name": name, "tokens": tokens, "block_size": BLOCK,
            "lora_name": lora[0] if lora else None, "cache_salt": salt,
            "block_hashes": [h.hex() for h in hashes],
            "event_extra_keys": kcu.to_event_extra_keys(extra),
        })
    json.dump({"hash": "sha256", "requests": out}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
