"""An engine driven through a Python API is served by the kit's worker
(properties/engines/inprocess.py) and judged like a server: the launcher end to end, an
exception inside the engine's API answered with its signature, a hard crash reported as a
death and restarted, refused fields "not supported", batch size 1 declared, a session that
batches given the requests in flight together in one call (and the call's exception failing
each of them), and the worker compiling the session class alone (no project import, no torch)
as it must in an engine's own environment.

The session here needs no engine: it computes from the kit's float64 target (exact greedy,
exact seeded sampling) and reports the draft statistics of a perfect draft, k per round.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from properties import engines
from properties.adapters.client import Client, HttpError, Request
from properties.engines import Engine, Method, inprocess, python_api
from properties.methods import PERFECT
from properties.serve import deaths
from properties.serve.server import Server
from reference.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
K = 4


# ------------------------------------------------------------------ the engine's one file

class Session:
    """Runs in the worker: imports inside its methods, names nothing else of this file."""

    PARAMS = ()
    K = 4

    BATCH = 4

    def __init__(self, config):
        self.speculate = bool(config.get("speculate"))
        self.behaviour = config.get("behaviour")
        # config["calls"]: a session that batches (the worker sees generate_batch), appending
        # each engine call's number of rows to that file (1 for a call of generate), so a test
        # sees how the worker grouped what it sent
        self.calls = config.get("calls")
        if self.calls:
            self.generate_batch = self.batch

    def note(self, rows):
        if self.calls:
            with open(self.calls, "a") as f:
                f.write(f"{rows}\n")

    def batch(self, prompts, params_list):
        self.note(len(prompts))
        return [self.answer(p, q) for p, q in zip(prompts, params_list)]

    def generate(self, prompt, params):
        self.note(1)
        return self.answer(prompt, params)

    def answer(self, prompt, params):
        import numpy as np
        import torch
        from properties import oracle
        from reference.sampling import probs_from_logits

        t, top_k = params["temperature"], params["top_k"]
        if self.behaviour == "raise" and t > 0 and top_k > 0:
            raise RuntimeError(f"top_k={top_k} is not implemented under speculation")
        if self.behaviour == "crash" and t > 0 and top_k > 0:
            import ctypes
            ctypes.string_at(0)     # a segmentation fault, as native code may die
        seed = params["seed"]
        rng = np.random.default_rng(seed if seed is not None else None)
        seq, out, finish = list(prompt), [], "length"
        while len(out) < params["max_tokens"]:
            logits = oracle.served_next_logits([seq], "target")[0]
            if t == 0:
                token = int(torch.argmax(logits))
            else:
                probs = probs_from_logits(logits, t, top_k, params["top_p"]).numpy()
                token = int(rng.choice(len(probs), p=probs / probs.sum()))
            out.append(token)
            seq.append(token)
            if token in params["stop_token_ids"]:
                finish = "stop"
                break
        if not self.speculate:
            return out, finish, None
        # a perfect draft: the prefill gives one token, each round k accepted and one more
        rounds = max(0, -(-(len(out) - 1) // (self.K + 1)))
        drafted = self.K * rounds
        return out, finish, {"drafted": drafted, "accepted": drafted, "rounds": rounds}


def command(env, export_dir, method, port):
    config = {"speculate": method is not None,
              "behaviour": None if method is None else BEHAVIOUR[method.name]}
    return python_api.worker(sys.executable, __file__, config, port,
                             env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


BEHAVIOUR = {"perfect-draft": None, "raise-on-top-k": "raise", "crash-on-top-k": "crash"}
ENGINE = Engine(
    name="python-api-test", title="a session driven through a Python API (test)",
    setup="nothing", validated=("test",),
    methods={name: Method(name, f"the target drafts for itself ({name})", PERFECT, K)
             for name in BEHAVIOUR},
    dialect=python_api.InProcess(), find=lambda: None, version=lambda env: "test",
    command=command, start_timeout=60.0, schedule="full", recipe=False, concurrency=1)


def batching_command(calls, behaviour=None, window=None):
    def command(env, export_dir, method, port):
        config = {"speculate": method is not None, "calls": str(calls),
                  "behaviour": behaviour if method is not None else None}
        return python_api.worker(sys.executable, __file__, config, port, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                 window=window)
    return command


BATCHING = Engine(
    name="python-api-batching-test", title="a session that batches (test)", setup="nothing",
    validated=("test",), methods={"perfect-draft": ENGINE.methods["perfect-draft"]},
    dialect=python_api.InProcess(), find=lambda: None, version=lambda env: "test",
    command=None, start_timeout=60.0, schedule="full", recipe=False,
    concurrency=Session.BATCH)


# ------------------------------------------------------------------ the tests

@pytest.fixture
def registered():
    engines.register(ENGINE.name, ENGINE)
    yield ENGINE
    engines.ENGINES.pop(ENGINE.name)


@pytest.fixture
def worker(tmp_path):
    """A worker of the given method, started, with a client and its watchdog."""
    started = []

    def start(method):
        server = Server("worker", lambda p: command(None, tmp_path, ENGINE.methods[method], p),
                        tmp_path, start_timeout=60.0)
        server.start()
        started.append(server)
        client = Client(server.url, dialect=ENGINE.dialect, timeout=60)
        client.watchdog = deaths.Watchdog(server.url.removesuffix("/v1") + "/health", server,
                                          deaths.Registry(), grace=2.0)
        return server, client

    yield start
    for server in started:
        server.stop()


SAMPLED = Request((3, 9, 27), 6, SamplingParams(temperature=1.0, top_k=5, seed=7))


def test_the_launcher_judges_an_engine_served_through_its_python_api(registered, tmp_path):
    from properties.serve import run
    said = []
    outcome = run.run(ENGINE.name, "perfect-draft", run_dir=tmp_path, measure_speed=False,
                      families="served_perfect_draft,served_batch", say=said.append)
    record = outcome.summary
    assert (outcome.verdict, outcome.exit) == ("CONFORMANT", 0), "\n".join(said[-40:])
    # the session's own draft statistics, per answer, read by the kit
    assert record["speculation"]["drafted"] > 0
    assert record["speculation"]["source"].startswith("draft statistics of")
    perfect = record["summary"]["served_perfect_draft"]
    assert perfect["passed"] >= 1 and perfect["failed"] == 0, perfect
    # batch size 1: the batch family says so instead of judging requests answered one by one
    batch = record["summary"]["served_batch"]
    assert batch["passed"] == batch["failed"] == 0, batch
    assert any(r.startswith("not supported:") and "batch size 1" in r
               for r in batch["reasons"]), batch["reasons"]


def test_an_exception_in_the_engines_api_is_its_failure_with_its_signature(worker):
    server, client = worker("raise-on-top-k")
    with pytest.raises(HttpError) as failed:
        client.complete(SAMPLED)
    assert failed.value.status == 500
    # the exception and its innermost frame, as deaths.signature reads a crash's log
    assert ("RuntimeError: top_k=5 is not implemented under speculation in "
            "test_engine_inprocess.py:answer") in str(failed.value)
    assert "Traceback" in server.log_tail()
    # the worker lives on: the next request is answered, and no death was recorded
    assert server.alive() and not client.watchdog.registry.deaths
    (done,) = client.complete(Request((3, 9, 27), 4))
    assert len(done.tokens) == 4 and done.drafted is not None


def test_a_hard_crash_of_the_worker_is_a_death_with_its_signature(worker):
    server, client = worker("crash-on-top-k")
    with pytest.raises(deaths.ServerDied) as died:
        client.complete(SAMPLED)
    assert "Segmentation fault" in died.value.death.signature, server.log_tail()
    assert not server.alive()
    server.restart()
    (done,) = client.complete(Request((3, 9, 27), 4))
    assert len(done.tokens) == 4


def test_fields_the_session_does_not_take_are_refused_by_name(worker):
    server, client = worker("perfect-draft")
    for field, value in (("min_p", 0.1), ("logprobs", 2)):
        shaped = Request((3, 9, 27), 4, SamplingParams(temperature=1.0, **{field: value}))
        with pytest.raises(HttpError, match=f"not supported by this engine's session: {field}"):
            client.complete(shaped)
    # the worker answers one completion per request: the client asks n times
    got = client.complete(Request((3, 9, 27), 4, SamplingParams(temperature=1.0, seed=3, n=3)))
    assert len(got) == 3 and server.alive()


def test_the_worker_compiles_the_session_alone_without_the_project_or_torch():
    # a fresh interpreter that cannot import the project: the worker loads this file's Session
    # (whose module imports torch and the kit) without running any other statement
    code = ("import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]; "
            f"sys.path.insert(0, {str(Path(inprocess.__file__).parent)!r}); import inprocess; "
            f"cls = inprocess.load_class({__file__!r}, 'Session'); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'properties', 'reference', 'pytest')); "
            "print(cls.__name__, cls.PARAMS, heavy)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Session () []", done.stdout
    with pytest.raises(SystemExit, match="no top-level class 'Nope'"):
        inprocess.load_class(__file__, "Nope")


# ------------------------------------------------------------------ batches

def calls_of(path) -> list:
    return [int(line) for line in Path(path).read_text().split()] if Path(path).exists() else []


@pytest.fixture
def batching_worker(tmp_path):
    """A worker of a Session that batches (perfect draft), its window wide enough that requests sent
    at once on a loaded machine land in one group; (server, client, calls file)."""
    started = []

    def start(behaviour=None, window=1.0):
        calls = tmp_path / f"calls-{len(started)}"
        make = batching_command(calls, behaviour, window)
        server = Server("batching", lambda p: make(None, tmp_path, ENGINE.methods["perfect-draft"],
                                                   p), tmp_path, start_timeout=60.0)
        server.start()
        started.append(server)
        client = Client(server.url, dialect=ENGINE.dialect, timeout=60, concurrency=8)
        return server, client, calls

    yield start
    for server in started:
        server.stop()


ROWS = [Request((3, 9, 27), 5), Request((1, 2, 3, 4), 3, SamplingParams(temperature=1.0, seed=4)),
        Request((30, 1), 6), Request((7,), 2, SamplingParams(temperature=0.8, top_k=4, seed=2))]


def test_requests_in_flight_together_are_answered_by_one_batched_call(batching_worker):
    server, client, calls = batching_worker()
    from properties import oracle
    answers = client.complete_many(ROWS)
    assert calls_of(calls) == [4], "four requests sent at once: one call of generate_batch"
    # each row answered as it is alone: the greedy rows the target's greedy output, every row
    # the same as the same request sent by itself (then a call of generate, one row)
    for req in (ROWS[0], ROWS[2]):
        (got,) = answers[ROWS.index(req)]
        assert list(got.tokens) == oracle.served_greedy(req.prompt, req.max_tokens)
    alone = [client.complete(r) for r in ROWS]
    assert calls_of(calls) == [4, 1, 1, 1, 1]
    assert [a[0].tokens for a in alone] == [a[0].tokens for a in answers]
    assert all(a[0].drafted is not None for a in answers)


def test_more_requests_than_a_call_takes_go_in_consecutive_calls(batching_worker):
    server, client, calls = batching_worker()
    client.complete_many(ROWS + ROWS[:2])
    # BATCH = 4 rows per call at most: the first four, then the two that waited
    assert calls_of(calls) == [4, 2]


def test_an_exception_in_a_batched_call_fails_every_request_of_it(batching_worker):
    from concurrent.futures import ThreadPoolExecutor
    server, client, calls = batching_worker("raise")
    greedy = [Request((3, 9, 27), 4), Request((5, 6), 3), Request((30,), 2)]

    def outcome(req):
        try:
            return client.complete(req)
        except HttpError as exc:
            return exc

    # one row asks for top-k sampling, which the session raises on: its call fails, and with
    # it the greedy rows answered by the same call
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(outcome, greedy + [SAMPLED]))
    assert calls_of(calls) == [4]
    for failed in got:
        assert isinstance(failed, HttpError) and failed.status == 500, failed
        assert ("RuntimeError: top_k=5 is not implemented under speculation in "
                "test_engine_inprocess.py:answer") in str(failed)
    assert "Traceback" in server.log_tail() and server.alive()
    # the next group is answered
    assert [len(a[0].tokens) for a in client.complete_many(greedy)] == [4, 3, 2]
    assert calls_of(calls) == [4, 3]


@pytest.mark.extra
def test_the_launcher_judges_batches_of_a_session_that_batches(tmp_path):
    """served_batch end to end on a session that batches (BATCH 4, so the kit keeps 4 in
    flight): its greedy and seed checks pass on calls of generate_batch (35 s: make
    test-extra)."""
    from properties.serve import run
    calls = tmp_path / "calls"
    engine = replace(BATCHING, command=batching_command(calls, window=0.3))
    engines.register(engine.name, engine)
    said = []
    try:
        outcome = run.run(engine.name, "perfect-draft", run_dir=tmp_path / "run",
                          measure_speed=False, families="served_batch", say=said.append,
                          pytest_args=["-k", "not independent"])
    finally:
        engines.ENGINES.pop(engine.name)
    batch = outcome.summary["summary"]["served_batch"]
    assert (outcome.verdict, outcome.exit) == ("CONFORMANT", 0), "\n".join(said[-40:])
    assert batch["passed"] >= 2 and batch["failed"] == 0, batch
    assert max(calls_of(calls)) == Session.BATCH, calls_of(calls)
