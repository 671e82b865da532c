"""Acceptance of a draft, measured in real speculative runs and computed exactly beside it.

`measure` runs reference.speculative.speculative_generate on each prompt with the target
wrapped so that every round's verify call and the truncate after it are recorded: a round that
fed 1 + n tokens from cache length `start` and then truncated to `start + 1 + a` proposed n
tokens and accepted a. So the draft position i (1-based) of a round is *reached* when i <= n and
the first i - 1 proposals were accepted, and *accepted* when a >= i.

The exact figure: at a reached position the proposal is accepted with probability
sum(min(p, q)) (sampling, with p and q the target's and the draft's distributions at that
context), or 1 if argmax p == argmax q else 0 (greedy). Those contexts are prefixes of the final
output, so one teacher-forced forward of each model over prompt + output gives them all. The
measured rate at a position should agree with the mean exact value there within sampling noise.
"""

from __future__ import annotations

import torch

from reference.cache import KVCache
from reference.heads import is_head
from reference.heads.replay import round_logits
from reference.sampling import probs_from_logits
from reference.speculative import speculative_generate


class _RecordingCache(KVCache):
    def __init__(self, events, *args, **kw):
        super().__init__(*args, **kw)
        self._events = events

    def truncate(self, n):
        self._events.append(("truncate", n))
        super().truncate(n)


class _Recorded(torch.nn.Module):
    """The target, its calls and truncates noted in `events`."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config, self.events = model, model.config, []

    @property
    def layers(self):
        return self.inner.layers

    def new_cache(self, batch, capacity):
        p = self.inner.model.embed_tokens.weight
        c = self.config
        return _RecordingCache(self.events, len(self.inner.layers), batch, c.num_key_value_heads,
                               c.head_dim, capacity, p.dtype, p.device)

    def forward(self, ids, cache, positions=None, mask=None):
        self.events.append(("call", cache.length, ids.shape[1]))
        return self.inner(ids, cache, positions, mask)

    def forward_hidden(self, ids, cache, hidden, positions=None, mask=None):
        # a head's target forward (its hidden states too): recorded as a call like forward
        self.events.append(("call", cache.length, ids.shape[1]))
        return self.inner.forward_hidden(ids, cache, hidden, positions, mask)


def rounds_of(events) -> list[tuple[int, int, int]]:
    """(start, proposed, accepted) for every verify call followed by a truncate."""
    out = []
    for first, second in zip(events, events[1:]):
        if first[0] == "call" and second[0] == "truncate":
            _, start, fed = first
            out.append((start, fed - 1, second[1] - start - 1))
    return out


@torch.no_grad()
def _teacher_forced(model, seq):
    p = model.model.embed_tokens.weight
    c = model.config
    cache = KVCache(len(model.layers), 1, c.num_key_value_heads, c.head_dim, len(seq), p.dtype,
                    p.device)
    return model(torch.tensor([seq], device=p.device), cache)[0].double()


def exact_acceptance(target_logits, draft_logits, temperature: float) -> torch.Tensor:
    """Per context: the probability that a draft proposal there is accepted."""
    if temperature == 0:
        return (target_logits.argmax(-1) == draft_logits.argmax(-1)).double()
    p = probs_from_logits(target_logits, temperature)
    q = probs_from_logits(draft_logits, temperature)
    return torch.minimum(p, q).sum(-1)


def measure(target, draft, prompts, max_new_tokens: int, k: int, temperature: float,
            seed: int = 0) -> dict:
    """Acceptance overall and by draft position, measured and exact, and tokens per target call."""
    if not prompts:
        raise ValueError("prompts is empty: acceptance needs at least one prompt")
    reached, accepted, exact = [0] * k, [0] * k, [0.0] * k
    tokens = calls = 0
    generator = torch.Generator().manual_seed(seed)
    for prompt in prompts:
        recorded = _Recorded(target)
        output, stats = speculative_generate(recorded, draft, prompt, max_new_tokens, k=k,
                                             temperature=temperature, generator=generator)
        seq = list(prompt) + list(output)
        target_logits = _teacher_forced(target, seq)
        draft_rows = _draft_rows(target, draft, seq)
        for start, proposed, got in rounds_of(recorded.events):
            reach = min(proposed, got + 1)   # proposal i is reached when 1 .. i - 1 were accepted
            if reach == 0:
                continue
            # proposal i predicts the token at index start + i from seq[:start + i]
            alpha = exact_acceptance(target_logits[start:start + reach],
                                     draft_rows(start, reach), temperature)
            for i in range(1, reach + 1):
                reached[i - 1] += 1
                accepted[i - 1] += got >= i
                exact[i - 1] += float(alpha[i - 1])
        tokens += len(output)
        calls += stats["rounds"]
    total_reached = sum(reached)
    return {
        "temperature": temperature, "k": k, "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "acceptance": round(sum(accepted) / total_reached, 4),
        "exact": round(sum(exact) / total_reached, 4),
        "by_position": [round(a / r, 4) if r else None for a, r in zip(accepted, reached)],
        "exact_by_position": [round(e / r, 4) if r else None for e, r in zip(exact, reached)],
        "reached": reached,
        "tokens_per_target_call": round(tokens / calls, 4),
    }


def _draft_rows(target, draft, seq):
    """(start, count) -> the draft's logits for proposals 1 .. count of the round that began
    with seq[:start + 1] committed, [count, V]. A draft model's are a function of the context:
    one teacher-forced forward gives them all. A head's depend on where the round began (its
    first law reads the verified features, the later ones its own outputs): replayed per round
    from the target's features over seq."""
    if not is_head(draft):
        rows = _teacher_forced(draft, seq)
        return lambda start, count: rows[start:start + count]
    p = target.model.embed_tokens.weight
    cache = KVCache(len(target.layers), 1, target.config.num_key_value_heads,
                    target.config.head_dim, len(seq), p.dtype, p.device)
    with torch.no_grad():
        features = target.forward_hidden(torch.tensor([seq], device=p.device), cache,
                                         draft.hidden)[1][0]
    return lambda start, count: round_logits(draft, features, seq, start, count).double()


def measure_all(pair, prompts, max_new_tokens: int = 64, k: int = 4) -> dict:
    """Both drafts of a TrainedPair at T = 0 and T = 1."""
    return {name: {f"T={t:g}": measure(pair.target, draft, prompts, max_new_tokens, k, t)
                   for t in (0.0, 1.0)}
            for name, draft in pair.drafts().items()}
