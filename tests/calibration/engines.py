"""The correct implementations each family is calibrated on, and how a worker gets them.

``served`` is the project's fake server (tests/fakes/server.py, exact sampling from
the float64 target) in the worker's own process, reached over HTTP as a kit run reaches it with
``python -m properties.serve run fake perfect-draft``. ``own-sampler`` is a correct engine that
exposes its own sampler (target_generate): the only kind the sampler family applies to, and the
one on which the sequence family takes its two-sample path.
"""

from __future__ import annotations

OWN_SAMPLER = "tests.mutants.conventions:ConventionalWithHook"

# family -> the correct implementations it runs on (names for properties.impl.load, or "served")
CORRECT = {
    "rule": ("reference", "fast"),
    "sequence": ("reference", "fast", "transformers", OWN_SAMPLER),
    "sampler": (OWN_SAMPLER,),
    "batched": ("fast",),
    "tree": ("reference", "fast"),
    "served_sequence": ("served",),
    "served_params": ("served",),
}
SHORT = {OWN_SAMPLER: "own-sampler"}
# family -> the correct implementation whose deviating copy (deviate.py) its power is measured on
POWER_IMPL = {"rule": "reference", "sequence": "reference", "tree": "reference",
              "sampler": OWN_SAMPLER, "batched": "fast", "served_sequence": "served",
              "served_params": "served"}

_loaded: dict = {}
_fakes: list = []


def short(spec: str) -> str:
    return SHORT.get(spec, spec)


def get(spec: str, delta: float = 0.0):
    """The Impl for spec, loaded once per process (a served one starts its fake server; with
    delta > 0 a server whose sampling deviates by that total variation, deviate.py)."""
    key = (spec, delta) if spec == "served" else spec
    if key not in _loaded:
        if spec == "served":
            _loaded[key] = _served(delta)
        else:
            from properties.impl import load
            _loaded[key] = load(spec)
    return _loaded[key]


def _served(delta: float):
    from properties.adapters.served import make_impl
    from tests.fakes import engine as fake
    if delta:
        from tests.calibration.deviate import DeviatingServer
        server = DeviatingServer(delta)
    else:
        from tests.fakes.server import FakeServer
        server = FakeServer()
    server.__enter__()
    _fakes.append(server)          # kept for the process's life; its threads are daemons
    return make_impl("openai:" + server.url, dialect=fake.FAKE, engine=fake.ENGINE,
                     method=fake.METHODS["perfect-draft"])


def close() -> None:
    while _fakes:
        _fakes.pop().__exit__(None, None, None)
