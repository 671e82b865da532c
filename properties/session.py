"""One run of the kit, one Session: whatever started it (``pytest properties/ --impl=NAME``, a
production engine the kit starts with ``--engine=NAME --method=NAME``, calibration), the session
owns the implementation under test, the tests planned, their outcomes and causes, the known
failures, the speculation shown, the evidence, the counters, and (for a started engine) its
servers. properties/verdict.py decides the verdict from it, in one function.

It lives in ``config.stash[KEY]`` (pytest's typed per-run store); `of(config)` reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from properties.impl import Impl


@dataclass
class Session:
    impl: Impl
    families: tuple | None = None        # --kit-families, None: all
    known: list = field(default_factory=list)     # properties.known.KnownFailure that apply
    known_source: str | None = None      # the --known-failures file
    time_limit: float | None = None      # --time-limit: no test starts after it
    launch: object = None                # properties.serve.run.Launch: servers the kit started

    planned: dict = field(default_factory=dict)   # nodeid -> family, the kit tests selected
    examples: dict = field(default_factory=dict)  # nodeid -> examples planned
    # nodeid -> (family, outcome, reason); outcome in verdict.OUTCOMES
    outcomes: dict = field(default_factory=dict)
    causes: dict = field(default_factory=dict)    # nodeid -> the first line of its failure's cause
    known_matched: dict = field(default_factory=dict)   # nodeid -> reproduction of its entry
    shown: dict = field(default_factory=dict)     # served nodeid -> [examples, shown speculating]
    evidence: dict = field(default_factory=dict)  # nodeid -> its checks' records (--kit-report)
    report_tests: dict = field(default_factory=dict)    # nodeid -> outcome entry (--kit-report)
    stale_known: list = field(default_factory=list)     # known entries matching no test
    # nodeid -> profiles.stated(test): a deterministic property's generated examples and f
    deterministic: dict = field(default_factory=dict)
    stat_checks: int = 0
    calls: int = 0
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    stopped_by_limit: str | None = None   # why no further test started
    report: object = None                 # the report folder being written (--kit-report)
    report_page: object = None
    outcome: object = None                # verdict.Outcome, once the run has ended
    salted: list = field(default_factory=list)    # the tests --kit-reseed wrapped (undone at the end)

    @property
    def deadline(self) -> float | None:
        return None if self.time_limit is None else self.started + self.time_limit

    @property
    def version(self) -> str:
        """The engine version known failures are matched against (* where there is none)."""
        return self.launch.version if self.launch is not None else "*"

    @property
    def method(self) -> str:
        """The method name known failures are matched against: the started engine's method,
        a served impl's method, else the --impl name."""
        if self.launch is not None:
            return self.launch.method.name
        method = getattr(self.impl, "method", None)
        return method.name if method is not None else self.impl.spec


KEY = pytest.StashKey[Session]()


def of(config) -> Session | None:
    return config.stash.get(KEY, None)
