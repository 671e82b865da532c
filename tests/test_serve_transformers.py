"""The kit against a real server: ``transformers serve`` on the exported checkpoints.

A module fixture exports the served models, starts transformers serve on a free port with
one torch thread, and stops it afterwards. The kit then runs as a user runs it, in a child
pytest: ``pytest properties/ --impl=openai:URL --baseline=URL`` with prompt lookup turned on
per request (``generation_config`` with ``prompt_lookup_num_tokens``) for the implementation
under test and off for the baseline (the same server). If the server cannot start, the tests
skip with the reason (never a silent pass); `make` installs what it needs ('.[serve]').
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from properties import engines
from properties.checks import served as checks
from properties.export import kit as export
from properties.cases import ServedCase
from properties.adapters.served import LOGIT_TOLERANCE, make_impl
from properties.serve.launch import LaunchError, TransformersServer

ROOT = Path(__file__).resolve().parents[1]
LOOKUP = {"prompt_lookup_num_tokens": 4}
KIT_RUN_TIMEOUT = 900  # seconds; the run takes about one to two minutes here


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    paths = export.export(tmp_path_factory.mktemp("served"))
    try:
        running = TransformersServer(paths["target"]).start()
    except LaunchError as exc:
        pytest.skip(f"transformers serve cannot start here: {exc}")
    yield running
    running.stop()


def test_server_serves_the_target_with_and_without_lookup(server):
    # as a run without --served-engine: the probing dialect finds transformers' request shape
    probing = make_impl("openai:" + server.url, dialect=engines.unknown_dialect())
    checks.check_identity(probing.client, LOGIT_TOLERANCE)
    assert probing.client.dialect.name == "transformers"   # text prompts, generation_config
    engine = engines.get("transformers")
    lookup = engine.method("prompt-lookup")
    impl = make_impl("openai:" + server.url, dialect=engine.dialect_for(lookup),
                     baseline=server.url, baseline_dialect=engine.dialect_for(None),
                     engine=engine, method=lookup)
    assert impl.client.dialect.generation_config == LOOKUP
    checks.check_greedy(impl, ServedCase((3, 9, 27, 3, 9, 27, 3, 9), 16))


# the served families in `make test` (served_batch and served_acceptance run on the production
# engines: transformers serve answers one request at a time and reports no counters)
FAMILIES = "served_greedy,served_sequence,served_bounds,served_params"


# The whole served kit against a live `transformers serve` (4-13 minutes on 2 cores): behind
def known_for_this_server(tmp_path) -> Path:
    """tests/known/transformers.txt's entries for the installed transformers, for a run by URL:
    such a run knows no engine version (the launcher's runs match entries by theirs), so the
    entries of this version, for every method, are written out with VERSION *."""
    import transformers
    from properties import known
    entries = known.read(ROOT / "tests" / "known" / "transformers.txt",
                         transformers.__version__, "*")
    path = tmp_path / "known.txt"
    path.write_text("".join(" | ".join(("*", e.method, e.test, e.pattern, e.script, e.confirmed))
                            + "\n" for e in entries))
    return path


# `extra` for make test's budget; `make engines` runs the same server through the launcher
# (transformers:prompt-lookup) and test_server_serves_the_target_with_and_without_lookup above
# keeps the server's start-up and answers in make test.
@pytest.mark.extra
def test_the_kit_passes_transformers_serve_with_prompt_lookup(server, tmp_path):
    report = tmp_path / "conformance.json"
    command = [sys.executable, "-m", "pytest", "properties/", f"--impl=openai:{server.url}",
               f"--baseline={server.url}", "--served-api=transformers",
               f"--served-generation-config={json.dumps(LOOKUP)}", "--served-draft=ngram",
               f"--kit-families={FAMILIES}", "-p", "no:cacheprovider",
               # transformers' own defects, each with its reproduction (a run whose failures are
               # all listed there exits 0, still NOT CONFORMANT)
               f"--known-failures={known_for_this_server(tmp_path)}",
               "-q", f"--conformance-json={report}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=KIT_RUN_TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "requests/s while busy" in output, output[-3000:]
    summary = json.loads(report.read_text())
    families = summary["families"]
    for family in FAMILIES.split(","):
        assert families[family]["passed"] > 0 and families[family]["failed"] == 0, families[family]
        # a pass where nothing was speculated is no pass: the lookup was shown to propose
        assert families[family]["not_shown"] == 0, families[family]
        assert families[family]["examples_shown"][1] > 0, families[family]
    print(output[-2500:])
