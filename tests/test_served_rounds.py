"""Laws over several rounds (issue 42): the speculating fake server and its exact law, the
served_params checks over several rounds on it and on the round mutants
(tests/mutants/served_params.py: RejectedKeptInHistory, GeneratorRolledBack), and the
self-test's power, by a 1,000-run simulation of the checks' statistic drawn from the mutants'
exact laws (tests/fakes/speculating.py enumerates every decision of a server's rounds)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from properties import methods, oracle, statistics
from properties.adapters.served import make_impl
from properties.cases import ServedCase
from properties.checks import served_params as checks
from properties.harness import PropertyFailure
from properties import test_served_params as kit
from reference.penalties import OPENAI
from reference.sampling import SamplingParams
from tests.fakes.engine import FAKE
from tests.fakes.server import FakeServer
from tests.fakes.speculating import (Greedy, Sampled, RoundsServer, exact_law,
                                     total_variation)
from tests.mutants.served_params import GeneratorRolledBack, RejectedKeptInHistory

MUTANTS = (RejectedKeptInHistory, GeneratorRolledBack)
# the laws over several rounds with explicit examples (the bias's has none: the thorough
# profile's alpha budget is full; BIAS_ROUNDS is the example it would have)
LAW_TESTS = ("test_law_rounds_repetition_penalty",
             "test_law_rounds_presence_and_frequency_penalties")
BIAS_ROUNDS = ServedCase((0, 1, 2, 0, 1, 2, 0, 1), 5, SamplingParams(
    temperature=0.7, top_k=2, logit_bias=((1, 1.0),), repetition_penalty=1.6, seed=13))
GREEDY_TESTS = ("test_greedy_rounds_repetition_penalty",
                "test_greedy_rounds_presence_and_frequency_penalties",
                "test_greedy_rounds_logit_bias_with_penalties")
# the 2-token laws before issue 42 (one round at most in the window)
TWO_TOKEN_TESTS = ("test_law_repetition_penalty", "test_law_presence_and_frequency_penalties",
                   "test_law_logit_bias")
RUNS = 1000


def explicit(name: str) -> list[ServedCase]:
    return [e.kwargs["case"] for e in getattr(kit, name).hypothesis_explicit_examples]


def exact(case: ServedCase) -> dict:
    s = case.sampling
    return oracle.served_law(case.prompt, case.max_tokens, s.temperature, s.top_k, s.top_p,
                             s.stop_ids, params=s if s.shaped else None, formula=OPENAI)


def impl_of(server, base):
    return make_impl("openai:" + server.url, dialect=FAKE, baseline=base.url,
                     method=methods.by_option("perfect"))


# --------------------------------------------------------------------------- the enumeration

@pytest.mark.extra   # minutes of CPU: make test-extra; cheaper tests of it stay
def test_the_correct_speculating_server_has_the_exact_law():
    """Its rounds (greedy proposals of a draft, token-wise verification, residual draws,
    bonus tokens) enumerated decision by decision give the oracle's law of ancestral sampling,
    with penalties, a bias and none; and its greedy output is the exact greedy output."""
    good = RoundsServer()
    for case in [explicit(name)[0] for name in LAW_TESTS] + [BIAS_ROUNDS]:
        law = exact_law(good, case.prompt, case.max_tokens, case.sampling)
        assert total_variation(law, exact(case)) < 1e-12, case
    for name in GREEDY_TESTS:
        case = explicit(name)[0]
        (tokens,), = [exact_law(good, case.prompt, case.max_tokens, case.sampling)]
        assert list(tokens) == oracle.served_greedy(case.prompt, case.max_tokens,
                                                    params=case.sampling, formula=OPENAI)


@pytest.mark.extra   # minutes of CPU: make test-extra; cheaper tests of it stay
@pytest.mark.parametrize("server", (RoundsServer,) + MUTANTS, ids=lambda c: c.__name__)
def test_sampled_rounds_follow_the_enumerated_law(server):
    """What the server samples (its generator, restored or not) is what the enumeration says:
    3,000 completions against the enumerated law, chi-square at 1e-3."""
    case = explicit("test_law_rounds_repetition_penalty")[0]
    fake = server()
    law = exact_law(fake, case.prompt, case.max_tokens, case.sampling)
    outputs = Counter(tuple(fake.speculate(case.prompt, case.max_tokens, case.sampling, set(),
                                           Sampled(np.random.default_rng([77, i]))))
                      for i in range(3000))
    result = statistics.chi_square_gof(outputs, law, alpha=1e-3)
    assert result.passed, result.summary()


def test_a_restored_generator_reuses_its_uniforms():
    """The enumeration's intervals: a uniform decided twice is narrowed twice, so a path's
    probability is the length of the intersection (u < 0.3, then u >= 0.2: 0.1)."""
    from tests.fakes.speculating import Enumerating
    draws = Enumerating([0, 1])
    mark = draws.mark()
    assert draws.accept(0.3)
    draws.restore(mark)
    assert not draws.accept(0.2)
    assert draws.probability == pytest.approx(0.1)


# --------------------------------------------------------------------------- where a law breaks

def test_positions_name_the_first_position_off():
    """A law of three tokens whose third is reversed given the first two: positions 0 and 1
    agree with the law, position 2 is off; exact counts agree everywhere."""
    law = {(a, b, c): 1 / 8 * (0.8 if c == a else 0.2) * 2 for a in (0, 1) for b in (0, 1)
           for c in (0, 1)}
    n = 4000
    exact_counts = Counter({o: round(p * n) for o, p in law.items()})
    rows = statistics.positions(exact_counts, law)
    assert [i for i, _, _ in rows] == [0, 1, 2] and all(p > 0.5 for _, p, _ in rows)
    off = Counter({(a, b, c): round(n / 8 * (0.2 if c == a else 0.8) * 2)
                   for a, b, c in law})
    rows = statistics.positions(off, law)
    assert rows[0][1] > 0.5 and rows[1][1] > 0.5 and rows[2][1] < 1e-12
    assert "first breaks at position 2" in checks.first_break(off, law)
    assert "first breaks at position 2" in checks.first_break(off, base=exact_counts)
    # an output impossible after its prefix: its position, p = 0
    assert statistics.positions(Counter({(0, 0, 2): 1}) + exact_counts, law)[2][1] == 0.0


def test_law_rounds_refuses_an_output_too_short_for_two_rounds():
    with pytest.raises(ValueError, match="3 tokens or more"):
        checks.check_law_rounds(None, ServedCase((1, 2), 2, SamplingParams(temperature=1.0)))


# --------------------------------------------------------------------------- the checks, served

def test_correct_speculating_server_passes_the_rounds_checks():
    with RoundsServer() as fake, FakeServer() as base:
        impl = impl_of(fake, base)
        for case in [c for name in LAW_TESTS for c in explicit(name)] + [BIAS_ROUNDS]:
            assert checks.check_law_rounds(impl, case).passed
        for name in GREEDY_TESTS:
            for case in explicit(name):
                checks.check_greedy(impl, case)


@pytest.mark.parametrize("mutant, check, test, match", [
    (RejectedKeptInHistory, checks.check_law_rounds, "test_law_rounds_repetition_penalty",
     r"speculation changes the law \(the baseline server.*\): the law first breaks at "
     r"position [2-4] "),
    (GeneratorRolledBack, checks.check_law_rounds, "test_law_rounds_repetition_penalty",
     r"the law first breaks at position [2-4] "),
    (RejectedKeptInHistory, checks.check_greedy, "test_greedy_rounds_presence_and_frequency"
                                                 "_penalties", r"position \d+: served token"),
], ids=("history-law", "generator-law", "history-greedy"))
def test_round_mutants_fail_the_rounds_checks_naming_the_position(mutant, check, test, match):
    with mutant() as fake, FakeServer() as base:
        with pytest.raises(PropertyFailure, match=match) as failure:
            check(impl_of(fake, base), explicit(test)[0])
    assert f"{check.__module__}:{check.__name__}" in str(failure.value)   # the replay line


@pytest.mark.extra   # minutes of CPU: make test-extra; cheaper tests of it stay
def test_two_token_laws_cannot_see_the_round_mutants():
    """Why the laws over several rounds exist: the 2-token laws' examples hold one round at
    most, so both round mutants give them exactly the correct law."""
    for name in TWO_TOKEN_TESTS:
        for case in explicit(name):
            for mutant in MUTANTS:
                law = exact_law(mutant(), case.prompt, case.max_tokens, case.sampling)
                assert total_variation(law, exact(case)) < 1e-12, (name, mutant.__name__)


# --------------------------------------------------------------------------- the self-test's power

def simulated_p_values(law: dict, deviating: dict, runs: int, seed: int) -> np.ndarray:
    """The p-values of check_law_rounds's test in `runs` simulated checks of a server whose
    outputs have the law `deviating`: plan(law) samples drawn from `deviating`, judged against
    `law` with chi_square_gof's pooling (statistics.chi_square_statistics, vectorized); an
    output of exact probability 0 fails the check outright (p = 0)."""
    n = statistics.plan(list(law.values()), checks.DELTA_SERVED).n
    support = sorted(set(law) | set(deviating))
    q = np.array([deviating.get(o, 0.0) for o in support])
    counts = np.random.default_rng(seed).multinomial(n, q / q.sum(), size=runs)
    possible = np.array([law.get(o, 0.0) > 0 for o in support])
    stat, df = statistics.chi_square_statistics(counts[:, possible],
                                                np.array([law[o] for o, ok in zip(support, possible)
                                                          if ok]))
    p = stats.chi2.sf(stat, df)
    p[counts[:, ~possible].sum(1) > 0] = 0.0
    # the vectorized statistic is the check's own: the first replicates by gof_p_value
    for row, value in zip(counts[:5], p[:5]):
        observed = {o: int(c) for o, c in zip(support, row) if c}
        assert statistics.gof_p_value(observed, law) == pytest.approx(value, rel=1e-6, abs=1e-300)
    return p


def self_test_power(mutant, runs: int = RUNS, seed: int = 42) -> dict:
    """Per explicit example of the laws over several rounds: the mutant's TV from the exact
    law and the share of `runs` simulated checks that reject it at ALPHA; and the share of runs
    of the default profile (every explicit example once, independently) with a rejection."""
    rows, rejected_any = {}, np.zeros(runs, dtype=bool)
    for i, name in enumerate(LAW_TESTS):
        for j, case in enumerate(explicit(name)):
            law = exact(case)
            deviating = exact_law(mutant(), case.prompt, case.max_tokens, case.sampling)
            p = simulated_p_values(law, deviating, runs, seed + 100 * i + j)
            rejected = p < statistics.ALPHA
            rejected_any |= rejected
            rows[(name, j)] = (total_variation(law, deviating), float(rejected.mean()))
    return {"checks": rows, "runs": float(rejected_any.mean())}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda c: c.__name__)
def test_self_test_power_against_the_round_mutants(mutant, capsys):
    """In 1,000 simulated runs of the default profile the explicit examples of the laws over
    several rounds reject each round mutant in every run (the table: python -m pytest -s)."""
    power = self_test_power(mutant)
    with capsys.disabled():
        print(f"\n{mutant.__name__}: runs rejected {power['runs']:.3f} of {RUNS}")
        for (name, j), (tv, rate) in power["checks"].items():
            print(f"  {name}[{j}]: TV {tv:.3f}, rejected in {rate:.3f} of {RUNS} checks")
    assert power["runs"] == 1.0, power


@pytest.mark.extra   # minutes of CPU: make test-extra; cheaper tests of it stay
def test_the_greedy_rounds_examples_catch_the_history_mutant():
    """Each greedy example over several rounds: the history mutant's output differs from the
    exact greedy output (a deterministic check sees it in every run)."""
    for name in GREEDY_TESTS:
        for case in explicit(name):
            got = exact_law(RejectedKeptInHistory(), case.prompt, case.max_tokens, case.sampling)
            assert list(next(iter(got))) != oracle.served_greedy(
                case.prompt, case.max_tokens, params=case.sampling, formula=OPENAI), name
