"""The kit as a user runs it (``pytest properties/ --impl=openai:URL``) against servers kept
outside the kit that misbehave only inside concurrent batches or only under one sampling
parameter, or only in a round after a rejection (tests/mutants/served_batch.py,
served_params.py): each run's verdict is NOT CONFORMANT, naming the test meant for the defect;
the correct fake server's run is CONFORMANT, also when it speculates for real, in rounds
(tests/fakes/speculating.py).

Minutes per run (each a whole family at the default profile): ``make test-extra``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.server import FakeServer
from tests.fakes.speculating import RoundsServer
from tests.mutants import served_batch, served_params

pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    # server class, family, the failing test it must produce (None: CONFORMANT)
    (FakeServer, "served_batch,served_params", None),
    (served_batch.FlipsClosestCall, "served_batch",
     "test_greedy_request_inside_a_batch_equals_it_alone"),
    (served_batch.SharedBatchState, "served_batch",
     "test_concurrent_sampled_requests_are_independent"),
    (served_params.RejectedDraftInHistory, "served_params", "test_law_repetition_penalty"),
    (served_params.StopStringLate, "served_params", "test_stop_strings_inside_accepted_blocks"),
    (served_params.DraftLogprobs, "served_params", "test_logprobs_are_the_targets"),
    # speculating for real, in rounds (tests/fakes/speculating.py): correct, and state carried
    # from one round to the next broken (issue 42)
    (RoundsServer, "served_params", None),
    (served_params.RejectedKeptInHistory, "served_params", "test_law_rounds_repetition_penalty"),
    (served_params.GeneratorRolledBack, "served_params", "test_law_rounds_repetition_penalty"),
]


@pytest.mark.parametrize("server, families, failing", CASES,
                         ids=[c[0].__name__ for c in CASES])
def test_the_kit_run_judges_the_server(tmp_path, server, families, failing):
    report = tmp_path / "conformance.json"
    with server() as fake, FakeServer() as baseline:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "properties/", f"--impl=openai:{fake.url}",
             f"--baseline={baseline.url}", "--served-engine=fake", "--served-draft=perfect",
             f"--kit-families={families}", "-p", "no:cacheprovider", "-q",
             f"--conformance-json={report}", "-o", "addopts=--benchmark-disable"],
            cwd=ROOT, capture_output=True, text=True, timeout=1200)
    summary = json.loads(report.read_text())
    output = (done.stdout + done.stderr)[-4000:]
    if failing is None:
        assert summary["verdict"] == "CONFORMANT" and done.returncode == 0, output
        return
    assert summary["verdict"] == "NOT CONFORMANT" and done.returncode == 1, output
    failures = [n for e in summary["families"].values() for n in e["failures"]]
    assert any(n.split("::")[-1].split("[")[0] == failing for n in failures), (failures, output)
