"""properties/acceptance.py's replay at a request's end of sequence, under each engine's
convention: by default a round's matching proposals are all accepted; with
eos_stops_acceptance (llama.cpp) none after the end-of-sequence id is, and the id itself only
as the round's last proposal. Worked by hand on a made-up target path and a perfect draft."""

import pytest

from properties import acceptance
from properties.engines import llamacpp

EOS = 11
# the target's greedy path: 6 ordinary tokens, the end of sequence, then what would follow
PATH = [27, 5, 27, 5, 27, 30, EOS, 4, 4, 4, 4, 4, 4]


def perfect(committed, n):
    return PATH[committed:committed + n]


def test_a_perfect_draft_reaching_the_end_inside_a_round():
    # capped schedule, max_tokens 9, the request stopped after 7 tokens (EOS last): round 1
    # drafts 4 after the first token, all accepted (committed 6); round 2 drafts 2 (capped to
    # 9 - 6 - 1): the end of sequence is its first proposal
    counted = acceptance.replay(PATH, perfect, 9, 4, "capped", produced=7)
    stops = acceptance.replay(PATH, perfect, 9, 4, "capped", produced=7,
                              eos_stops_acceptance=True)
    assert (counted.drafts, counted.drafted, counted.accepted) == (2, 6, 6)
    # llama.cpp: the EOS drafted first of 2 is "sampled", not accepted; the proposal after it
    # is not accepted either (what the server reported for this request: 6 drafted, 4 accepted)
    assert (stops.drafts, stops.drafted, stops.accepted) == (2, 6, 4)


def test_an_end_of_sequence_as_the_rounds_last_proposal_is_still_accepted():
    # the request stopped after 5 tokens (make PATH[4] the EOS): round 1 drafts 4 from
    # committed 1, the EOS its last: accepted ("a trailing EOG is still accepted")
    path = [27, 5, 27, 5, EOS, 30, 4, 4, 4, 4, 4]
    stops = acceptance.replay(path, lambda c, n: path[c:c + n], 9, 4, "capped", produced=5,
                              eos_stops_acceptance=True)
    assert (stops.drafted, stops.accepted) == (4, 4)


def test_no_end_of_sequence_no_difference():
    # a request that ran to max_tokens: the convention changes nothing, nor for a draft that
    # never reaches the end
    for produced in (None, 9):
        a = acceptance.replay(PATH, perfect, 9, 4, "capped", produced=produced)
        b = acceptance.replay(PATH, perfect, 9, 4, "capped", produced=produced,
                              eos_stops_acceptance=True)
        assert a == b

    def wrong(committed, n):
        return [31] * n
    assert acceptance.replay(PATH, wrong, 9, 4, "capped", produced=7,
                             eos_stops_acceptance=True).accepted == 0


def test_llamacpp_declares_the_convention_and_others_do_not():
    from properties.adapters.dialects import Dialect
    assert llamacpp.DIALECT.eos_stops_acceptance is True
    assert Dialect().eos_stops_acceptance is False


@pytest.mark.parametrize("schedule", acceptance.SCHEDULES)
def test_every_schedule_takes_the_convention(schedule):
    out = acceptance.replay(PATH, perfect, 9, 4, schedule, produced=7, eos_stops_acceptance=True)
    assert out.accepted < out.drafted
