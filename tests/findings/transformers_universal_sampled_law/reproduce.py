"""Sampled universal assisted decoding (do_sample=True, an assistant with another tokenizer)
samples the wrong law when the assistant's vocabulary has a token the target's lacks: the
assistant's LM head is pruned to the shared tokens, and the drafted ids and their logits are
carried back to target ids by two different orders. A drafted pruned index i is read as the
token `overlap[i]` (the order of `tokenizer.get_vocab()`), but its logit is written to the
target id of the i-th shared assistant id in increasing id order. Where the two orders differ,
the verifier reads the q of another token, and the output is no longer the target's law.

Run: python reproduce.py   (transformers 5.x, tokenizers, torch; CPU, about 1.5 minutes of CPU time)
Part 1 prints the two maps (deterministic); part 2 samples the first generated token N times
and compares its frequencies with the target's own distribution. Exit status 1 while they differ.
"""

import sys

import torch
import transformers
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformers_tiny import char_tokenizer, qwen3  # noqa: E402
from transformers.generation.candidate_generator import AssistantToTargetTranslator

VOCAB, N = 4, 1000


def model(vocab, seed):
    m = qwen3(vocab, seed, layers=1)
    with torch.no_grad():   # peaked distributions, so that a wrong q shows
        m.lm_head.weight.mul_(20)
    return m


letters = [chr(0x4E00 + i) for i in range(VOCAB + 1)]
target_tokenizer = char_tokenizer(letters[:VOCAB])
# the same characters in reverse order, and one the target lacks (transformers refuses an
# assistant_tokenizer when the two vocabulary sizes are equal)
assistant_tokenizer = char_tokenizer(letters[:VOCAB][::-1] + [letters[VOCAB]])

# Part 1: the two maps, on a throwaway assistant
translator = AssistantToTargetTranslator(target_tokenizer, assistant_tokenizer, VOCAB,
                                         assistant_model=model(VOCAB + 1, 9),
                                         assistant_prune_lm_head=True)
index = torch.arange(VOCAB)
as_token = translator.get_target_ids(torch.zeros(1, 0, dtype=torch.long),
                                     torch.zeros(1, 0, dtype=torch.long), index.view(1, -1))[0]
as_logit = translator.get_target_logits(index.float().view(1, 1, -1))[0, 0].long()
print("assistant get_vocab() order:", list(assistant_tokenizer.get_vocab().values()))
print("pruned index i drafted as target token:", as_token.tolist())
print("pruned index i's logit placed at target token:",
      [int((as_logit == i).nonzero()) for i in range(VOCAB)])

# Part 2: the law of the first generated token, the assistant being the target in other ids
target = model(VOCAB, 0)
assistant = model(VOCAB + 1, 0)
with torch.no_grad():
    order = torch.tensor([VOCAB - 1 - i for i in range(VOCAB)])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = dict(target.named_parameters())[name]
        mine = dict(assistant.named_parameters())[name]
        mine[order] = rows
        mine[VOCAB] = 0
assistant.generation_config.num_assistant_tokens = 1
assistant.generation_config.num_assistant_tokens_schedule = "constant"
assistant.generation_config.assistant_confidence_threshold = 0.0
ids = torch.tensor([[1, 2]])
with torch.no_grad():
    p = target(ids).logits[0, -1].softmax(-1)
counts = torch.zeros(VOCAB)
for seed in range(N):
    torch.manual_seed(seed)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                          temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=2,
                          pad_token_id=VOCAB, assistant_model=assistant,
                          tokenizer=target_tokenizer, assistant_tokenizer=assistant_tokenizer)
    counts[out[0, 2]] += 1
expected = p * N
chi2 = float(((counts - expected) ** 2 / expected).sum())
print(f"first token over {N} runs: observed {counts.long().tolist()}, "
      f"expected {[round(float(e), 1) for e in expected]}, chi-square {chi2:.1f} on {VOCAB - 1} df")
wrong = chi2 > 30.0    # p < 1e-6 on 3 degrees of freedom
print(f"transformers {transformers.__version__}: {'REPRODUCED' if wrong else 'not reproduced'}")
sys.exit(1 if wrong else 0)
