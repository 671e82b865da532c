"""Greedy universal assisted decoding (an assistant with another tokenizer) dies on a short
prompt (1 to 8 tokens with these models; 9 and more pass): the assistant's KV cache is not cut back to the re-encoded context, so it
ends up holding at least as many positions as the assistant's input, and the assistant's next
`generate` runs its forward on zero new tokens.

Run: python reproduce.py   (transformers 5.x, tokenizers, torch; CPU, a few seconds)
Prints the result for a 5-token and a 16-token prompt; exit status 1 while the short one fails.
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


letters = [chr(0x4E00 + i) for i in range(VOCAB + 1)]
target_tokenizer = char_tokenizer(letters[:VOCAB])
# the assistant's vocabulary: the same characters in reverse order, and one more (transformers
# refuses an assistant_tokenizer when the two vocabulary sizes are equal)
assistant_tokenizer = char_tokenizer(letters[:VOCAB][::-1] + [letters[VOCAB]])
target, assistant = model(VOCAB, 0), model(VOCAB + 1, 1)
assistant.generation_config.num_assistant_tokens = 4
assistant.generation_config.num_assistant_tokens_schedule = "constant"
assistant.generation_config.assistant_confidence_threshold = 0.0

failed = False
for length in (5, 16):
    ids = torch.tensor([[(3 * i + 1) % VOCAB for i in range(length)]])
    plain = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=12, pad_token_id=VOCAB)
    try:
        assisted = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=12, pad_token_id=VOCAB,
                                   assistant_model=assistant, tokenizer=target_tokenizer,
                                   assistant_tokenizer=assistant_tokenizer)
    except Exception as error:
        failed |= length <= 10
        print(f"prompt of {length} tokens: {type(error).__name__}: {error}")
        continue
    same = torch.equal(assisted, plain)
    failed |= not same
    print(f"prompt of {length} tokens: assisted output {'equals' if same else 'DIFFERS from'} "
          f"plain greedy")
print(f"transformers {transformers.__version__}: {'REPRODUCED' if failed else 'not reproduced'}")
sys.exit(1 if failed else 0)
