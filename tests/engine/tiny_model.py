"""Build the tiny Llama-shaped model folder that vLLM serves with `--load-format dummy`.

Run it with the vLLM venv's interpreter (it has `tokenizers` and `transformers`):

    <vllm-venv>/bin/python tests/engine/tiny_model.py OUT_DIR [tiny|small]

Writes OUT_DIR/config.json (LlamaForCausalLM; `tiny`: hidden 128, intermediate 256, 2 layers, 4 heads,
2 KV heads, head_dim 32; `small`: see SIZES; vocab = tokenizer size) and a byte-level BPE tokenizer
trained here on a few lines of office-agent text, saved through transformers'
PreTrainedTokenizerFast with a chat template.
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


# model shapes: `tiny` is all Python overhead (microseconds of arithmetic per step), the fastest to
# start and to run; `small` does enough arithmetic per step (about 16 ms per decode step at a batch of
# 8 on one core) that the engine, not the HTTP frontend sharing the machine's other core, is the
# bottleneck, as on a real GPU deployment: the knee sweep needs that
SIZES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    "small": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
}


def build(out_dir: str, vocab_size: int = 512, size: str = "tiny") -> int:
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
        **SIZES[size],
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
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in SIZES):
        sys.exit(f"usage: tiny_model.py OUT_DIR [{'|'.join(SIZES)}]")
    print(build(sys.argv[1], size=sys.argv[2] if len(sys.argv) == 3 else "tiny"))
