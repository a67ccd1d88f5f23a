"""Build the tiny Llama-shaped model folder that vLLM serves with `--load-format dummy`.

Run it with the vLLM venv's interpreter (it has `tokenizers` and `transformers`):

    <vllm-venv>/bin/python tests/engine/tiny_model.py OUT_DIR

Writes OUT_DIR/config.json (LlamaForCausalLM, hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV
heads, head_dim 32, vocab = tokenizer size) and a byte-level BPE tokenizer trained here on a few lines
of office-agent text, saved through transformers' PreTrainedTokenizerFast with a chat template.
No weights: the engine initialises them randomly. Prints the vocabulary size.
"""
from __future__ import annotations

import json
import os
import sys

CORPUS = [
    "Summarise the attached quarterly report for the finance team.",
    "Draft a short reply to the customer about the delayed shipment.",
    "Search the policy handbook and answer: how many leave days do new staff get?",
    "Book a meeting room for Thursday afternoon and email the invitation.",
    "Translate the meeting notes into French and list the action items.",
    "The agent reads the ticket, calls a tool, waits, then writes the answer.",
    "Capacity planning: requests running, requests waiting, KV cache tokens in use.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" @ # $ % & _",
]
SPECIAL = ["<s>", "</s>", "<pad>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build(out_dir: str, vocab_size: int = 512) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    fast.save_pretrained(out_dir)
    vocab = len(fast)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id}, f)
    return vocab


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(build(sys.argv[1]))
