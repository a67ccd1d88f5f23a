"""Write a tiny LoRA adapter for the tiny model (tests/engine/tiny_model.py) without peft: the
adapter_config.json and adapter_model.safetensors layout peft saves and vLLM loads (LoRA A and B
for q_proj and v_proj of every layer, small random weights). Run with the vLLM venv's interpreter
(it has torch and safetensors):

    <vllm-venv>/bin/python tests/engine/lora_adapter.py MODEL_DIR OUT_DIR [RANK]
"""
from __future__ import annotations

import json
import os
import sys


def build(model_dir: str, out_dir: str, rank: int = 8) -> None:
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    hidden, head = cfg["hidden_size"], cfg["head_dim"]
    outs = {"q_proj": cfg["num_attention_heads"] * head, "v_proj": cfg["num_key_value_heads"] * head}
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, out in outs.items():
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.01
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.01
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "lora_dropout": 0.0, "target_modules": sorted(outs), "bias": "none", "fan_in_fan_out": False,
              "base_model_name_or_path": model_dir, "modules_to_save": None}
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
