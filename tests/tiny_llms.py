"""Tiny HuggingFace causal LMs with random weights (GPT-2 and LLaMA, 2 layers, width 32), for the
tests of log_generate: built the same way, seeded, in eval mode."""

from __future__ import annotations

import torch


def gpt2():
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama}
