"""properties.methods.HeadDraft: a feature-level head as a method's drafter (issue 40)."""

import pytest

from properties.methods import HEAD_KINDS, HeadDraft, Method
from reference.hidden import HiddenStates

EAGLE3 = HeadDraft("eagle3", "head-eagle3", HiddenStates((1, 2, 3), "input"))


def test_a_head_drafts_every_round_and_is_not_replayed_yet():
    assert EAGLE3.proposes((1, 2), (5,)) is False        # one token: nothing judged was drafted
    assert EAGLE3.proposes((1, 2), (5, 6)) is True       # from the second token on, every round
    assert (EAGLE3.replays, EAGLE3.model, EAGLE3.lookup, EAGLE3.perfect) == (False, None, False, False)
    assert EAGLE3.export == "head-eagle3"


def test_a_head_leaves_the_case_as_it_is():
    """No covering prompt (a lookup's need): a head drafts whatever the context."""
    case = object()
    assert EAGLE3.cover(case) is case


def test_describe_names_the_head_and_the_convention():
    assert EAGLE3.describe() == ("EAGLE-3 head head-eagle3 reading the target's input of "
                                 "layers 1, 2, 3")
    assert HeadDraft("mtp", "mtp-1").describe() == \
        "MTP head mtp-1 reading the engine's default hidden states"
    assert HeadDraft("medusa", "m", HiddenStates((3,), normed=True)).describe() == \
        "Medusa head m reading the target's normed output of layer 3"


def test_a_method_takes_a_head():
    method = Method("eagle3", "EAGLE-3 over the kit's target", EAGLE3, k=3)
    assert method.drafter is EAGLE3 and method.k == 3


@pytest.mark.parametrize("args, message", [
    (("hydra", "h"), "kind='hydra', choose from"), (("eagle", ""), "head='', must be"),
    (("eagle", "h", (3,)), r"hidden=\(3,\), must be a reference.hidden.HiddenStates")])
def test_bad_heads_are_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        HeadDraft(*args)


def test_every_reference_head_kind_has_a_name():
    from reference.heads import KINDS
    assert set(HEAD_KINDS) == set(KINDS)
