"""Adding an engine is one file and one line: an engine defined here, in a test module, is
registered with one `register(...)` and judged by the launcher end to end, in this process
(the launcher hands the Engine object to the checks; nothing looks it up by name again).

The throwaway engine is a variant of the kit's fake server that reports its speculation
counters per response (each choice carries a `draft` object) instead of on a /metrics page,
so its dialect declares its own request path, its own reading of answers and its own
counters; the client, the checks, the evidence of speculation and the launcher are the kit's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from properties import engines
from properties.adapters.dialects import Dialect
from properties.adapters.protocol import Completion
from properties.engines import Command, Engine, Method
from properties.methods import PERFECT

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the engine's one file

def serve(port: int) -> None:
    """The server: the fake server, each choice with the draft statistics of a perfect draft
    (k per round, the "full" schedule), completions at /v1/completions as ever."""
    from tests.fakes.server import K, FakeServer, _rounds

    class PerResponse(FakeServer):
        def complete(self, body):
            status, payload = super().complete(body)
            for choice in payload.get("choices", []) if status == 200 else []:
                drafted = K * _rounds(len(choice["token_ids"]))
                choice["draft"] = {"proposed": drafted, "accepted": drafted}
            return status, payload

    server = PerResponse()
    server.port = port
    with server:
        print(f"per-response fake engine on {server.url}", flush=True)
        threading.Event().wait()


@dataclass(frozen=True)
class PerResponseDialect(Dialect):
    """The OpenAI API; each choice's `draft` holds the engine's own counts."""

    name: str = "per-response"
    per_response: bool = True

    def read_choice(self, choice, req, where) -> Completion:
        read = super().read_choice(choice, req, where)
        draft = choice.get("draft") or {}
        return Completion(read.tokens, read.finish_reason, draft.get("proposed"),
                          draft.get("accepted"))


def command(env, export_dir, method, port) -> Command:
    return Command([sys.executable, __file__, "--port", str(port)],
                   env={"PYTHONPATH": str(ROOT)}, health="/health")


ENGINE = Engine(
    name="per-response", title="a fake engine counting per response (test)",
    setup="nothing", validated=("test",),
    methods={"perfect-draft": Method("perfect-draft", "the target drafts for itself", PERFECT)},
    dialect=PerResponseDialect(stop_in_ids=True, stop_in_text=True, honours_n=True),
    find=lambda: None, version=lambda env: "test", command=command, start_timeout=60.0,
    schedule="full", recipe=False)


# ------------------------------------------------------------------ the tests

@pytest.fixture
def registered():
    engines.register("per-response", ENGINE)        # the one line
    yield ENGINE
    engines.ENGINES.pop("per-response")


def test_an_engine_added_in_one_line_is_judged_by_the_launcher(registered, tmp_path):
    from properties.serve import run
    said = []
    outcome = run.run("per-response", "perfect-draft", run_dir=tmp_path,
                      families="served_perfect_draft", measure_speed=False,
                      say=said.append)
    record = outcome.summary
    assert (outcome.verdict, outcome.exit) == ("CONFORMANT", 0), "\n".join(said[-40:])
    # its own counters were read through its own dialect, by the checks and as evidence
    assert record["speculation"]["drafted"] > 0
    assert record["speculation"]["source"].startswith("draft statistics of")
    perfect = record["summary"]["served_perfect_draft"]
    assert perfect["passed"] >= 1 and perfect["failed"] == 0, perfect
    # the run directory holds what a run always writes
    assert (tmp_path / "conformance.json").exists() and (tmp_path / "result.json").exists()


def test_the_engine_table_and_its_interface():
    for name in engines.ENGINES:
        engine = engines.get(name)
        assert isinstance(engine.dialect, Dialect), name
        for method in engine.methods.values():
            assert isinstance(engine.dialect_for(method), Dialect), (name, method.name)
            if engine.command is not None:
                line = engine.command(None, "/x", method, 8000)
                assert isinstance(line, Command) and line.argv, (name, method.name)
    with pytest.raises(KeyError, match="no engine 'nope'"):
        engines.get("nope")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    serve(parser.parse_args().port)


def test_a_generation_config_goes_only_to_a_dialect_that_sends_one():
    """--served-generation-config is merged into transformers serve's requests; an engine whose
    requests carry none refuses it, naming it, instead of dropping it silently."""
    from properties.adapters.client import Request
    from reference.sampling import SamplingParams
    lookup = {"prompt_lookup_num_tokens": 4}
    body = engines.get("transformers").dialect.with_generation_config(lookup).body(
        Request((1, 2), 3, SamplingParams()), "m")
    assert json.loads(body["generation_config"])["prompt_lookup_num_tokens"] == 4
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        engines.get("vllm").dialect.with_generation_config(lookup)
    assert engines.get("vllm").dialect.with_generation_config({}) is engines.get("vllm").dialect
