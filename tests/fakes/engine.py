"""The project's own fake server as an engine: the launcher's self-test (start, health, a
server that dies at a chosen request, restart, counters, verdict) in seconds, no engine needed.

Test infrastructure, not the kit: it lives in a checkout of the project (tests/fakes/), outside
what `pip install` ships, and the engine table names it by its module, ``tests.fakes.engine``
(properties/engines/__init__.py): ``python -m properties.serve run fake perfect-draft`` runs
from the checkout's root. Its server (tests/fakes/server.py) is started there too, as
``python -m tests.fakes.server`` with the checkout's root as its working directory."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from properties.adapters.dialects import Dialect, read_prometheus
from properties.methods import BOTH_PAIRS, EARLY_EXIT, PERFECT, SMALL
from properties.engines import Command, Engine, Method
from reference.penalties import OPENAI

# the checkout's root: the server's module, tests.fakes.server, is imported from there
ROOT = Path(__file__).resolve().parents[2]

METHODS = {m.name: m for m in (
    Method("perfect-draft", "correct: exact sampling, counters of a perfect draft", PERFECT),
    Method("die-on-top-k", "dies at the first sampled request with top_k > 0", PERFECT),
    # a trained pair (--models trained, trained-large): its early exit or small draft, k = 4
    # per round
    Method("draft-early-exit", "a trained pair's early exit "
                               "(--models trained or trained-large)",
           EARLY_EXIT, pairs=BOTH_PAIRS),
    Method("draft-small", "a trained pair's small draft (--models trained or trained-large)",
           SMALL, pairs=BOTH_PAIRS),
)}
# its speculation counters, on its /metrics page (tests/fakes/server.py)
DRAFTED = "kit_fake_drafted_tokens_total"
ACCEPTED = "kit_fake_accepted_tokens_total"
BEHAVIOUR = {"perfect-draft": None, "die-on-top-k": "die_on_top_k"}
TRAINED_ONLY = ("draft-early-exit", "draft-small")


@dataclass(frozen=True)
class Fake(Dialect):
    """The OpenAI API; its counters are the fake server's own names on its /metrics page."""

    name: str = "fake"

    def counters(self, client):
        return read_prometheus(client, (DRAFTED,), (ACCEPTED,))


# the fake server follows the OpenAI formula (tests/fakes/server.py)
FAKE = Fake(stop_in_ids=True, stop_in_text=True, honours_n=True, formula=OPENAI)


def serves_trained(export_dir) -> bool:
    """The export is the trained pair's (its target carries the trained tokenizer)."""
    from reference.pretrained import TRAINED_DIR
    exported = Path(export_dir) / "target" / "tokenizer.json"
    return exported.is_file() and exported.read_text() == (TRAINED_DIR / "tokenizer.json").read_text()


def trained_pair_dir(export_dir) -> Path | None:
    """The directory of the trained pair the export was made from, or None (not a trained
    export). Both pairs carry the same tokenizer, so the target's shape tells them apart (the
    weight-bound pair's is larger by design); the committed pair when none matches."""
    if not serves_trained(export_dir):
        return None
    from properties.export.trained import PAIRS

    def shape(config):
        c = json.loads(config.read_text())
        return c["hidden_size"], c["num_hidden_layers"], c["head_dim"]

    exported = shape(Path(export_dir) / "target" / "config.json")
    for path in PAIRS.values():
        config = path / "target" / "config.json"
        if config.is_file() and shape(config) == exported:
            return path
    return PAIRS["trained"]


def command(env, export_dir, method, port) -> Command:
    argv = [sys.executable, "-m", "tests.fakes.server", "--port", str(port)]
    behaviour = BEHAVIOUR.get(method.name) if method is not None else None
    if behaviour:
        argv += ["--behaviour", behaviour]
    pair_dir = trained_pair_dir(export_dir)
    if pair_dir is not None:
        draft = "none" if method is None else method.drafter.export
        argv += ["--trained", draft]
        from reference.pretrained import TRAINED_DIR
        if pair_dir != TRAINED_DIR:     # the committed pair's command line stays as it was
            argv += ["--trained-dir", str(pair_dir)]
    elif method is not None and method.name in TRAINED_ONLY:
        # the server says so and exits: the launcher reports it from the log (a command line
        # is still made, for the recipes and the interface's test)
        argv += ["--trained-only", method.name]
    return Command(argv, health="/health", cwd=str(ROOT))


ENGINE = Engine(
    name="fake", title="the kit's fake server (self-test)",
    setup="nothing (a checkout of the project)",
    validated=("self",), methods=METHODS, dialect=FAKE, find=lambda: None,
    version=lambda env: "self", command=command, start_timeout=60.0, schedule="full",
    recipe=False)
