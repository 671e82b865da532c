"""EAGLE (Li et al., 2024): draft the target's next feature, then read it with the target's head.

At position j the head reads the pair (f_j, t_{j+1}): the target's feature there and the token
that followed it. An fc maps [embedding(t_{j+1}), f_j] (2H) to H, one decoder layer runs over
it (with a KV cache of the earlier pairs), and the result g_j is the head's guess of f_{j+1}.
The target's lm_head turns g_j into a law for t_{j+2}; the target's final norm comes first
exactly when the convention's features are taken before it (`hidden.normed` False), since g_j
stands in for a feature of that same kind. Within a round the head is chained: its own g_j is
the feature of the next pair.
"""

import torch
import torch.nn as nn

from reference.heads.base import check_pairs, new_cache, one_layer, share_target
from reference.hidden import HiddenStates, last_layer
from reference.model import Block


class EagleHead(nn.Module):
    def __init__(self, target, hidden: HiddenStates | None = None):
        super().__init__()
        c = target.config
        self.config = one_layer(c)
        self.hidden = last_layer(c.num_hidden_layers) if hidden is None else hidden
        if not isinstance(self.hidden, HiddenStates) or len(self.hidden.layers) != 1:
            raise ValueError(f"EagleHead reads one hidden state of the target: hidden must be a "
                             f"HiddenStates of one layer, got {hidden!r}")
        self.hidden.indices(c.num_hidden_layers)   # names layers the target has
        H = c.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)   # [embedding, feature] -> H
        self.layer = Block(self.config, 0)
        share_target(self, target)

    @property
    def draft_to_target(self):
        return None   # drafts over the target's whole vocabulary

    def new_cache(self, capacity: int):
        return new_cache(self.config, capacity, self.fc.weight)

    def start(self, features):
        """The target's features [B, T, H] as the head's h: used as they are."""
        return features

    def forward(self, tokens, h, cache, positions=None, mask=None):
        """tokens [B, T] (t_{j+1}), h [B, T, H] (f_j or the head's own g_{j-1}) at positions
        cache.length + t -> (logits [B, T, V] for t_{j+2}, g [B, T, H] for the next pair).
        positions [B, T] and mask [B, T, S]: a tree level's instead (reference/heads/tree.py)."""
        positions, mask = check_pairs(tokens, h, self.config.hidden_size, cache,
                                      self.config.vocab_size, "EagleHead",
                                      positions, mask)
        x = self.fc(torch.cat([self.target.model.embed_tokens(tokens), h], dim=-1))  # [B, T, H]
        g = self.layer(x, cache, positions, mask)
        cache.advance(tokens.shape[1])
        out = g if self.hidden.normed else self.target.model.norm(g)
        return self.target.lm_head(out), g
