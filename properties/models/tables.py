"""Table language models: logits after a prefix are a row of a seeded random table, chosen by a
rolling hash of the whole prefix (cheap, exact laws; every token of the context matters)."""

from __future__ import annotations


import numpy as np



_MASK64 = (1 << 64) - 1


# --------------------------------------------------------------------------- table LMs

def _mix(h: int, token: int) -> int:
    """One step of the rolling hash (splitmix64 finalizer over the state and the token)."""
    z = (h ^ ((token + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class TableLM:
    """Next-token logits = table[hash(prefix) % rows]; -inf entries are tokens it never emits."""

    ROWS = 1021

    def __init__(self, vocab: int, seed: int, scale: float, sparsity: float, tie_gap: float = 0.0):
        rng = np.random.default_rng([seed, vocab, 7])
        self.vocab = vocab
        self.start = _mix(seed & _MASK64, vocab)
        self.table = rng.standard_normal((self.ROWS, vocab)) * scale
        if sparsity > 0 and vocab > 2:
            # each row keeps a random subset of at least two tokens
            keep = max(2, int(round(vocab * (1 - sparsity))))
            for row in self.table:
                row[rng.permutation(vocab)[keep:]] = -np.inf
        if tie_gap > 0 and vocab > 1:
            # a near tie in every context: the runner-up sits exactly tie_gap below the top
            for row in self.table:
                first, second = np.argsort(-row, kind="stable")[:2]
                row[second] = row[first] - tie_gap
        self.table.flags.writeable = False   # the kit's evidence: an engine cannot edit it

    def logits(self, h_prev: int, h: int) -> np.ndarray:
        return self.table[h % self.ROWS]


class NegatedLM:
    """A draft whose greedy choice is never the target's: the finite logits negated."""

    def __init__(self, base: TableLM):
        self.base, self.vocab, self.start = base, base.vocab, base.start

    def logits(self, h_prev, h):
        row = self.base.logits(h_prev, h)
        return np.where(np.isfinite(row), -row, -np.inf)


class NoisyLM:
    """A close draft: the target's logits plus small seeded noise (high acceptance)."""

    def __init__(self, base: TableLM, seed: int, eps: float = 0.3):
        self.base, self.vocab, self.start = base, base.vocab, base.start
        self.noise = np.random.default_rng([seed, 11]).standard_normal(base.table.shape) * eps
        self.noise.flags.writeable = False

    def logits(self, h_prev, h):
        return self.base.logits(h_prev, h) + self.noise[h % TableLM.ROWS]


class LaggedLM:
    """A draft shifted by one position: it predicts what the target predicted one step earlier."""

    def __init__(self, base: TableLM):
        self.base, self.vocab, self.start = base, base.vocab, base.start

    def logits(self, h_prev, h):
        return self.base.logits(h_prev, h_prev)
