"""The kit's own pytest hooks, for programs that run the kit with ``pytest.main(args,
plugins=[obj])`` and implement them on `obj`:

    pytest_kit_say(text)   a line the kit says during a run (starting servers, restarts, the
                           time limit); a front end that shows the lines itself takes them
                           (``python -m properties.serve run``: properties/serve/run.py)
    pytest_kit_impl(config)
                           the implementation under test, built by the calling program (an
                           properties.impl.Impl it holds: a deviating copy of an engine, a
                           server it started); the kit judges it instead of resolving --impl
                           (the calibration runs the kit so: tests/calibration/collect.py)
"""

from __future__ import annotations

import pytest


class Hooks:
    @pytest.hookspec(firstresult=True)
    def pytest_kit_say(self, text):
        """A line the kit says during a run; return True where it was taken."""

    @pytest.hookspec(firstresult=True)
    def pytest_kit_impl(self, config):
        """The implementation under test (a properties.impl.Impl), or None: --impl decides."""


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(Hooks)
