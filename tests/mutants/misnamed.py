"""A module whose engine function has the wrong name: `speculative_decode`.

Its `accept_or_correct` is correct, so the kit can check the rule level and nothing else.
A kit that printed a bare CONFORMANT here would certify an engine it never ran. Verdict:
"CONFORMANT at the rule level only; no speculative_generate", in the header and the verdict
line, with the hint "did you mean speculative_generate?" (and levels_missing in the JSON).
"""

from tests.mutants.engine import Speculator

_engine = Speculator()

accept_or_correct = _engine.accept_or_correct
speculative_decode = _engine.speculative_generate  # the chapter's API says speculative_generate
