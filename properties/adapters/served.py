"""The Impl behind ``--impl=openai:URL``: a served engine, reached over HTTP.

It has one level, ``served``: the kit's served families apply to it and no other family does
(the engine-level families need the kit to hand the engine its models; a server loads its
own). The client starts with the OpenAI dialect; the pytest plugin applies the engine's dialect
and the options (the launcher's in-process settings, or --baseline, --served-*, timeouts,
concurrency from the command line) before the first test.
"""

from __future__ import annotations

from properties.impl import Impl, ImplError
from properties.adapters.client import Client, parse_url

# Greedy divergences where the float64 target's top-two logit gap is below this are rounding
# ties. The served models compute in float32 (export and recipes); their logits are O(10) and
# float32 forwards of two layers stay within ~1e-5 of float64 (tests/test_serve_export.py
# measures it), so 1e-3 leaves a wide margin and still calls every real divergence a failure.
LOGIT_TOLERANCE = 1e-3
# what drafts for the server: "perfect" (the target itself), an export name whose acceptance
# the kit replays exactly, "ngram" (prompt lookup), "none" (no speculation), or "unknown"
DRAFTS = ("unknown", "perfect", "draft-early-exit", "draft-random", "ngram", "none")


class ServedImpl(Impl):
    def __init__(self, spec: str, url: str):
        super().__init__(spec=spec, description=f"the OpenAI-compatible server at {url}")
        self.url = url
        self.levels = ("served",)
        self.client = Client(url)
        self.baseline: Client | None = None      # the same model served without speculation
        self.logit_tolerance = LOGIT_TOLERANCE
        self.draft = "unknown"                   # "perfect": the server drafts with the target
        self.k = 4                               # proposals per round (--served-k)
        self.schedule = None                     # the engine's end-of-request draft habit
        self.engine = None                       # its properties.engines Engine, if known

    def has(self, level: str) -> bool:
        return level == "served"

    def header(self) -> str:
        baseline = self.baseline.url if self.baseline else "none (--baseline=URL to compare)"
        return (f"implementation under test: --impl={self.spec} -> {self.description}\n"
                f"levels: served (OpenAI-compatible completions; dialect "
                f"{self.client.dialect.name}); "
                f"baseline: {baseline}\n"
                f"greedy ties: float64 top-two logit gap <= {self.logit_tolerance:g}")


def make_impl(spec: str) -> ServedImpl:
    url = spec[len("openai:"):]
    try:
        parse_url(url)
    except ValueError as exc:
        raise ImplError(f"--impl={spec}: {exc}") from None
    return ServedImpl(spec, url)
