"""Each engine's dialect is read right: responses recorded from the real servers
(tests/recorded/ENGINE.json, written by tests/recorded/capture.py with the engine's version)
are read back through the kit's client and compared with the kit's float64 models.

A dialect difference must never look like a losslessness failure: a stop token kept in
`token_ids` but cut from `text`, a stop word cut from llama.cpp's content, the engine's
draft statistics, `n`, `seed`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties import acceptance, engines
from properties import oracle
from properties.checks import served as checks
from properties.cases import ServedCase
from properties.adapters.client import Client, Request
from reference.sampling import SamplingParams

RECORDED = Path(__file__).with_name("recorded")
ENGINES = sorted(p.stem for p in RECORDED.glob("*.json"))


def load(name):
    record = json.loads((RECORDED / f"{name}.json").read_text())
    engine = engines.get(name)
    client = Client("http://127.0.0.1:9/v1", dialect=engine.dialect, model="kit-target")
    out = {}
    for key, exchange in record["exchanges"].items():
        fields = dict(exchange["request"])
        for tuple_field in ("prompt", "stop_ids"):
            fields[tuple_field] = tuple(fields[tuple_field])
        req = Request(fields.pop("prompt"), fields.pop("max_tokens"), SamplingParams(**fields))
        assert client.body(req) == exchange["body"], (
            f"{name}: the client no longer words {key} as it was recorded: capture again")
        out[key] = (req, client.read_answer(exchange["answer"], req))
    return record, engine, out


def test_recordings_exist_for_the_engines_ci_runs():
    assert {"vllm", "llamacpp"} <= set(ENGINES), (
        "record them: python tests/recorded/capture.py vllm (and llamacpp)")


@pytest.mark.parametrize("name", ENGINES)
def test_recorded_version_is_the_validated_one(name):
    record = json.loads((RECORDED / f"{name}.json").read_text())
    assert record["version"] in engines.get(name).validated


@pytest.mark.parametrize("name", ENGINES)
def test_greedy_answers_read_as_the_targets_greedy_tokens(name):
    _, _, read = load(name)
    for key in ("greedy", "greedy_random_prompt"):
        req, (completion,) = read[key]
        assert list(completion.tokens) == oracle.served_greedy(req.prompt, req.max_tokens)
        assert completion.finish_reason == "length"


@pytest.mark.parametrize("name", ENGINES)
def test_a_matched_stop_ends_the_tokens_whatever_the_text_says(name):
    record, engine, read = load(name)
    for key in ("greedy_stop", "greedy_two_stops", "greedy_stop_never_met"):
        req, (completion,) = read[key]
        expected = oracle.served_greedy(req.prompt, req.max_tokens, req.sampling.stop_ids)
        assert list(completion.tokens) == expected, key
        case = ServedCase(req.prompt, req.max_tokens,
                          sampling=SamplingParams(stop_ids=req.sampling.stop_ids))
        assert checks.bounds_violation(case, completion) is None, key
    # the recorded habit is the declared one: the text leaves the stop token out, or, where
    # the answer is token ids alone, the ids keep it
    answer = engine.dialect.choices(record["exchanges"]["greedy_stop"]["answer"], name)[0]
    if "content" not in answer and "text" not in answer:
        req, (completion,) = read["greedy_stop"]
        assert engine.dialect.stop_in_ids is True
        assert completion.tokens[-1] in req.sampling.stop_ids
        return
    text = answer["content"] if "content" in answer else answer["text"]
    req, (completion,) = read["greedy_stop"]
    assert engine.dialect.stop_in_text is False
    assert len(text) == len(completion.tokens) - 1


@pytest.mark.parametrize("name", ENGINES)
def test_sampled_answers_are_read_whole(name):
    # whether they follow the law, lie in the support, or replay with their seed is what the
    # kit's families judge; here only that each is read as max_tokens ids, n of them
    _, engine, read = load(name)
    req, answers = read["sampled_n4"]
    assert len(answers) == (4 if engine.dialect.honours_n else 1)
    for key in ("sampled_seeded", "sampled_n4", "sampled_top_p"):
        req, answers = read[key]
        for completion in answers:
            assert len(completion.tokens) == req.max_tokens, key
            assert all(0 <= t < 32 for t in completion.tokens), key
            assert completion.finish_reason == "length", key


@pytest.mark.parametrize("name", ENGINES)
def test_engine_counters_are_read_and_equal_the_exact_replay(name):
    record, engine, read = load(name)
    req, (completion,) = read["greedy"]
    expected = acceptance.greedy(req.prompt, req.max_tokens, "draft-early-exit", 4,
                                 engine.schedule)
    if engine.dialect.per_response:
        assert (completion.drafted, completion.accepted) == (expected.drafted, expected.accepted)
    else:
        # the engine's own counters method, reading the recorded pages
        before, after = (engine.dialect.counters(Page(text))
                         for text in record["metrics_before_after_greedy"])
        drafted = after.drafted - before.drafted
        accepted = after.accepted - before.accepted
        assert (drafted, accepted) == (expected.drafted, expected.accepted)


class Page:
    """A server whose every page is the recorded text (for a dialect's `counters`)."""

    url = "recorded"

    def __init__(self, text):
        self.text = text

    def get_root_text(self, path):
        return self.text


class Replay:
    """A client whose posts are answered from a recording, in order (a dialect that continues
    a completion asks again; the recording holds each exchange it made)."""

    def __init__(self, exchanges, model="kit-target"):
        self.exchanges, self.model, self.sent = list(exchanges), model, []

    def post(self, body):
        expected, answer = self.exchanges.pop(0)
        assert body == expected, "the dialect no longer words the continuation as recorded"
        self.sent.append(body)
        return answer

    def where(self):
        return "POST http://127.0.0.1:9/completion"


def _end_of_sequence_exchanges():
    record = json.loads((RECORDED / "llamacpp.json").read_text())
    exchange = record["exchanges"]["greedy_end_of_sequence"]
    later = exchange.get("continued", [])
    return exchange, [(exchange["body"], exchange["answer"])] + [(c["body"], c["answer"])
                                                                 for c in later]


def test_llamacpp_continues_after_its_end_of_sequence_as_the_target_would():
    # recorded: llama-server stopped at id 11 (stop_type "eos") inside a drafted block, and
    # the kit continued from the prefix: together the target's greedy output, 12 tokens
    from properties.engines import llamacpp
    exchange, exchanges = _end_of_sequence_exchanges()
    assert exchange["answer"]["stop_type"] == "eos" and len(exchanges) == 2
    req = Request(tuple(exchange["request"]["prompt"]), exchange["request"]["max_tokens"])
    (completion,) = llamacpp.DIALECT.complete(Replay(exchanges), req)
    assert list(completion.tokens) == oracle.served_greedy(req.prompt, req.max_tokens)
    first = exchange["answer"]["tokens"]
    assert first[-1] == llamacpp.EOS_ID and completion.pieces == (len(first), 12 - len(first))
    assert completion.finish_reason == "length"


@pytest.mark.parametrize("edit, says", [
    # the engine emitted the rest of an accepted block after its end of sequence
    (lambda a: a | {"tokens": a["tokens"] + [24, 10], "stop_type": "limit"},
     "went on past its end-of-sequence id 11 at position 6: \\[24, 10\\]"),
    # it says it stopped at end of sequence but its last token is another
    (lambda a: a | {"tokens": a["tokens"][:-1]}, "stopped at end of sequence .* not the end-of"),
])
def test_llamacpp_end_of_sequence_defects_are_reported(edit, says):
    from properties.adapters.protocol import BadResponse
    from properties.engines import llamacpp
    exchange, exchanges = _end_of_sequence_exchanges()
    exchanges[0] = (exchanges[0][0], edit(dict(exchanges[0][1])))
    req = Request(tuple(exchange["request"]["prompt"]), exchange["request"]["max_tokens"])
    with pytest.raises(BadResponse, match=says):
        llamacpp.DIALECT.complete(Replay(exchanges), req)
