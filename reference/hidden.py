"""Which of the target's hidden states a feature-level head reads: one explicit convention.

Engines disagree on what "the hidden state of layer L" is, and a head trained on one reading
drafts badly (never wrongly: the rule stays exact) on another. Everything is named on the
residual stream: states[i] is the stream after i of the target's N blocks, [B, T, H] (states[0]
is the token embeddings, states[N] the input of the final norm). Then

    where="input",  layer l  ->  states[l]       (what layer l reads; vLLM's EAGLE-3 aux layer
                                                   ids are this, l = 0 .. N: N is states[N])
    where="output", layer l  ->  states[l + 1]   (layer l's residual output; l = N - 1 is the
                                                   pre-final-norm output)
    normed=True              ->  the target's final RMSNorm applied to each (the "last hidden
                                  state" of Hugging Face models and of vLLM's return value)

so "input of layer l + 1" and "output of layer l" are the same tensor, by construction. The
features a head receives are the chosen states concatenated in the order given:
[B, T, len(layers) * H].
"""

from dataclasses import dataclass

import torch

WHERE = ("input", "output")


@dataclass(frozen=True)
class HiddenStates:
    layers: tuple          # target layer indices, in the order their states are concatenated
    where: str = "output"  # "output": a layer's residual output; "input": what the layer reads
    normed: bool = False   # apply the target's final norm to each chosen state

    def __post_init__(self):
        layers = tuple(self.layers) if isinstance(self.layers, (list, tuple)) else None
        if (not layers or not all(isinstance(l, int) and not isinstance(l, bool) and l >= 0
                                  for l in layers)):
            raise ValueError(f"HiddenStates.layers must be a non-empty tuple of layer indices "
                             f"(ints >= 0), got {self.layers!r}")
        object.__setattr__(self, "layers", layers)
        if self.where not in WHERE:
            raise ValueError(f"HiddenStates.where must be one of {WHERE}, got {self.where!r}")
        if not isinstance(self.normed, bool):
            raise ValueError(f"HiddenStates.normed must be a bool, got {self.normed!r}")

    def indices(self, num_layers: int) -> list[int]:
        """The indices into states (0 .. num_layers) this convention reads, checked against a
        target of num_layers blocks."""
        shift = 1 if self.where == "output" else 0
        # "input" may name layer num_layers: the stream after the last block (vLLM's last id)
        last = num_layers - 1 if self.where == "output" else num_layers
        for l in self.layers:
            if l > last:
                raise ValueError(f"HiddenStates(layers={self.layers}, where={self.where!r}): "
                                 f"layer {l} is past the target's {num_layers} layers (at most "
                                 f"{last} with where={self.where!r})")
        return [l + shift for l in self.layers]

    def pick(self, states: list, norm) -> torch.Tensor:
        """The features from the residual states (states[i] after i blocks, each [B, T, H])
        and the target's final norm: [B, T, len(layers) * H]."""
        chosen = [states[i] for i in self.indices(len(states) - 1)]
        if self.normed:
            chosen = [norm(s) for s in chosen]
        return torch.cat(chosen, dim=-1)

    def width(self, hidden_size: int) -> int:
        return len(self.layers) * hidden_size

    def describe(self) -> str:
        return (f"{'normed ' if self.normed else ''}{self.where} of layer"
                f"{'s' if len(self.layers) > 1 else ''} {', '.join(map(str, self.layers))}")


def last_layer(num_layers: int, normed: bool = False) -> HiddenStates:
    """The target's final hidden state: the last layer's output, before the final norm (the
    norm's input) or after it (normed=True)."""
    return HiddenStates((num_layers - 1,), "output", normed)


def forward_hidden(target, ids, cache, hidden: HiddenStates, positions=None, mask=None):
    """The target's verify forward that also returns the hidden states `hidden` names:
    (logits [B, T, V], features [B, T, hidden.width(H)]); positions and mask as the target's
    forward takes them (a tree's verify). The target's own method
    (reference.model.Qwen3.forward_hidden); a target without one cannot feed a head."""
    method = getattr(target, "forward_hidden", None)
    if method is None:
        raise ValueError(f"a feature-level head needs the target's hidden states, and target "
                         f"{type(target).__name__} has no forward_hidden(ids, cache, hidden) "
                         f"(reference.model.Qwen3 has)")
    return method(ids, cache, hidden, positions, mask)
