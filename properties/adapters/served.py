"""The Impl behind ``--impl=openai:URL``: a served engine, reached over HTTP.

It has one level, ``served``: the kit's served families apply to it and no other family does
(the engine-level families need the kit to hand the engine its models; a server loads its
own). The pytest plugin builds it from the options (--baseline, --served-*, or the engine and
method the session started: properties/plugin/served.py), configured once.
"""

from __future__ import annotations

from properties import methods
from properties.impl import Impl, ImplError
from properties.methods import Method
from properties.adapters.client import Client, parse_url

# Greedy divergences where the float64 target's top-two logit gap is below this are rounding
# ties. The served models compute in float32 (export and recipes); their logits are O(10) and
# float32 forwards of two layers stay within ~1e-5 of float64 (tests/test_serve_export.py
# measures it), so 1e-3 leaves a wide margin and still calls every real divergence a failure.
LOGIT_TOLERANCE = 1e-3
class ServedImpl(Impl):
    """A served engine, built with everything the checks ask of it (never configured after the
    fact): its client (URL, dialect, model, timeout, concurrency), the baseline's client, the
    speculative method (properties.methods: what drafts, k, conventions), the engine's file
    where it is known (properties.engines) and its end-of-request draft habit."""

    def __init__(self, spec: str, client: Client, *, baseline: Client | None = None,
                 method: Method = methods.by_option("unknown"), engine=None,
                 schedule: str | None = None, logit_tolerance: float = LOGIT_TOLERANCE):
        super().__init__(spec=spec, description=f"the OpenAI-compatible server at {client.url}")
        self.url = client.url
        self.levels = ("served",)
        self.client = client
        self.baseline = baseline                 # the same model served without speculation
        self.logit_tolerance = logit_tolerance
        self.method = method
        self.engine = engine                     # its properties.engines Engine, if known
        # the engine's end-of-request draft habit (properties.acceptance)
        self.schedule = schedule if schedule is not None else getattr(engine, "schedule", None)

    @property
    def k(self) -> int:
        return self.method.k

    def has(self, level: str) -> bool:
        return level == "served"

    def header(self) -> str:
        baseline = self.baseline.url if self.baseline else "none (--baseline=URL to compare)"
        return (f"implementation under test: --impl={self.spec} -> {self.description}\n"
                f"levels: served (OpenAI-compatible completions; dialect "
                f"{self.client.dialect.name}); method {self.method.name} "
                f"({self.method.drafter.describe()}, k={self.method.k}); "
                f"baseline: {baseline}\n"
                f"greedy ties: float64 top-two logit gap <= {self.logit_tolerance:g}")


def make_impl(spec: str, *, dialect=None, baseline: str | None = None, baseline_dialect=None,
              model: str | None = None, timeout: float = 60.0, concurrency: int = 8,
              method: Method | None = None, engine=None, schedule: str | None = None,
              logit_tolerance: float | None = None) -> ServedImpl:
    """The ServedImpl of `spec` ("openai:URL"), configured: an engine's `concurrency` caps the
    requests in flight of both clients."""
    url = spec[len("openai:"):]
    try:
        parse_url(url)
    except ValueError as exc:
        raise ImplError(f"--impl={spec}: {exc}") from None
    if engine is not None and engine.concurrency:   # what it answers at once, at most
        concurrency = min(concurrency, engine.concurrency)
    client = Client(url, model=model, timeout=timeout, concurrency=concurrency,
                    **({"dialect": dialect} if dialect is not None else {}))
    base = None
    if baseline:
        try:
            base = Client(baseline, model=model, timeout=timeout, concurrency=concurrency,
                          **({"dialect": baseline_dialect} if baseline_dialect else {}))
        except ValueError as exc:
            raise ImplError(f"--baseline={baseline}: {exc}") from None
    return ServedImpl(spec, client, baseline=base, method=method or methods.by_option("unknown"),
                      engine=engine, schedule=schedule,
                      logit_tolerance=LOGIT_TOLERANCE if logit_tolerance is None
                      else logit_tolerance)
