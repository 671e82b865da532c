"""The committed sequence of a speculative run (chain or tree), and the stats it reports."""


class Committed:
    """The prompt and the output so far. A round's new tokens are added one by one: the output
    ends at the first stop id, even inside an accepted block, and never exceeds max_new_tokens."""

    def __init__(self, prompt, max_new_tokens, stop):
        self.context, self.output = list(prompt), []
        self.max_new_tokens, self.stop, self.stopped = max_new_tokens, stop, False
        self.rounds = self.accepted = self.proposed = 0

    @property
    def done(self):
        return self.stopped or len(self.output) == self.max_new_tokens

    @property
    def remaining(self):
        return self.max_new_tokens - len(self.output)

    def add(self, new_tokens, accepted, proposed):
        """One round's tokens, of which the first `accepted` were proposals it accepted out of
        `proposed`."""
        self.rounds += 1
        self.accepted += accepted
        self.proposed += proposed
        for token in new_tokens:
            if self.done:
                break
            self.output.append(token)
            self.context.append(token)
            self.stopped = token in self.stop

    def stats(self):
        return {"rounds": self.rounds,
                "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
                "tokens_per_target_call": len(self.output) / self.rounds if self.rounds else 0.0}
