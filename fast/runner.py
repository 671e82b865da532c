"""One model (target or draft) with its static cache and its steps: prefill, chain, tree.

Slots and positions:
- chain step: row b feeds T tokens at slots start[b] .. start[b] + T - 1, which are also their
  rotary positions; each token sees the row's prefix [0, start[b]) and the fed tokens up to
  itself (lower-triangular visibility).
- tree step: the caller gives slots, positions (prefix length + depth) and the visibility of
  the window that starts at window_start[b] (the ancestor-or-self matrix of the tree).
Steps of fixed shape go through the StepRunner, so on CUDA they are captured once and replayed.
"""

import torch

from fast.cache import StaticCache
from fast.forward import forward, window_mask
from fast.graphs import StepRunner
from fast.rotary import rotary_table
from fast.weights import ModelWeights


class ModelRunner:
    def __init__(self, weights: ModelWeights, max_batch: int, capacity: int, steps: StepRunner):
        s = weights.shape
        self.weights = weights
        self.cache = StaticCache(s.num_layers, max_batch, s.num_kv_heads, s.head_dim, capacity,
                                 weights.dtype, weights.device)
        self.steps = steps
        # Everything a captured step reads is owned here, for as long as the runner lives: a
        # CUDA graph keeps raw device pointers, not references. Tables are built now, outside
        # any capture.
        self.rotary = rotary_table(s.head_dim, s.rope_theta, capacity, weights.dtype, weights.device)
        self._causal = {}       # T -> lower-triangular visibility [T, T]
        self._visibility = {}   # tree step name -> its visibility [T, W]

    @property
    def device(self):
        return self.weights.device

    @property
    def capacity(self):
        return self.cache.capacity

    def causal(self, T: int) -> torch.Tensor:
        if T not in self._causal:
            self._causal[T] = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()  # [T, T]
        return self._causal[T]

    def span(self, bound: int) -> int:
        """Slots attention reads: the whole cache when graphs need a fixed shape, else a bound."""
        return self.capacity if self.steps.use_graphs else min(self.capacity, bound)

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, states=None):
        """Feed padded prompts ids [B, T] from slot 0 and set lengths [B] (<= T).

        Padding past a row's length is written and then dead: the row's length excludes it.
        Runs eagerly: prompt shapes vary from call to call. states: residual-state indices
        whose features [B, T, n * hidden] are returned (fast/forward.py), else None.
        """
        B, T = ids.shape
        features = None
        if T > 0:
            slots = torch.arange(T, device=self.device).expand(B, T)   # [B, T]
            start = torch.zeros(B, dtype=torch.long, device=self.device)
            mask = window_mask(start, self.causal(T), T)
            out = forward(self.weights, self.cache, ids, slots, slots, mask, T, None, self.rotary,
                          states)
            features = None if states is None else out[1]
        elif states is not None:
            features = torch.empty(B, 0, len(states) * self.weights.shape.hidden_size,
                                   dtype=self.weights.dtype, device=self.device)
        self.cache.rollback(B, lengths)
        return features

    def chain(self, ids: torch.Tensor, start: torch.Tensor, bound: int, logits_at: str = "all",
              states=None):
        """Feed ids [B, T] at slots start[b] + t; logits per logits_at. bound >= max(start) + T.
        states: residual-state indices; then (logits, features [B, T, n * hidden])."""
        B, T = ids.shape
        span = self.span(bound)
        visibility = self.causal(T)

        def step(ids, start):
            slots = start[:, None] + torch.arange(T, device=start.device)  # [B, T]
            mask = window_mask(start, visibility, span)
            out = forward(self.weights, self.cache, ids, slots, slots, mask, span, logits_at,
                          self.rotary, states)
            # a captured step has one static output tensor: logits and features side by side
            return out if states is None else torch.cat(out, -1)

        out = self.steps(("chain", id(self), B, T, span, logits_at, states), step, ids, start)
        if states is None:
            return out
        V = self.weights.shape.vocab_size
        return out[..., :V], out[..., V:]

    def tree(self, ids, slots, positions, window_start, visibility, name: str, bound: int,
             logits_at: str = "all"):
        """Feed tree nodes ids [B, T] at slots [B, T] with positions [B, T] under `visibility`
        [T, W] (a window starting at window_start [B]). `name` identifies the visibility: it is
        part of the capture key, so two trees never share a captured step."""
        B, T = ids.shape
        span = self.span(bound)
        if name not in self._visibility:
            self._visibility[name] = visibility.clone()
        visibility = self._visibility[name]

        def step(ids, slots, positions, window_start):
            mask = window_mask(window_start, visibility, span)
            return forward(self.weights, self.cache, ids, slots, positions, mask, span, logits_at,
                           self.rotary)

        return self.steps(("tree", id(self), name, B, T, span, logits_at), step, ids, slots,
                          positions, window_start)


def padded_prompts(prompts, device):
    """Prompts without their last token, padded: (ids [B, P_max - 1], lengths [B])."""
    longest = max(len(p) for p in prompts)
    padded = torch.zeros(len(prompts), longest - 1, dtype=torch.long)          # [B, P_max - 1]
    for i, prompt in enumerate(prompts):
        padded[i, :len(prompt) - 1] = torch.tensor(prompt[:-1], dtype=torch.long)
    lengths = torch.tensor([len(p) - 1 for p in prompts], device=device)      # [B]
    return padded.to(device), lengths
