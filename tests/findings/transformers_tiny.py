"""Shared by the standalone transformers reproductions in this folder (none imports the
conformance kit): a one-character tokenizer (each script builds the target's and, over the same
characters in another id order, the assistant's) and a tiny random Qwen3."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM


def char_tokenizer(letters):
    # one character a token, no merges: every text has one tokenization
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(letters)}, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def qwen3(vocab: int, seed: int, layers: int = 2):
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, tie_word_embeddings=False)
    return Qwen3ForCausalLM(config).eval()
