"""The launcher (python -m properties.serve run) against the project's own fake engine: it
starts and stops servers, reports a server that dies at a request as a finding (the exact
body and a curl line), restarts it and goes on, counts a second death of the same kind as the
same finding, and reaches its verdict with known failures and the evidence of speculation."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from properties import known, verdict
from properties.serve import deaths, run
from properties.session import Session
from properties.adapters.client import Client, Request
from properties.serve.deaths import ServerDied, Watchdog, signature
from tests.fakes import engine as fake
from properties.serve.server import LaunchError, Server
from reference.sampling import SamplingParams


def fake_server(tmp_path, behaviour_method="die-on-top-k", **kw):
    method = fake.METHODS[behaviour_method]
    return Server("fake", lambda port: fake.command(None, tmp_path, method, port), tmp_path, **kw)


def test_a_server_that_dies_is_reported_at_its_request(tmp_path):
    with fake_server(tmp_path) as server:
        client = Client(server.url, model="kit-target", timeout=10)
        client.watchdog = Watchdog(f"http://127.0.0.1:{server.port}/health", server=server,
                                   registry=deaths.Registry(), grace=2)
        assert client.complete(Request((1, 2), 2, SamplingParams(temperature=1.0, seed=1)))  # alive
        killing = Request((1, 2), 2, SamplingParams(temperature=1.0, top_k=3, seed=1))
        with pytest.raises(ServerDied) as died:
            client.complete(killing)
        text = str(died.value)
        assert "the server died at this request" in text and "curl -sS" in text
        assert '"top_k": 3' in text and "FakeEngineError" in died.value.cause
        # a dead server: later requests of the same test are "not run", not new findings
        with pytest.raises(ServerDied, match="not run: the server died"):
            client.complete(Request((1,), 1))
        assert len(client.watchdog.registry.deaths) == 1
        server.restart()
        client.watchdog.dead = False
        assert client.complete(Request((1, 2), 2))         # restarted on the same URL
        with pytest.raises(ServerDied) as again:
            client.complete(killing)
        assert again.value.death.same_as == 0              # the same finding
        assert "same way of dying as finding 1" in str(again.value)


def test_a_live_server_that_fails_is_an_ordinary_failure(tmp_path):
    with fake_server(tmp_path, "perfect-draft") as server:
        dog = Watchdog(f"http://127.0.0.1:{server.port}/health", server=server,
                       registry=deaths.Registry(), grace=0.5)
        dog.examine(server.url + "/completions", {"x": 1}, RuntimeError("HTTP 500"))  # returns
        assert not dog.dead and not dog.registry.deaths


def test_a_server_that_does_not_start_quotes_its_log(tmp_path):
    def command(port):
        from properties.engines import Command
        return Command(["python3", "-c", "import sys; print('cannot load model xyz'); "
                                         "sys.exit(7)"])
    with pytest.raises(LaunchError, match=r"(?s)exited with code 7.*cannot load model xyz"):
        Server("broken", command, tmp_path, start_timeout=30).start()


def test_a_port_in_use_is_named(tmp_path):
    with fake_server(tmp_path, "perfect-draft") as server:
        with pytest.raises(LaunchError, match=rf"port {server.port} is in use"):
            fake_server(tmp_path, "perfect-draft", port=server.port).start()


def test_signature_is_the_first_exception_without_numbers():
    log = ("WARNING x: can cause `OSError: [Errno 24] Too many open files`\n"
           "ERROR [w.py:10] RuntimeError: index -178199712 is out of bounds for dim 1\n"
           "ERROR [core.py:3] EngineDeadError: EngineCore encountered an issue\n")
    assert signature(log) == "RuntimeError: index -N is out of bounds for dim N"
    assert signature("terminate called after throwing\n") == "terminate called after throwing"
    # with its traceback, the signature names the frame that raised it
    traced = ('ERROR [m.py:1] Traceback (most recent call last):\n'
              'ERROR [m.py:1]   File "/x/vllm/v1/sample/rejection_sampler.py", line 5, in forward\n'
              'ERROR [m.py:1]     y = apply(x)\n'
              'ERROR [m.py:1]   File "/x/vllm/v1/sample/ops/topk_topp_sampler.py", line 529, in '
              'apply_top_k_only\n'
              'ERROR [m.py:1]     m = x.max()\n'
              'ERROR [m.py:1] RuntimeError: max(): Expected reduction dim\n')
    assert signature(traced) == ("RuntimeError: max(): Expected reduction dim in "
                                 "topk_topp_sampler.py:apply_top_k_only")
    # a parent relaying its worker's failure is not the cause; the worker's own line is
    relayed = ("ERROR [core.py:1] RuntimeError: Worker failed with error 'CPU Generator does "
               "not use offset', please check the stack trace above\n"
               "ERROR [w.py:1] RuntimeError: CPU Generator does not use offset\n")
    assert signature(relayed) == "RuntimeError: CPU Generator does not use offset"
    # an exception Python reports as ignored (raised in a __del__) is not the crash
    ignored = ("Exception ignored in: <function Handler.__del__ at 0x7f5d5a5aa520>\n"
               "Traceback (most recent call last):\n"
               '  File "/x/torch/_ops.py", line 875, in __call__\n'
               "RecursionError: maximum recursion depth exceeded\n"
               "ERROR [w.py:1] RuntimeError: index 1478550240 is out of bounds for dimension 1\n")
    assert signature(ignored) == "RuntimeError: index N is out of bounds for dimension N"
    # llama.cpp's GGML_ABORT: its message, before the backtrace's frames (seen 2026-12-07 with
    # draft-eagle3 under sampled requests; the path and line dropped)
    ggml = ("0.20.693 I slot launch_slot_: id  2 | task 1501 | processing task\n"
            "/work/x/llamacpp/src/common/common.cpp:2158: get_sub_batch: failed to add token "
            "1089071581 at index 0 (error -2, n = 2)\n\n"
            "#2  0x00007fefe794e7de in ggml_abort () from libggml-base.so.0\n")
    assert signature(ggml) == ("get_sub_batch: failed to add token N at index N (error -N, "
                               "n = N)")


def kit_run(tmp_path, method, families, *more):
    """`python -m properties.serve run fake METHOD` in a process of its own, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "properties.serve", "run", "fake", method,
                           "--run-dir", str(tmp_path), "--no-speed", "--families", families,
                           *more], capture_output=True, text=True, timeout=600, cwd=run.ROOT)
    return done, json.loads((tmp_path / "result.json").read_text())


def test_a_time_limit_stops_the_run_incomplete_never_conformant(tmp_path):
    """A correct fake that would be CONFORMANT, with a time limit shorter than its tests: no
    test starts after the limit, and the run is INCOMPLETE, saying how far it got."""
    done, record = kit_run(tmp_path, "perfect-draft", "served_bounds,served_perfect_draft",
                           "--time-limit", "0.001")
    assert (record["verdict"], done.returncode) == ("INCOMPLETE", 2), done.stdout[-3000:]
    limit = record["time_limit"]
    assert limit["seconds"] == 0.001 and 1 <= limit["reached"] < limit["planned"]
    assert f"{limit['reached']} of {limit['planned']} tests reached" in record["verdict_text"]
    assert "time limit of 0.001 s reached after" in done.stdout
    assert run.run("fake", "perfect-draft", time_limit=0, say=lambda text: None).exit == 3


def _session(outcomes, known=(), known_source=None, launched=True, drafted=10,
             stopped=None):
    """A finished run's session: outcomes {nodeid: (outcome, cause)} of served_sequence."""
    launch = types.SimpleNamespace(speculation={"drafted": drafted}) if launched else None
    run = Session(types.SimpleNamespace(spec="openai:x", description="", levels=("served",),
                                        missing={}, hints={}, model_kinds=(),
                                        has=lambda level: level == "served"),
                  known=list(known), known_source=known_source, launch=launch, time_limit=900)
    for nodeid, (outcome, cause) in outcomes.items():
        run.planned[nodeid] = "served_sequence"
        run.outcomes[nodeid] = ("served_sequence", outcome, "")
        run.causes[nodeid] = cause
        if outcome == "xfailed":
            run.known_matched[nodeid] = "findings/x.py"
    if stopped is not None:     # a test the time limit left unreached
        run.planned["properties/t.py::test_unreached"] = "served_sequence"
    run.stopped_by_limit = stopped
    return run


def test_a_run_stopped_by_its_limit_never_exits_0():
    """Known failures alone exit 0, but not when tests were left unreached; new ones exit 1."""
    stop = "the run's time limit (900 s) was reached after x"
    known_only = _session({"properties/t.py::test_a": ("xfailed", "died (top_k)")},
                          known_source="known.txt", stopped=stop)
    stopped = verdict.summary(known_only, 0)
    assert stopped["exit"] == 2 and stopped["verdict_text"].endswith(
        "(stopped by its time limit of 900 s: 1 of 2 tests reached)")
    new = _session({"properties/t.py::test_a": ("failed", "a law mismatch")}, stopped=stop)
    assert verdict.summary(new, 0)["exit"] == 1


def test_known_failures_never_make_a_run_conformant(tmp_path):
    known_file = tmp_path / "known.txt"
    known_file.write_text("# version | method | test | cause | script | confirmed\n"
                          "1.0 | m | properties/t.py::test_a | died.*top_k | findings/x.py | "
                          "run of 2026-12-03\n"
                          "2.0 | m | properties/t.py::test_b | Expected reduction | findings/y.py | run\n")
    entries = known.read(known_file, "1.0", "m")
    assert [k.test for k in entries] == ["properties/t.py::test_a"]
    assert known.match(entries, "properties/t.py::test_a[x]", "the server died (top_k)")
    assert known.match(entries, "properties/t.py::test_a", "a law mismatch") is None
    only_known = verdict.summary(_session(
        {"properties/t.py::test_a[x]": ("xfailed", "the server died (top_k)")}, entries,
        str(known_file)), 0)
    assert only_known["verdict"] == "NOT CONFORMANT"
    assert "all failures known" in only_known["verdict_text"] and only_known["exit"] == 0
    new = verdict.summary(_session({"properties/t.py::test_a": ("failed", "a law mismatch")},
                                   entries, str(known_file)), 0)
    assert new["exit"] == 1 and "1 failure(s) not known" in new["verdict_text"]
    assert new["families"]["served_sequence"]["causes"] == {
        "properties/t.py::test_a": "a law mismatch"}
    assert verdict.summary(_session({}, drafted=0), 0)["verdict"] == "NOT SHOWN"
    assert verdict.summary(_session({"properties/t.py::test_c": ("passed", "")}),
                           0)["verdict"] == "CONFORMANT"
    with pytest.raises(ValueError, match="expected 'VERSION"):
        bad = tmp_path / "bad.txt"
        bad.write_text("1.0 | m\n")
        known.read(bad, "1.0", "m")
    # a cause in the kit's own words would count any new defect of that kind as this one
    for generic in ("speculation changes the law", "ignores `seed`", "has probability 0",
                    r"server died at a request \(RuntimeError"):
        bad.write_text(f"1.0 | m | properties/t.py::test_a | {generic} | x.py | run\n")
        with pytest.raises(ValueError, match="generic wording"):
            known.read(bad, "1.0", "m")
    bad.write_text("1.0 | m | properties/t.py::test_a | Expected reduction | x.py | \n")
    with pytest.raises(ValueError, match="expected 'VERSION|confirmed"):
        known.read(bad, "1.0", "m")


def test_the_run_finds_the_death_restarts_and_goes_on(tmp_path):
    done, record = kit_run(tmp_path, "die-on-top-k", "served_bounds")
    out = done.stdout.splitlines()
    assert record["verdict"] == "NOT CONFORMANT" and done.returncode == 1, done.stdout[-3000:]
    findings = [d for d in record["deaths"] if d["same_as"] is None]
    assert len(findings) == 1 and "top_k" in findings[0]["curl"]
    assert record["restarts"], "the server was not restarted after it died"
    bounds = record["summary"]["served_bounds"]
    assert bounds["passed"] >= 1        # tests after the death ran on the restarted server
    assert any("restarting it" in line for line in out)
    assert any("replay: curl" in line for line in out)
    assert "verdict for fake self / die-on-top-k: NOT CONFORMANT" in done.stdout


def test_the_run_of_a_correct_fake_is_conformant(tmp_path):
    done, record = kit_run(tmp_path, "perfect-draft", "served_bounds,served_perfect_draft")
    assert (record["verdict"], done.returncode) == ("CONFORMANT", 0), done.stdout[-3000:]
    assert record["speculation"]["drafted"] > 0


def test_missing_engine_and_unknown_method_are_clear():
    said = []
    assert run.run("sglang", "ngram", say=said.append).exit == 3
    assert "GPU" in said[-1]
    assert run.run("fake", "nope", say=said.append).exit == 3
    assert "perfect-draft" in said[-1]


def test_run_names_a_port_in_use(tmp_path):
    import socket
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        said = []
        outcome = run.run("fake", "perfect-draft", run_dir=tmp_path, measure_speed=False,
                          say=said.append, baseline_port=port)
    assert outcome.exit == 3
    assert any(f"port {port} is in use" in line for line in said)
