"""Prompt lookup as a fast-engine drafter: n-gram matching on the device, batched, no model.

Each round every row proposes the k tokens that followed the most recent earlier occurrence of
its context's last `ngram` tokens, trying shorter n-grams when that fails, as
reference.proposers.PromptLookup does. The engine verifies exactly k per row, so where the match
leaves fewer than k tokens before the context ends, or nothing matches, the rest of the row's
proposals are its newest token (the reference would propose fewer; a filler is rejected, or
accepted when the target agrees, like any proposal).

Why the output stays exact: the proposals are a function of the committed tokens alone, drawn
with certainty, so q is one-hot on each. The rule then accepts x with probability p(x) and
corrects from max(p - q, 0), which is p with x removed and renormalized: every committed token
is distributed as the target's, and under greedy decoding the argmax check needs no q at all.

The drafter keeps its rows' committed tokens itself (`history` [B, width]), since the engine
tells a drafter only each row's newest token and its cache length: each round it first writes
the block it proposed last round (the newest token then, and its k proposals) at the row's
previous length; the new length says how many of them were committed, and the ones past it are
never read (the lookup reads a row's first length + 1 entries only). The search itself is
fast/lookup.cpp on a CPU (one call; the tensor operations were a quarter of a decode step of the
trained target) and elsewhere tensor operations over [B, length] windows: no host
synchronisation, no Python loop over rows. Both give the same proposals (tested).

    fast.batched_generate(target, fast.PromptLookup(3), prompts, 64, k=4)
"""

import torch
import torch.nn.functional as F

from fast import native


class PromptLookup:
    """The fast engine's prompt-lookup drafter (fast/drafter.py protocol); see the module."""

    def __init__(self, ngram: int = 3):
        if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 1:
            raise ValueError(f"ngram must be an int >= 1, got {ngram!r}")
        self.ngram = ngram
        self.vocab_size = None      # the target's, set by the engine (bind)
        self.history = None         # [B, width] committed tokens per row (and stale entries)
        self.pending = None         # (lengths [B], block [B, k+1]) proposed last round
        self.use_kernel = True      # fast/lookup.cpp on a CPU (False: the tensor operations)

    def bind(self, vocab_size: int, device) -> None:
        """Called by the engine: proposals are tokens of the target's vocabulary."""
        self.vocab_size, self.device = vocab_size, device

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """ids [B, T]: the padded prompts minus their newest token; lengths [B] (<= T)."""
        B, T = ids.shape
        self.history = torch.zeros(B, T + 64, dtype=torch.long, device=ids.device)  # [B, width]
        self.history[:, :T] = ids
        self.pending = None

    def _room(self, width: int) -> None:
        if self.history.shape[1] < width:      # host-side sizes only: no sync
            grown = torch.zeros(self.history.shape[0], 2 * width, dtype=torch.long,
                                device=self.history.device)
            grown[:, :self.history.shape[1]] = self.history
            self.history = grown

    def propose(self, rows, lengths: torch.Tensor, k: int, sampler, bound: int):
        """rows.last [B]; lengths [B]: committed tokens minus the newest; bound >= max(lengths)
        + 1 on the host. Returns (proposals [B, k], q [B, k, V] one-hot or None if greedy)."""
        B = lengths.shape[0]
        self._room(bound + k + 2)
        history = self.history
        at = torch.arange(B, device=lengths.device)
        if self.pending is not None:
            before, block = self.pending
            slots = before[:, None] + torch.arange(block.shape[1], device=block.device)  # [B, k+1]
            history[:B].scatter_(1, slots, block)
        history[at, lengths] = rows.last
        proposals = self._search_kernel(history[:B], lengths, rows.last, k, bound)
        if proposals is None:
            proposals = self._search(history, lengths, rows.last, k, bound)
        self.pending = (lengths.clone(), torch.cat([rows.last[:, None], proposals], 1))
        if sampler.greedy:
            return proposals, None
        return proposals, F.one_hot(proposals, self.vocab_size).to(torch.float64)  # [B, k, V]

    def _search_kernel(self, history, lengths, last, k: int, bound: int):
        """fast/lookup.cpp on a CPU (the same search, one call), or None where it cannot run."""
        if history.device.type != "cpu" or not self.use_kernel:
            return None
        module = native.kernel()
        if module is None:
            return None
        return module.lookup(history, lengths.contiguous(), last.contiguous(), k, self.ngram, bound)

    def _search(self, history, lengths, last, k: int, bound: int):
        """The search as tensor operations: proposals [B, k] (see the module docstring)."""
        B = lengths.shape[0]
        at = torch.arange(B, device=lengths.device)
        n = lengths + 1                                                      # [B] context length
        span = history[:B, :bound]                                           # [B, S]
        source = torch.full((B,), -1, dtype=torch.long, device=lengths.device)  # first proposed slot
        for size in range(self.ngram, 0, -1):
            if size >= bound:
                continue
            offsets = torch.arange(size, device=lengths.device)
            pattern = history[at[:, None], (n - size)[:, None].clamp(min=0) + offsets]  # [B, size]
            windows = span.unfold(1, size, 1)                                # [B, S - size + 1, size]
            starts = torch.arange(windows.shape[1], device=lengths.device)
            # a match must end before the context's newest token (so it has a next token)
            hit = (windows == pattern[:, None, :]).all(-1) & (starts[None] <= (n - size - 1)[:, None])
            latest = torch.where(hit, starts[None], -1).amax(-1)            # [B], -1: none
            source = torch.where((source < 0) & (latest >= 0), latest + size, source)
        slots = source[:, None] + torch.arange(k, device=lengths.device)    # [B, k]
        inside = (source >= 0)[:, None] & (slots < n[:, None])
        found = history[at[:, None], slots.clamp(0, history.shape[1] - 1)]
        return torch.where(inside, found, last[:, None])                    # [B, k]

    def after_round(self, catch_up: bool) -> None:
        pass

    def compact(self, order: torch.Tensor, count: int) -> None:
        keep = order[:count]
        self.history = self.history[keep]
        if self.pending is not None:
            self.pending = (self.pending[0][keep], self.pending[1][keep])
