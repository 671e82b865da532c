"""The served-engine kit against small in-process fake servers (tests/fakes/server.py):
each fault is reported as what it is, with a clear message, and a correct server passes."""

from __future__ import annotations

import socket

import pytest

from properties import engines, methods
from properties.harness import PropertyFailure
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.adapters.client import Client, HttpError, Request, ServedTimeout, Unreachable
from properties.adapters.served import make_impl
from properties.impl import ImplError, load
from reference.sampling import SamplingParams
from tests.fakes.server import FakeServer

GREEDY = ServedCase((3, 9, 27, 3, 9, 27), 8)
SAMPLED = ServedCase((1, 2), 2, sampling=SamplingParams(temperature=0.8, seed=1))


def served(fake, draft="unknown", **client):
    """The served Impl as a user's run gets it without --served-engine (a probing dialect)."""
    return make_impl("openai:" + fake.url, dialect=engines.unknown_dialect(),
                     method=methods.by_option(draft), **client)


def test_openai_prefix_loads_a_served_impl_and_rejects_a_bad_url():
    impl = load("openai:http://127.0.0.1:9/v1")
    assert impl.has("served") and not impl.has("engine") and "127.0.0.1:9" in impl.header()
    with pytest.raises(ImplError, match="ftp://x.*must look like http"):
        load("openai:ftp://x")


def test_correct_server_passes_every_check():
    with FakeServer() as fake:
        impl = served(fake)
        impl.baseline = Client(fake.url)
        checks.check_identity(impl.client, impl.logit_tolerance)
        assert impl.client.dialect.name == "openai"
        checks.check_greedy(impl, GREEDY)
        stop = checks.oracle.served_greedy(GREEDY.prompt, 8)[4]
        checks.check_bounds(impl, GREEDY.replace(stop_ids=(stop,)))
        checks.check_seed(impl, ServedCase((1, 2, 3), 12, SamplingParams(temperature=1.0, seed=3)))
        assert checks.check_sequence(impl, SAMPLED).passed
        assert checks.check_sequence_unseeded(impl, SAMPLED).passed
        assert impl.client.supports_n is True


def test_unreachable_server_is_a_clear_refusal():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again before the client tries it
    client = Client(f"http://127.0.0.1:{port}/v1", timeout=5)
    with pytest.raises(checks.Refusal, match=rf"127.0.0.1:{port}.*cannot connect.*running"):
        checks.check_identity(client, 1e-3)
    with pytest.raises(Unreachable):
        client.complete(Request((1,), 1))


def test_wrong_model_is_refused_before_any_property():
    with FakeServer("wrong_model") as fake:
        with pytest.raises(checks.Refusal, match="does not serve the kit's target.*export"):
            checks.check_identity(Client(fake.url), 1e-3)


def test_timeout_names_the_option_to_raise_it():
    with FakeServer("slow", delay=3.0) as fake:
        client = Client(fake.url, model="kit-target", timeout=0.5)
        with pytest.raises(ServedTimeout, match=r"within 0.5 s.*--served-timeout"):
            client.complete(Request((1,), 1))


def test_http_500_is_a_property_failure_quoting_the_status():
    with FakeServer("http_500") as fake:
        client = Client(fake.url, model="kit-target")
        with pytest.raises(HttpError, match="HTTP 500"):
            client.complete(Request((1,), 1))
        impl = served(fake, model="kit-target")
        with pytest.raises(PropertyFailure, match="(?s)served_greedy.*HTTP 500"):
            checks.check_greedy(impl, GREEDY)


def test_wrong_greedy_token_fails_with_position():
    with FakeServer("wrong_token") as fake:
        with pytest.raises(PropertyFailure, match="position 3: served token"):
            checks.check_greedy(served(fake), GREEDY)


def test_baseline_disagreement_fails():
    with FakeServer() as good, FakeServer("wrong_token") as bad:
        impl = served(good)
        impl.baseline = Client(bad.url)
        with pytest.raises(PropertyFailure, match="differs from the baseline server's"):
            checks.check_greedy(impl, GREEDY)


def test_output_past_a_stop_id_fails():
    stop = checks.oracle.served_greedy(GREEDY.prompt, 8)[2]
    with FakeServer("ignore_stop") as fake:
        with pytest.raises(PropertyFailure, match="goes on after stop id"):
            checks.check_bounds(served(fake), GREEDY.replace(stop_ids=(stop,)))


def test_ignored_seed_is_reported_as_such():
    case = ServedCase((1, 2, 3), 12, SamplingParams(temperature=1.0, seed=3))
    with FakeServer("ignore_seed") as fake:
        with pytest.raises(PropertyFailure, match="ignores `seed` \\(no baseline server.*"
                                                  "two requests with seed=3"):
            checks.check_seed(served(fake), case)
    # the failure's pattern names whether the engine without speculation replays the seed
    with FakeServer("ignore_seed") as fake, FakeServer() as good:
        impl = served(fake)
        impl.baseline = Client(good.url)
        with pytest.raises(PropertyFailure, match="ignores `seed` under speculation only "
                                                  "\\(the baseline server.* replays it"):
            checks.check_seed(impl, case)
        impl.baseline = Client(fake.url)
        with pytest.raises(PropertyFailure, match="with and without speculation"):
            checks.check_seed(impl, case)


def test_fixed_seed_is_reported_as_such_not_as_a_distribution_failure():
    with FakeServer("fixed_seed") as fake:
        with pytest.raises(PropertyFailure, match="ignores `seed` or the sampling settings") as info:
            case = ServedCase((1, 2), 2, SamplingParams(temperature=1.0, seed=4))
            checks.check_sequence(served(fake), case)
        assert "chi-square" not in str(info.value)


def test_wrong_sampling_law_fails_the_chi_square():
    with FakeServer("hot") as fake:
        with pytest.raises(PropertyFailure, match="not distributed as the target's sampling"):
            case = ServedCase((0, 1, 2), 1, SamplingParams(temperature=0.5, seed=5))
            checks.check_sequence(served(fake), case)
        with pytest.raises(PropertyFailure, match="not distributed as the target's sampling"):
            checks.check_sequence_unseeded(served(fake), case)


def test_text_only_server_is_spoken_to_in_the_transformers_dialect():
    with FakeServer("text_only") as fake:
        impl = served(fake)
        checks.check_identity(impl.client, 1e-3)
        assert impl.client.dialect.name == "transformers"
        checks.check_greedy(impl, GREEDY)
        # no `n` in this dialect: the kit sends single requests and still gets them all
        got = impl.client.complete(Request((1, 2), 2, SamplingParams(temperature=1.0, seed=1, n=3)))
        assert len(got) == 3


def test_perfect_draft_counters():
    with FakeServer() as fake:
        checks.check_perfect_draft(served(fake), GREEDY)
    with FakeServer("partial_accept") as fake:
        with pytest.raises(PropertyFailure, match="accepted at rate 1"):
            checks.check_perfect_draft(served(fake), GREEDY)
    assert checks.count_direction(8, [12]) == "fewer than"      # the last round left out
    assert checks.count_direction(16, [12, 14]) == "more than"
    assert checks.count_direction(13, [12, 14]) == "not"


def test_counter_failures_name_their_direction():
    # the fake serves the target's greedy output; with the perfect draft its counts are the
    # replay's, with partial_accept it reports 3 of 4 accepted: "as many drafted, fewer accepted"
    with FakeServer() as fake:
        checks.check_counters(served(fake, "perfect"), GREEDY)
    with FakeServer("partial_accept") as fake:
        impl = served(fake, "perfect")
        with pytest.raises(PropertyFailure,
                           match="as many drafted and fewer accepted than the exact replay"):
            checks.check_counters(impl, GREEDY)


def test_counts_pattern_words():
    from properties.acceptance import Expected
    one, two = Expected(7, 28, 3), Expected(8, 28, 4)
    assert checks.counts_pattern(27, 2, [one]) == "fewer drafted and fewer accepted than the exact replay"
    assert checks.counts_pattern(29, 3, [one]) == "more drafted and as many accepted than the exact replay"
    assert checks.counts_pattern(28, 3.5, [one, two]) == "as many drafted and other accepted than the exact replay"
    # not declared: the nearest replay (the fake above: 8 drafted, 6 accepted vs full 8/8)
    assert checks.counts_pattern(8, 6, [Expected(2, 8, 8), Expected(2, 5, 5)]).startswith("as many drafted and fewer")
