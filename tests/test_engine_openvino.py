"""OpenVINO GenAI's answers are read right: answers recorded from the real LLMPipeline behind
the kit's worker (tests/recorded/openvino/openvino.json, written by
tests/recorded/openvino/capture.py with the engine's version) are read back through the kit's
client and compared with the kit's float64 models and its exact replay of the drafts.

The readings the engine file declares: token ids in and out, a matched stop id kept at the end,
a matched stop string cut (stop_string_in_ids False), a seed replayed, draft counts per answer
(none for prompt lookup). The recorded defects are kept as they were seen: the counts leave out
the last round of a request (tests/findings/openvino_draft_counts), and prompt lookup fails
a stop string that begins at the first token (tests/findings/openvino_lookup_stop_string).
Batches (`capture.py --batches`): requests sent at once, answered by one
ContinuousBatchingPipeline call, each greedy row the target's, no row with counts of its own,
the worker's engine-wide totals moved by the call's. Also the staging step: the tokenizer
OpenVINO converts maps every id to itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties import acceptance, engines, oracle
from properties.adapters.client import Client, Request
from properties.models import tokenizer
from reference.sampling import SamplingParams

RECORDED = Path(__file__).with_name("recorded") / "openvino" / "openvino.json"
ENGINE = engines.get("openvino")
SPECULATING = ("draft-early-exit", "perfect-draft")
DRAFTS = {"draft-early-exit": "draft-early-exit", "perfect-draft": "target"}


def load():
    """method -> key -> (request, completions or the HTTP error recorded)."""
    record = json.loads(RECORDED.read_text())
    out = {}
    for name, exchanges in record["methods"].items():
        method = None if name == "baseline" else ENGINE.method(name)
        client = Client("http://127.0.0.1:9/v1", dialect=ENGINE.dialect_for(method),
                        model="kit-target")
        out[name] = {}
        for key, exchange in exchanges.items():
            fields = dict(exchange["request"])
            for tuple_field in ("prompt", "stop_ids", "stop_strings"):
                fields[tuple_field] = tuple(fields[tuple_field])
            req = Request(fields.pop("prompt"), fields.pop("max_tokens"), SamplingParams(**fields))
            assert client.body(req) == exchange["body"], (
                f"{name}: the client no longer words {key} as it was recorded: capture again")
            answer = exchange["answer"]
            out[name][key] = (req, answer if "http_error" in answer
                              else client.read_answer(answer, req))
    return record, out


RECORD, READ = load()


def test_recorded_version_is_the_validated_one():
    assert RECORD["version"] in ENGINE.validated
    assert set(READ) == {"baseline", "draft-early-exit", "perfect-draft", "prompt-lookup"}


@pytest.mark.parametrize("method", sorted(READ))
def test_greedy_answers_are_the_targets_greedy_tokens_stops_kept(method):
    for key in ("greedy", "greedy_random_prompt", "greedy_7", "greedy_6", "greedy_11",
                "greedy_stop", "greedy_two_stops", "greedy_stop_never_met"):
        req, (completion,) = READ[method][key]
        expected = oracle.served_greedy(req.prompt, req.max_tokens, req.sampling.stop_ids)
        assert list(completion.tokens) == expected, (method, key)
        stopped = len(expected) < req.max_tokens or expected[-1] in req.sampling.stop_ids
        assert completion.finish_reason == ("stop" if stopped else "length"), (method, key)


@pytest.mark.parametrize("method", sorted(READ))
def test_a_matched_stop_string_is_cut_from_the_tokens(method):
    assert ENGINE.dialect_for(None).stop_string_in_ids is False
    req, (completion,) = READ[method]["greedy_stop_string"]
    greedy = oracle.served_greedy(req.prompt, req.max_tokens)
    text = tokenizer.decode(greedy)
    (stop,) = req.sampling.stop_strings
    start = text.find(stop)
    assert start > 0 and list(completion.tokens) == greedy[:start]
    assert completion.finish_reason == "stop"


def test_prompt_lookup_fails_a_stop_string_met_at_the_first_token():
    """Recorded as seen: the baseline and the draft model cut the output to nothing, prompt
    lookup fails the request (the finding's signature)."""
    for method in ("baseline",) + SPECULATING:
        req, (completion,) = READ[method]["greedy_stop_string_at_start"]
        (stop,) = req.sampling.stop_strings
        assert tokenizer.decode(oracle.served_greedy(req.prompt, len(stop))) == stop
        assert completion.tokens == ()
    _, error = READ["prompt-lookup"]["greedy_stop_string_at_start"]
    assert error["http_error"] == 500
    assert "Cannot remove more tokens than has been generated" in error["message"]


@pytest.mark.parametrize("method", sorted(READ))
def test_a_seed_replays(method):
    _, (first,) = READ[method]["sampled_seeded"]
    _, (again,) = READ[method]["sampled_seeded_again"]
    assert first.tokens == again.tokens and len(first.tokens) == 6
    req, (top_p,) = READ[method]["sampled_top_p"]
    law = oracle.served_law(req.prompt, req.max_tokens, req.sampling.temperature,
                            top_p=req.sampling.top_p)
    assert law.get(tuple(top_p.tokens), 0.0) > 0, "an outcome outside the top-p support"


@pytest.mark.parametrize("method", SPECULATING)
def test_counts_are_read_from_each_answer(method):
    for key, exchange in RECORD["methods"][method].items():
        if "choices" not in exchange["answer"]:
            continue
        spec = exchange["answer"]["choices"][0]["speculation"]
        _, (completion,) = READ[method][key]
        assert (completion.drafted, completion.accepted) == (spec["drafted"], spec["accepted"])


def test_prompt_lookup_answers_carry_no_counts():
    dialect = ENGINE.dialect_for(ENGINE.method("prompt-lookup"))
    assert dialect.per_response is False and dialect.counters(None) is None
    for key, (_, answer) in READ["prompt-lookup"].items():
        if isinstance(answer, list):
            assert answer[0].drafted is None, key


@pytest.mark.parametrize("method", SPECULATING)
def test_counts_equal_the_replay_except_a_request_whose_last_round_ends_it(method):
    """The capped schedule (a round drafts at most the tokens still wanted after its bonus
    token): a request whose last step is the target's alone (greedy 12 with the perfect draft:
    steps 1, 5, 5, 1) is counted exactly; one whose last step verifies a draft is not (the
    defect of tests/findings/openvino_draft_counts: greedy 6 and 11 with the perfect
    draft, steps 1, 5 and 1, 5, 5)."""
    exact, short = [], []
    for key in ("greedy", "greedy_random_prompt", "greedy_7", "greedy_6", "greedy_11"):
        req, (completion,) = READ[method][key]
        replay = acceptance.greedy(req.prompt, req.max_tokens, DRAFTS[method], 4, "capped")
        got = (completion.drafted, completion.accepted)
        (exact if got == (replay.drafted, replay.accepted) else short).append(key)
        assert completion.drafted <= replay.drafted and completion.accepted <= replay.accepted
    if method == "perfect-draft":
        assert set(exact) == {"greedy", "greedy_random_prompt", "greedy_7"}
        assert set(short) == {"greedy_6", "greedy_11"}


def test_the_staged_tokenizer_maps_every_id_to_itself(tmp_path):
    """The kit's tokenizer with one added special token at id 32 (what OpenVINO converts):
    the 32 characters still encode to their ids, one by one and in a text, and the export
    the other engines load is untouched."""
    from tokenizers import Tokenizer
    from properties.engines import openvino
    from properties.export import kit as export
    source = export.export_model("draft-random", tmp_path / "export")
    before = (source / "tokenizer.json").read_text()
    openvino.stage(source, tmp_path / "staged")
    staged = Tokenizer.from_file(str(tmp_path / "staged" / "tokenizer.json"))
    assert staged.token_to_id("<|endoftext|>") == len(tokenizer.ALPHABET)
    text = tokenizer.ALPHABET + tokenizer.ALPHABET[::-1] + "aaBB"
    assert staged.encode(text).ids == tokenizer.encode(text)
    assert (source / "tokenizer.json").read_text() == before
    assert (tmp_path / "staged" / "model.safetensors").resolve() == \
        (source / "model.safetensors").resolve()


def test_a_tokenizer_with_an_added_token_is_staged_as_it_is(tmp_path):
    from tokenizers import AddedToken
    from properties.engines import openvino
    raw = tokenizer.build()
    raw.add_special_tokens([AddedToken("<|x|>", special=True)])
    (tmp_path / "src").mkdir()
    raw.save(str(tmp_path / "src" / "tokenizer.json"))
    openvino.stage(tmp_path / "src", tmp_path / "staged")
    assert json.loads((tmp_path / "staged" / "tokenizer.json").read_text()) == \
        json.loads((tmp_path / "src" / "tokenizer.json").read_text())


def test_counts_are_the_worker_totals_around_requests_and_a_batch_is_one_call():
    """Requests in flight together are one ContinuousBatchingPipeline call, whose
    extended_perf_metrics are the call's: the dialect reads the counts as the worker's
    engine-wide totals (its /metrics) around a check's requests, as a server's counters, with no
    rounds (the engine counts none); the session batches as many rows as the kit keeps in
    flight."""
    from properties.engines import inprocess, openvino
    dialect = ENGINE.dialect_for(ENGINE.method("draft-early-exit"))
    assert dialect.per_response is False

    class Totals:   # a session's engine-wide counts, as the worker serves them
        def counters(self):
            return {"drafted": 68, "accepted": 18}

    class Page:     # the worker's /metrics page, as the kit's client reads it
        def get_root_text(self, path):
            assert path == "/metrics"
            return inprocess.Worker(Totals()).metrics()

    counted = dialect.counters(Page())
    assert (counted.drafted, counted.accepted, counted.rounds) == (68, 18, None)
    session = inprocess.load_class(openvino.__file__, "Session")
    assert ENGINE.concurrency == session.BATCH == 8
    assert hasattr(session, "generate_batch") and hasattr(session, "counters")


def read_batch(name):
    """(requests, completions, counters before, counters after) of a recorded batch."""
    from properties.adapters.dialects import prometheus_counters
    from properties.engines import inprocess
    batch = RECORD["batches"][name]
    method = None if name == "baseline" else ENGINE.method(name)
    client = Client("http://127.0.0.1:9/v1", dialect=ENGINE.dialect_for(method),
                    model="kit-target")
    requests, completions = [], []
    for fields, body, answer in zip(batch["requests"], batch["bodies"], batch["answers"]):
        fields = dict(fields)
        for tuple_field in ("prompt", "stop_ids", "stop_strings"):
            fields[tuple_field] = tuple(fields[tuple_field])
        req = Request(fields.pop("prompt"), fields.pop("max_tokens"), SamplingParams(**fields))
        assert client.body(req) == body, f"{name}: the client words the batch otherwise now"
        requests.append(req)
        (completion,) = client.read_answer(answer, req)
        completions.append(completion)
    counts = [prometheus_counters(batch[k], (inprocess.DRAFTED,), (inprocess.ACCEPTED,))
              for k in ("metrics_before", "metrics_after")]
    return requests, completions, counts[0], counts[1]


@pytest.mark.parametrize("name", ["baseline", "draft-early-exit-no-prefix-caching"])
def test_a_batch_sent_at_once_is_answered_row_by_row_with_the_calls_counts(name):
    """Requests sent at once (answered by one ContinuousBatchingPipeline call): each greedy
    row is the target's greedy output within its length and stop ids; no row carries counts
    of its own (a call's extended_perf_metrics are the call's), and the worker's engine-wide
    totals moved by the call's counts: some drafted with a draft, none without."""
    requests, completions, before, after = read_batch(name)
    assert len(requests) >= 4 and any(not r.sampling.greedy for r in requests)
    for req, completion in zip(requests, completions):
        if req.sampling.greedy:
            assert list(completion.tokens) == oracle.served_greedy(
                req.prompt, req.max_tokens, req.sampling.stop_ids), (name, req)
        assert completion.drafted is None, "a batched row carries no counts of its own"
    drafted, accepted = after.drafted - before.drafted, after.accepted - before.accepted
    if name == "baseline":
        assert (drafted, accepted) == (0, 0)
        sampled = [(r, c) for r, c in zip(requests, completions) if not r.sampling.greedy]
        for req, completion in sampled:   # its first two tokens inside their law's support
            law = oracle.served_law(req.prompt, 2, req.sampling.temperature)
            assert law.get(tuple(completion.tokens[:2]), 0.0) > 0
    else:
        assert 0 < drafted and 0 <= accepted <= drafted
