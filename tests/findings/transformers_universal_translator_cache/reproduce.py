"""Sampled universal assisted decoding (an assistant with another tokenizer, do_sample=True)
prunes the assistant's LM head in place, once per pair of tokenizer objects: the translator
that does it is cached by the two tokenizers (AssistantVocabTranslatorCache), not by the
assistant. A second assistant model used with the same two tokenizers is never pruned, yet its
drafted ids are read as pruned indices: generate fails (IndexError), or where the index
happens to exist, the draft is read as another token.

Run: python reproduce.py   (transformers 5.x, tokenizers, torch; CPU, a few seconds)
Exit status 1 while the second assistant fails.
"""

import sys

import torch
import transformers
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformers_tiny import char_tokenizer, qwen3  # noqa: E402

VOCAB = 13


def model(vocab, seed):
    return qwen3(vocab, seed, layers=2)


def assistant_model(seed):
    m = model(VOCAB + 1, seed)
    # the last token is one the target does not have: transformers prunes it from the head;
    # a large bias on its row makes an unpruned assistant draft it often
    with torch.no_grad():
        m.lm_head.weight[VOCAB] = m.lm_head.weight[:VOCAB].sum(0)
    m.generation_config.num_assistant_tokens = 4
    m.generation_config.num_assistant_tokens_schedule = "constant"
    m.generation_config.assistant_confidence_threshold = 0.0
    return m


letters = [chr(0x4E00 + i) for i in range(VOCAB + 1)]
target_tokenizer = char_tokenizer(letters[:VOCAB])
assistant_tokenizer = char_tokenizer(letters[:VOCAB][::-1] + [letters[VOCAB]])
target = model(VOCAB, 0)
ids = torch.tensor([[1, 4, 7, 10, 0, 3, 6, 9, 12, 2, 5, 8]])
failed = False
for name, seed in (("first assistant", 1), ("second assistant, same tokenizers", 2)):
    assistant = assistant_model(seed)
    head = type(assistant.get_output_embeddings()).__name__
    torch.manual_seed(0)
    try:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                              temperature=1.0, top_k=0, max_new_tokens=24, pad_token_id=VOCAB,
                              assistant_model=assistant, tokenizer=target_tokenizer,
                              assistant_tokenizer=assistant_tokenizer)
        result = f"ok, {out.shape[1] - ids.shape[1]} tokens"
    except Exception as error:
        failed = True
        result = f"{type(error).__name__}: {error}"
    print(f"{name}: head {head} -> {type(assistant.get_output_embeddings()).__name__}; {result}")
print(f"transformers {transformers.__version__}: {'REPRODUCED' if failed else 'not reproduced'}")
sys.exit(1 if failed else 0)
