"""An engine driven through a Python API is served by the kit's worker
(properties/engines/inprocess.py) and judged like a server: the launcher end to end, an
exception inside the engine's API answered with its signature, a hard crash reported as a
death and restarted, refused fields "not supported", batch size 1 declared, and the worker
compiling the session class alone (no project import, no torch) as it must in an engine's own
environment.

The session here needs no engine: it computes from the kit's float64 target (exact greedy,
exact seeded sampling) and reports the draft statistics of a perfect draft, k per round.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from properties import engines
from properties.adapters.client import Client, HttpError, Request
from properties.engines import Engine, Method, inprocess, python_api
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

    def __init__(self, config):
        self.speculate = bool(config.get("speculate"))
        self.behaviour = config.get("behaviour")

    def generate(self, prompt, params):
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
    methods={name: Method(name, f"the target drafts for itself ({name})", "perfect", K)
             for name in BEHAVIOUR},
    dialect=python_api.InProcess(), find=lambda: None, version=lambda env: "test",
    command=command, start_timeout=60.0, schedule="full", recipe=False, concurrency=1)


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
            "test_engine_inprocess.py:generate") in str(failed.value)
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
