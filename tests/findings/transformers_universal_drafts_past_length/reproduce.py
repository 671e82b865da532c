"""Greedy universal assisted decoding (an assistant with another tokenizer) drafts even when
the one token left to generate comes from the target for free: its candidate generator takes
`num_assistant_tokens` without the cap to `max_length - length - 1` that the same-tokenizer
generator applies. The draft is then cut by the length, and the round is counted as 1 proposed,
0 accepted, whatever the assistant drafted.

Run: python reproduce.py   (transformers 5.x, tokenizers, torch; CPU, seconds)
Exit status 1 while the different-tokenizer path drafts for max_new_tokens=1.
"""

import sys

import torch
import transformers
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformers_tiny import char_tokenizer, qwen3  # noqa: E402

VOCAB = 13


def model(vocab, seed):
    m = qwen3(vocab, seed, layers=2)
    m.generation_config.num_assistant_tokens = 4
    m.generation_config.num_assistant_tokens_schedule = "constant"
    m.generation_config.assistant_confidence_threshold = 0.0
    return m


def drafting_calls(assistant, **options):
    """How many times the assistant's generate runs for one new token."""
    calls = []
    original = assistant.generate

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    assistant.generate = counted
    ids = torch.tensor([[(3 * i + 1) % VOCAB for i in range(16)]])   # long: no short-prompt crash
    target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1,
                    pad_token_id=VOCAB, assistant_model=assistant, **options)
    del assistant.generate
    return len(calls)


letters = [chr(0x4E00 + i) for i in range(VOCAB + 1)]
target = model(VOCAB, 0)
same = drafting_calls(model(VOCAB, 1))
different = drafting_calls(model(VOCAB + 1, 1), tokenizer=char_tokenizer(letters[:VOCAB]),
                           assistant_tokenizer=char_tokenizer(letters[:VOCAB][::-1] + [letters[VOCAB]]))
print(f"max_new_tokens=1: the assistant drafts {same} time(s) with the target's tokenizer, "
      f"{different} time(s) with its own")
print(f"transformers {transformers.__version__}: {'REPRODUCED' if different > same else 'not reproduced'}")
sys.exit(1 if different > same else 0)
