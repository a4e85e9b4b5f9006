#!/usr/bin/env python3
"""Writes random-weight LoRA adapters for the tiny vLLM CPU model
(../shared/vllm-cpu: a 2-layer Llama with hidden size 256), for checking
llmlb's adapter-aware routing against real vLLM.

Each adapter is a directory with `adapter_config.json` (PEFT LoRA on
q_proj and v_proj) and `adapter_model.safetensors` holding
`base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight`
(A: r x hidden, B: hidden x r), drawn from a seeded normal distribution.

Usage: ~/.cache/llmlb-vllm-cpu/venv/bin/python scripts/make_lora_adapters.py \\
           OUT_DIR [NAME ...]      (default names: sql chat)
Then serve with --enable-lora --max-loras 1 --max-lora-rank 8
--lora-modules sql=OUT_DIR/sql chat=OUT_DIR/chat.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

HIDDEN = 256
LAYERS = 2
RANK = 8


def write_adapter(path, seed):
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, HIDDEN, generator=g) * 0.05
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(HIDDEN, RANK, generator=g) * 0.05
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 16,
              "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
              "base_model_name_or_path": "tiny-llama"}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["sql", "chat"]
    for i, name in enumerate(names):
        write_adapter(os.path.join(out, name), seed=1000 + i)
        print(os.path.join(out, name))


if __name__ == "__main__":
    main()
