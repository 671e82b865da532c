"""What every head proposer keeps of the target's forwards: the verified features (the invariant
written in proposer.py), and the draw that maps a head's law onto the target's vocabulary."""

import torch

from reference.sampling import greedy_token


class Verified:
    """The target's features of the committed tokens (the invariant in proposer.py's
    docstring), and a draw that maps a head's law onto the target's vocabulary."""

    def __init__(self, head, sampler, device):
        self.head, self.sampler, self.device = head, sampler, device
        self.hidden = head.hidden   # speculative_generate hands over these hidden states
        self.features = None        # [committed - 1, width]
        self.seen = None            # the latest target forward's features [T, width]

    def saw(self, features):
        self.seen = features

    def prefill(self, ids):
        # the target's prefill covered ids[:-1], all committed
        self.features = self.seen

    def keep(self, accepted):
        # the verify forward covered [newest] + proposals: the first accepted + 1 are committed
        kept = self.seen[:accepted + 1]
        self.features = kept if self.features is None else torch.cat([self.features, kept])

    def feature_rows(self, start, stop):
        """The verified features of positions start .. stop - 1: [stop - start, width]."""
        return self.features[start:stop]

    def verified(self, context) -> int:
        """How many committed tokens have a verified feature (all but the newest)."""
        n = 0 if self.features is None else len(self.features)
        if n not in (0, len(context) - 1):
            raise RuntimeError(f"{type(self).__name__}: {n} verified features for a context of "
                               f"{len(context)} tokens (expected {len(context) - 1}): the "
                               f"proposer was not handed every target forward")
        return n

    def choose(self, logits):
        """logits [Vd] of a head -> (target token id, q on the target's vocabulary [V], or None
        when greedy). With a draft vocabulary (d2t), draft index i stands for target token
        d2t[i]; q is placed there, zero elsewhere (see eagle3.py for why that stays exact)."""
        d2t = getattr(self.head, "draft_to_target", None)
        if self.sampler.greedy:
            i = int(greedy_token(logits))
            return (i if d2t is None else int(d2t[i])), None
        law = self.sampler.probs(logits)  # [Vd]
        i = self.sampler.draw(law)
        if d2t is None:
            return i, law
        q = torch.zeros(self.head.config.vocab_size, dtype=law.dtype, device=law.device)
        q[d2t] = law  # [V]
        return int(d2t[i]), q
