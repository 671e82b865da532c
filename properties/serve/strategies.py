"""Hypothesis strategies for served-engine examples.

Prompts are random, or a short pattern repeated: the latter gives prompt lookup (n-gram
speculation) matches to propose from, so speculation is exercised, not only requested.
Stop ids are taken from the target's own greedy continuation, so that they fall inside the
blocks a speculator proposes and the server accepts.
"""

from __future__ import annotations

from hypothesis import strategies as st

from properties.serve import oracle
from properties.serve.cases import ServedCase
from properties.serve.models import VOCAB

TOKENS = st.integers(0, VOCAB - 1)
TEMPERATURES = (0.5, 0.8, 1.0, 1.3)
TOP_KS = (0, 0, 2, 5, 12)
TOP_PS = (1.0, 1.0, 0.9, 0.7)


@st.composite
def prompts(draw):
    if draw(st.booleans()):
        return tuple(draw(st.lists(TOKENS, min_size=1, max_size=12)))
    pattern = draw(st.lists(TOKENS, min_size=1, max_size=4))
    tail = draw(st.lists(TOKENS, max_size=2))
    return tuple(pattern * draw(st.integers(2, 4)) + tail)


@st.composite
def greedy_cases(draw, with_stops: bool = False):
    prompt = draw(prompts())
    max_tokens = draw(st.integers(1, 16))
    stops = ()
    if with_stops or draw(st.booleans()):
        continuation = oracle.greedy(prompt, max_tokens)
        if len(continuation) > 1:
            at = draw(st.integers(1, len(continuation) - 1))
            stops = (continuation[at],) + tuple(draw(st.lists(TOKENS, max_size=1)))
    return ServedCase(prompt, max_tokens, stop_ids=stops)


@st.composite
def sampling_cases(draw, max_len: int = 2, with_stops: bool = False, filters: bool = True):
    """filters=False: no top-k and no top-p (the temperature alone shapes the law)."""
    prompt = draw(prompts())
    stops = tuple(draw(st.lists(TOKENS, min_size=1 if with_stops else 0, max_size=2)))
    return ServedCase(prompt, draw(st.integers(1, max_len)),
                      temperature=draw(st.sampled_from(TEMPERATURES)),
                      top_k=draw(st.sampled_from(TOP_KS)) if filters else 0,
                      top_p=draw(st.sampled_from(TOP_PS)) if filters else 1.0,
                      stop_ids=stops, seed=draw(st.integers(0, 2**20)))
