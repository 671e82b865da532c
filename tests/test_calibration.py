"""The calibration run's own parts (tests/calibration): the summary's mathematics against
scipy and hand counts, the deviating implementations' total variation computed exactly, and
the collector on a small statistical test of its own (seconds in all)."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from properties import oracle, profiles, statistics
from properties.cases import PairSpec
from properties.checks.rule import rule_law
from properties.impl import load
from properties.models import TableSpec, build_pair
from tests.calibration import collect, deviate, summary
from tests.calibration import stats as cs

# --------------------------------------------------------------------------- the mathematics


@pytest.mark.parametrize("k,n", [(0, 10), (1, 10), (5, 10), (10, 10), (3, 200), (0, 1), (47, 1000)])
def test_clopper_pearson_matches_scipy(k, n):
    want = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    low, high = cs.clopper_pearson(k, n)
    assert low == pytest.approx(want.low, abs=1e-12) and high == pytest.approx(want.high, abs=1e-12)


def test_clopper_pearson_rejects_bad_counts():
    with pytest.raises(ValueError, match="k=5, n=3"):
        cs.clopper_pearson(5, 3)


def test_uniformity_accepts_uniform_and_rejects_bent_p_values():
    rng = np.random.default_rng(7)
    uniform = rng.uniform(size=3000)
    assert cs.uniformity(uniform)["consistent"]
    # a liberal check (p-values piled towards 0) and a conservative one (towards 1)
    assert not cs.uniformity(uniform ** 1.5)["consistent"]
    assert not cs.uniformity(uniform ** (1 / 1.5))["consistent"]
    with pytest.raises(ValueError, match="p-values must lie in"):
        cs.uniformity([0.5, 1.5])


def test_rate_and_tail_extrapolation_by_hand():
    p = np.arange(1, 1001) / 1000.0            # 1/1000 .. 1: 49 values below 0.05, 9 below 0.01
    r = cs.rate(p, 0.05)
    assert (r["k"], r["n"]) == (49, 1000) and r["ratio"] == pytest.approx(0.98)
    at = cs.extrapolated(p, 2e-6, tail=0.01)
    assert at["estimate"] == pytest.approx(2e-6 * 0.9)
    low, high = cs.clopper_pearson(9, 1000)
    assert (at["low"], at["high"]) == (pytest.approx(2e-6 * low / 0.01),
                                       pytest.approx(2e-6 * high / 0.01))


def test_qq_envelope_holds_the_expected_order_statistics():
    expected, low, high = cs.qq_envelope(99)
    assert expected[49] == pytest.approx(0.5)
    assert np.all(low < expected) and np.all(expected < high)


def test_half_power_interpolates():
    assert cs.half_power([0.02, 0.04, 0.06], [0.1, 0.3, 0.9]) == pytest.approx(0.04 + 0.2 / 0.6 * 0.02)
    assert cs.half_power([0.02, 0.04], [0.6, 0.9]) is None


def test_union_bound_and_its_binomial_test():
    assert cs.expected_run_bound(27, 2e-6) == pytest.approx(5.4e-5)
    assert cs.binomial_consistent(0, 100, 5.4e-5)
    assert not cs.binomial_consistent(3, 100, 5.4e-5)


# --------------------------------------------------------------------------- deviations

@pytest.mark.parametrize("probs", [[0.5, 0.5], [0.7, 0.2, 0.1], [0.4, 0.3, 0.2, 0.05, 0.05],
                                   list(np.random.default_rng(3).dirichlet(np.ones(40)))])
@pytest.mark.parametrize("delta", [0.01, 0.05, 0.1])
def test_weights_move_the_law_by_exactly_delta(probs, delta):
    p = np.asarray(probs)
    q = p * deviate.weights(p, delta)
    assert q.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(q >= 0)
    assert deviate.total_variation(p, q) == pytest.approx(delta, abs=1e-12)
    # the power calculation's bound chi2(Q || P) >= 4 TV^2 holds, near equality when balanced
    assert ((q - p) ** 2 / p).sum() >= 4 * delta ** 2 - 1e-12


def test_weights_of_a_concentrated_law_take_the_mass_from_its_largest_outcome():
    p = np.array([0.95, 0.03, 0.02])       # no split has a lighter part of mass >= 0.12
    q = p * deviate.weights(p, 0.12)
    assert deviate.total_variation(p, q) == pytest.approx(0.12, abs=1e-12)
    assert q[0] == pytest.approx(0.83) and q.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="delta=0.2: no deviation"):
        deviate.weights([1.0], 0.2)


@pytest.mark.parametrize("pair", [PairSpec(6, seed=1, p_kind="dirichlet", q_kind="peaked"),
                                  PairSpec(2000, seed=2, p_kind="flat", q_kind="sparse")])
def test_deviated_rule_moves_the_observed_law_by_delta(pair):
    """The committed token's law over the labels the rule check observes (bins for 2000
    tokens) is at exactly the design TV from p's."""
    p, q = pair.build()
    label, _, marginal, *_ = rule_law(p.numpy(), q.numpy())
    moved = deviate.deviated_p(p, q, statistics.DELTA_RULE).numpy()
    law = Counter()
    for y in np.flatnonzero(moved > 0):
        law[label[y]] += moved[y]
    keys = list(marginal)
    assert deviate.total_variation([marginal[k] for k in keys], [law[k] for k in keys]) \
        == pytest.approx(statistics.DELTA_RULE, abs=1e-9)


class _Target:
    """A target whose next-token logits depend on the context's length only."""

    LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]],
                                    dtype=torch.float64))

    def next_logits(self, prefix):
        return self.LOGITS[len(prefix) % 3]


def _ancestral(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0, stop_ids=(),
               generator=None):
    """A correct sampler of the target's law, in the engine API's shape."""
    from reference.sampling import probs_from_logits
    out = []
    for _ in range(max_new_tokens):
        p = probs_from_logits(target.next_logits(list(prompt_ids) + out), temperature)
        out.append(int(torch.multinomial(p, 1, generator=generator)))
    return out, {}


def test_deviating_generate_samples_the_reweighted_law():
    """The rejection sampler's output law is P w: a chi-square check of 4,000 outputs against
    P w passes, and against P fails (TV 0.12 at 4,000 outputs: detected with power ~1)."""
    generate = deviate.deviating_generate(_ancestral, statistics.DELTA_SEQUENCE)
    law = oracle.law_from(lambda seqs: torch.stack([_Target().next_logits(list(s)) for s in seqs]),
                          (1,), 2, 1.0)
    w = deviate.weights(list(law.values()), statistics.DELTA_SEQUENCE)
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    assert deviate.total_variation(list(law.values()), list(moved.values())) \
        == pytest.approx(statistics.DELTA_SEQUENCE)
    g = torch.Generator().manual_seed(5)
    out = Counter(tuple(generate(_Target(), None, [1], 2, k=2, temperature=1.0, generator=g)[0])
                  for _ in range(4000))
    assert statistics.chi_square_gof(out, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(out, law, alpha=1e-4).passed
    # outputs too long to enumerate (the determinism probe's) pass through unchanged
    long = deviate.MAX_LAW_LENGTH + 1
    assert generate(_Target(), None, [1], long, temperature=1.0,
                    generator=torch.Generator().manual_seed(9))[0] == _ancestral(
        _Target(), None, [1], long, temperature=1.0, generator=torch.Generator().manual_seed(9))[0]


class _PeakedTarget(_Target):
    """One outcome holds 1 - 1.5e-5 of the two-token law: the case plain rejection stalled on."""
    LOGITS = torch.log(torch.tensor([[1 - 2e-5, 1e-5, 1e-5], [1 - 2e-5, 1e-5, 1e-5],
                                     [1 - 2e-5, 1e-5, 1e-5]], dtype=torch.float64))


def test_deviating_generate_on_a_near_deterministic_law_is_exact_and_bounded():
    """Where one outcome dominates, every other outcome's weight is huge (max w ~ 8,000 here):
    the deviating engine still returns the law P w (chi-square on 4,000 outputs; against P it
    fails at once) with at most 1 + RESIDUAL_TRIES engine runs per output."""
    calls = []

    @functools.wraps(_ancestral)     # the signature the deviating engine binds arguments by
    def counted(*args, **kwargs):
        calls.append(1)
        return _ancestral(*args, **kwargs)

    generate = deviate.deviating_generate(counted, statistics.DELTA_SEQUENCE)
    law = oracle.law_from(lambda seqs: torch.stack([_PeakedTarget().next_logits(list(s))
                                                    for s in seqs]), (1,), 2, 1.0)
    w = deviate.weights(list(law.values()), statistics.DELTA_SEQUENCE)
    assert w.max() > 1000
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    g, out, most = torch.Generator().manual_seed(2), Counter(), 0
    for _ in range(4000):
        calls.clear()
        out[tuple(generate(_PeakedTarget(), None, [1], 2, temperature=1.0, generator=g)[0])] += 1
        most = max(most, len(calls))
    assert most <= 1 + deviate.RESIDUAL_TRIES
    assert statistics.chi_square_gof(out, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(out, law, alpha=1e-4).passed


def _batched_ancestral(target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                       stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """A correct batched sampler in the batched API's shape: rows independent."""
    limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    return [_ancestral(target, draft, p, n, temperature=temperature, generator=generator)[0]
            for p, n in zip(prompts, limits)], {"calls": 1}


def test_deviating_batched_rows_sample_the_reweighted_law_independently():
    """Each row of the deviating batched_generate has the law P w (chi-square on 3,000 rows,
    against P it fails), and the rows of one call stay independent: pairs of rows of one call
    against the product of P w with itself."""
    generate = deviate.deviating_batched(_batched_ancestral, statistics.DELTA_BATCHED)
    law = oracle.law_from(lambda seqs: torch.stack([_Target().next_logits(list(s)) for s in seqs]),
                          (1,), 2, 1.0)
    w = deviate.weights(list(law.values()), statistics.DELTA_BATCHED)
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    g = torch.Generator().manual_seed(3)
    rows, pairs = Counter(), Counter()
    for _ in range(1500):
        outs, stats = generate(_Target(), None, [[1], [1]], 2, temperature=1.0, generator=g)
        assert stats == {"calls": 1}
        outs = [tuple(o) for o in outs]
        rows.update(outs)
        pairs[tuple(outs)] += 1
    assert statistics.chi_square_gof(rows, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(rows, law, alpha=1e-4).passed
    product = {(a, b): pa * pb for a, pa in moved.items() for b, pb in moved.items()}
    assert statistics.chi_square_gof(pairs, product, alpha=1e-4).passed
    # greedy calls pass through unchanged: one call of the base with the same arguments
    calls = []
    passthrough = deviate.deviating_batched(
        lambda target, draft, prompts, max_new_tokens, k=4, temperature=0.0, stop_ids=(),
        generator=None, *, top_k=0, top_p=1.0: calls.append((prompts, max_new_tokens)) or "as is",
        statistics.DELTA_BATCHED)
    assert passthrough(_Target(), None, [[1]], 3) == "as is" and calls == [([[1]], 3)]


@pytest.mark.extra   # 2,000 requests' worth of float64 forwards: make test-extra
def test_deviating_server_samples_the_reweighted_law_and_keeps_seeds():
    """The deviating fake server's completions have the law P w of the served target's exact
    law P (chi-square on 2,000 completions; against P it fails), and a seed still fixes the
    answer."""
    prompt, L, temperature = (3, 4), 2, 1.0
    law = oracle.served_law(prompt, L, temperature, 5, 1.0)
    w = deviate.weights(list(law.values()), 0.15)
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    server = deviate.DeviatingServer(0.15)
    out = Counter(tuple(server._generate(list(prompt), L, temperature, 5, 1.0, set(),
                                         np.random.default_rng([s, 0]))) for s in range(2000))
    assert statistics.chi_square_gof(out, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(out, law, alpha=1e-4).passed
    again = [server._generate(list(prompt), L, temperature, 5, 1.0, set(),
                              np.random.default_rng([s, 0])) for s in range(5)]
    assert again == [server._generate(list(prompt), L, temperature, 5, 1.0, set(),
                                      np.random.default_rng([s, 0])) for s in range(5)]
    with pytest.raises(ValueError, match="delta"):
        deviate.DeviatingServer(0.0)


@pytest.mark.extra   # 2,000 requests' worth of float64 forwards: make test-extra
def test_deviating_server_moves_the_law_under_penalties_too():
    """The same under a repetition penalty and a logit bias (the served_params family's laws,
    several rounds long): the completions have the law P w of the exact law under the fake's
    OpenAI formula, whatever each request's seed."""
    from reference.penalties import OPENAI
    from reference.sampling import SamplingParams
    prompt, L = (0, 1, 2, 0, 1, 2, 0, 1), 4
    params = SamplingParams(temperature=0.7, top_k=2, repetition_penalty=1.6,
                            logit_bias=((1, 1.0),))
    law = oracle.served_law(prompt, L, 0.7, 2, 1.0, params=params, formula=OPENAI)
    w = deviate.weights(list(law.values()), 0.15)
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    server = deviate.DeviatingServer(0.15)
    out = Counter()
    for s in range(2000):
        tokens, cut = server._generate_shaped(list(prompt), L, params, set(),
                                              np.random.default_rng([s, 0]))
        out[tuple(tokens)] += 1
        assert cut is None
    assert statistics.chi_square_gof(out, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(out, law, alpha=1e-4).passed
    greedy = SamplingParams(repetition_penalty=1.6)
    assert server._generate_shaped(list(prompt), 8, greedy, set(), None)[0] == \
        oracle.served_greedy(prompt, 8, params=greedy, formula=OPENAI)


@pytest.mark.extra
def test_deviating_reference_engine_samples_the_reweighted_law():
    """The same on the reference engine and a kit table model (about 15 s)."""
    from properties.models import DraftSpec
    impl = deviate.deviating(load("reference"), "sequence", statistics.DELTA_SEQUENCE)
    spec, L = TableSpec(2, seed=3, scale=1.0), 2
    law = oracle.sequence_law(spec, (1, 0), L, 1.0)
    w = deviate.weights(list(law.values()), statistics.DELTA_SEQUENCE)
    moved = {o: pr * wi for (o, pr), wi in zip(law.items(), w)}
    g = torch.Generator().manual_seed(5)
    out = Counter()
    for _ in range(800):
        target, draft = build_pair(spec, DraftSpec("random", 1))
        tokens, _ = impl.functions["speculative_generate"](target, draft, [1, 0], L, k=2,
                                                           temperature=1.0, generator=g)
        out[tuple(tokens)] += 1
    assert statistics.chi_square_gof(out, moved, alpha=1e-4).passed
    assert not statistics.chi_square_gof(out, law, alpha=1e-4).passed


# --------------------------------------------------------------------------- the collector

# the kit's own statistical test the collector is tried on (one explicit example, two generated
# in the calibration profile; seconds on the reference)
TEST = "test_top_p_table"


def test_recorder_is_off_in_a_kit_run():
    assert statistics.recorder is None


def test_collector_runs_the_kit_and_records_every_check_with_fresh_seeds():
    """A calibration run is the kit's own run of the family (its plugin, its profile's counts),
    every check recorded per example; distinct run seeds draw distinct samples for every
    example, the explicit ones included; the same seed, the same run."""
    from properties import test_sequence
    fn = getattr(test_sequence, TEST)
    impl = load("reference")
    a = collect.run_once("sequence", impl, 11, tests=[TEST])
    b = collect.run_once("sequence", impl, 12, tests=[TEST])
    explicit = len(fn.hypothesis.inner_test.hypothesis_explicit_examples)
    generated = profiles.generated_examples(fn.kit_examples_scale, collect.PROFILE)
    checks = fn.kit_checks_per_example
    assert statistics.recorder is None
    labels = [f"explicit {i}" for i in range(explicit)] + [f"generated {i}"
                                                           for i in range(generated)]
    for run in (a, b):
        assert not run["failed"] and not run["skipped"]
        assert len(run["records"]) == checks * len(labels)
        assert [r["check"] for r in run["records"]] == list(range(checks)) * len(labels)
        assert [r["example"] for r in run["records"][::checks]] == labels
        assert {r["kit_test"] for r in run["records"]} == {TEST}
        # the check's own statistical test is kept beside the kit's test name (the summary
        # tells support-only checks from p-values by it)
        assert all(r["test"] not in (None, TEST) for r in run["records"])
    # the explicit examples and Hypothesis's first generated one (its simplest, the same case in
    # every run) are reseeded: their samples, so their p-values, differ between the runs
    assert all(x["p"] != y["p"] for x, y in zip(a["records"], b["records"]))
    again = collect.run_once("sequence", impl, 11, tests=[TEST])
    assert [r["p"] for r in again["records"]] == [r["p"] for r in a["records"]]
    # the kit's test is as written once the run is over (the salt is undone)
    assert not hasattr(fn.hypothesis.inner_test, "kit_unsalted")


def test_a_failing_example_ends_the_run_not_conformant_and_the_others_still_count():
    """On an engine whose target ignores top_p the run is NOT CONFORMANT, and every example is
    still run and recorded (the per-check power counts them all)."""
    impl = load("tests.mutants.catalogue:TargetWithoutTopP")
    run = collect.run_once("sequence", impl, 3, tests=[TEST])
    assert run["failed"] and any(not r["passed"] for r in run["records"])
    assert "PropertyFailure" in run["failures"][0]["error"]
    from properties import test_sequence
    fn = getattr(test_sequence, TEST)
    examples = (len(fn.hypothesis.inner_test.hypothesis_explicit_examples)
                + profiles.generated_examples(fn.kit_examples_scale, collect.PROFILE))
    assert len({r["example"] for r in run["records"]}) == examples


def test_the_kits_applicability_rule_decides_what_runs():
    """A test the implementation cannot run is skipped by the kit's own rule, with its reason
    (the sampler family needs an engine's own sampler: the reference has none)."""
    run = collect.run_once("sampler", load("reference"), 5)
    assert not run["records"] and not run["failed"] and run["skipped"]
    assert all("not applicable" in why or "target_generate" in why
               for why in run["skipped"].values()), run["skipped"]


def test_summary_writes_the_table_and_picture(tmp_path):
    rng = np.random.default_rng(1)
    import json
    with open(tmp_path / "runs.jsonl", "w") as f:
        for i in range(30):
            records = [{"p": float(p), "passed": True, "check": 0} for p in rng.uniform(size=5)]
            f.write(json.dumps({"family": "rule", "impl": "reference", "delta": 0.0, "seed": i,
                                "seconds": 1.0, "failed": False, "failures": [],
                                "records": records}) + "\n")
        for delta, rejected in ((0.02, 3), (0.05, 10)):
            for i in range(10):
                records = [{"p": 0.0 if i < rejected else 0.5, "passed": i >= rejected, "check": 0}]
                f.write(json.dumps({"family": "rule", "impl": "reference", "delta": delta,
                                    "seed": i, "seconds": 1.0, "failed": i < rejected,
                                    "failures": [], "records": records}) + "\n")
    table = summary.write(tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["null"]["rule"]["checks"] == 150 and data["null"]["rule"]["failed_runs"] == 0
    assert data["power"]["rule"]["by_delta"][1]["rejected"] == 10
    assert data["power"]["rule"]["half_power_run"] == pytest.approx(0.02 + 0.2 / 0.7 * 0.03)
    assert "| rule (reference) | 30 | 150 |" in table
    assert (tmp_path / "calibration-qq.svg").read_text().startswith("<?xml")


def test_report_page_links_to_the_calibration_section():
    """The kit's report page links to CONFORMANCE.md's calibration section: the file exists
    and holds a heading whose anchor (GitHub's rule: lower case, punctuation dropped, spaces
    to hyphens) is the link's."""
    import re
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    from properties.report import page
    from tests.test_kit_report import _summary
    data = {"header": {"impl": "reference", "description": "-", "versions": {}, "profile": "dev",
                       "seed": "-", "date": "-", "seconds": 1.0, "verdict": "CONFORMANT",
                       "verdict_line": "verdict: CONFORMANT", "command": "-"},
            "summary": _summary({}), "tests": {}}
    link = re.search(r'<p class="muted" id="calibration">.*?href="([^"]+)"', page.render(data))
    url = urlparse(link.group(1))
    text = Path(unquote(url.path)).read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, re.M)}
    assert url.fragment in anchors
