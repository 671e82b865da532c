"""Medusa (Cai et al., 2024): K heads on the target's last hidden state, none chained.

From the target's feature f_j at position j (whose own lm_head already gives the law of
t_{j+1}), head i (1-based) predicts t_{j+1+i}: the token i + 1 places ahead. A head is a
residual SiLU block, x + silu(W x + b), then a linear map to the vocabulary.

In a round whose newest token is t_n (chosen, not yet verified), the latest verified feature
is f_{n-1}, so head i proposes t_{n+i}: proposal i. The heads are not autoregressive: q_i is
head i's law, the same whatever the proposals before it were. The rejection rule is still
exact, because it asks only that proposal i be a draw from the q_i handed to the verifier,
drawn before and independently of the verdict -- not that q_i be conditioned on the earlier
proposals. (Such a q_i is merely a worse guess: acceptance suffers, the output does not.)
"""

import torch
import torch.nn as nn

from reference.hidden import HiddenStates, last_layer


class ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int = 1):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=True)
                                    for _ in range(num_layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, config, num_heads: int, hidden: HiddenStates | None = None,
                 num_layers: int = 1):
        """config: the target's Config. num_heads: K, the most tokens a round can propose.
        hidden: the feature the heads read (default: the target's final hidden state after
        its final norm, as Medusa's heads were trained on)."""
        super().__init__()
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
            raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}")
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
        self.config = config
        self.hidden = last_layer(config.num_hidden_layers, normed=True) if hidden is None else hidden
        if not isinstance(self.hidden, HiddenStates) or len(self.hidden.layers) != 1:
            raise ValueError(f"MedusaHeads read one hidden state of the target: hidden must be a "
                             f"HiddenStates of one layer, got {hidden!r}")
        self.hidden.indices(config.num_hidden_layers)
        H = config.hidden_size
        self.blocks = nn.ModuleList(ResidualBlock(H, num_layers) for _ in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(H, config.vocab_size, bias=False)
                                      for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.lm_heads)

    def forward(self, features):
        """features [B, T, H] (f_j) -> logits [B, T, K, V]: [..., i - 1, :] is head i's law
        of t_{j+1+i}."""
        H = self.config.hidden_size
        if not torch.is_tensor(features) or features.dim() != 3 or features.shape[-1] != H:
            raise ValueError(f"MedusaHeads: features must be [batch, tokens, {H}], got "
                             f"{tuple(getattr(features, 'shape', ())) or type(features).__name__}")
        return torch.stack([head(block(features))
                            for block, head in zip(self.blocks, self.lm_heads)], dim=2)
