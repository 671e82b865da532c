"""The onnxruntime-genai engine file's own logic, without the engine: its session's pieces past
the end-of-sequence id and its stop ids (the engine's calls scripted), the conversion's refusal
of a head size its attention cannot run, the speculative folder it writes, and the reading of
a completion recorded from the real engine that went through its end of sequence
(tests/recorded/onnxruntime-genai.json, tests/recorded/capture.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties import acceptance, engines, oracle
from properties.adapters.client import Client, Request
from properties.cases import ServedCase
from properties.checks import served as checks
from properties.engines import onnxruntime_genai as ort
from reference.sampling import SamplingParams

RECORDED = Path(__file__).with_name("recorded") / "onnxruntime-genai.json"
EOS = 31


class Scripted(ort.Session):
    """The session with the engine's calls replaced by a script: each call returns the next
    piece (as the engine would: stopping at the end-of-sequence id) and records its seed."""

    def __init__(self, pieces):
        self.vocab, self.eos, self.k, self.ngram = 32, EOS, 4, None
        self.script, self.calls = list(pieces), []

    def piece(self, prefix, wanted, params, seed):
        self.calls.append((list(prefix), wanted, seed))
        tokens = self.script.pop(0)[:wanted]
        return tokens, {"drafted": 4, "accepted": 2, "rounds": 1}


def params(max_tokens, stops=(), seed=None):
    return {"max_tokens": max_tokens, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
            "seed": seed, "stop_token_ids": list(stops)}


def test_a_completion_that_meets_the_end_of_sequence_is_continued_from_its_prefix():
    session = Scripted([[5, EOS], [7, 8, EOS], [9, 9, 9]])
    out, finish, stats = session.generate([1, 2], params(7, seed=11))
    assert out == [5, EOS, 7, 8, EOS, 9, 9] and finish == "length"
    assert stats["pieces"] == [2, 3, 2]
    assert (stats["drafted"], stats["accepted"], stats["rounds"]) == (12, 6, 3)
    # each continuation from the prompt and the tokens so far, with what is still wanted and
    # a seed of its own derived from the request's
    prefixes = [(p, w) for p, w, _ in session.calls]
    assert prefixes == [([1, 2], 7), ([1, 2, 5, EOS], 5), ([1, 2, 5, EOS, 7, 8, EOS], 2)]
    seeds = [s for _, _, s in session.calls]
    assert seeds[0] == 11 and len(set(seeds)) == 3


def test_a_stop_id_cuts_the_output_after_it_and_an_end_of_sequence_asked_as_a_stop_ends_it():
    session = Scripted([[5, 6, 7, 8]])
    assert session.generate([1], params(8, stops=(6,)))[:2] == ([5, 6], "stop")
    session = Scripted([[5, EOS]])
    out, finish, stats = session.generate([1], params(8, stops=(EOS,)))
    assert (out, finish, stats["pieces"]) == ([5, EOS], "stop", [2])
    # an engine that ends short of max_tokens without its end of sequence: not continued
    session = Scripted([[5, 6]])
    assert session.generate([1], params(8))[:2] == ([5, 6], "stop")


def test_unseeded_requests_stay_unseeded_in_every_piece():
    session = Scripted([[EOS], [4, 4]])
    session.generate([1], params(3))
    assert [s for _, _, s in session.calls] == [None, None]


def test_the_conversion_refuses_a_head_size_its_attention_cannot_run(tmp_path):
    source = tmp_path / "draft-small"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(
        {"hidden_size": 48, "num_attention_heads": 2, "vocab_size": 32}))
    with pytest.raises(SystemExit, match="head size 24 .*hidden_size 48, 2 heads.* multiple of 16"):
        ort.convert(source, tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()


def test_the_speculative_folder_names_its_draft_in_a_subfolder(tmp_path):
    for name, layers in (("target", 2), ("draft", 1)):
        (tmp_path / name).mkdir()
        decoder = {"filename": "model.onnx", "num_hidden_layers": layers}
        (tmp_path / name / "genai_config.json").write_text(json.dumps(
            {"model": {"decoder": decoder, "eos_token_id": EOS}, "search": {}}))
        (tmp_path / name / "model.onnx").write_text(name)
    ort.pair(tmp_path / "target", tmp_path / "draft", tmp_path / "spec", 3)
    genai = json.loads((tmp_path / "spec" / "genai_config.json").read_text())
    assert genai["speculative"] == {"max_draft_tokens": 3}
    assert genai["model"]["draft"] == {"filename": "draft/model.onnx", "num_hidden_layers": 1}
    assert (tmp_path / "spec" / "draft" / "model.onnx").read_text() == "draft"
    assert genai["model"]["decoder"]["num_hidden_layers"] == 2


def test_the_kits_models_get_the_last_token_as_their_end_of_sequence():
    assert ort.eos_id({"eos_token_id": None, "vocab_size": 32}) == EOS
    assert ort.eos_id({"eos_token_id": [7], "vocab_size": 32}) == 7


def test_the_prompt_schedule_is_the_one_the_engine_was_measured_with():
    # measured 2026-12-03 on onnxruntime-genai 0.18.0 with the target as its own draft (every
    # proposal accepted), greedy, k = 4, max_tokens 1 .. 13: proposed tokens and rounds
    proposed = (1, 2, 3, 4, 4, 5, 6, 7, 8, 8, 9, 10, 11)
    rounds = (1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3)
    for n in range(1, 14):
        e = acceptance.greedy((3, 9, 27, 3, 9, 27), n, "target", 4, "prompt")
        assert (e.drafted, e.accepted, e.drafts) == (proposed[n - 1], proposed[n - 1],
                                                     rounds[n - 1]), n


def test_recorded_completion_through_the_end_of_sequence_is_the_targets_greedy_one():
    record = json.loads(RECORDED.read_text())
    engine = engines.get("onnxruntime-genai")
    client = Client("http://127.0.0.1:9/v1", dialect=engine.dialect, model="kit-target")
    exchange = record["exchanges"]["greedy_through_last_token"]
    fields = dict(exchange["request"])
    req = Request(tuple(fields.pop("prompt")), fields.pop("max_tokens"),
                  SamplingParams(**{**fields, "stop_ids": tuple(fields["stop_ids"])}))
    (completion,) = client.read_answer(exchange["answer"], req)
    assert list(completion.tokens) == oracle.served_greedy(req.prompt, req.max_tokens)
    assert EOS in completion.tokens[:-1] and len(completion.pieces) >= 2
    # the engine's counts equal the exact replay, piece by piece
    case = ServedCase(req.prompt, req.max_tokens)

    class Impl:
        method, k = engine.method("draft-early-exit"), 4

        class client:      # the dialect's end-of-sequence convention: the default, counted on
            dialect = engine.dialect
    expected = checks._replay(case, completion, Impl, engine.schedule)
    assert (completion.drafted, completion.accepted) == (expected.drafted, expected.accepted)
