"""What the kit says during a run (starting servers, restarts, the time limit, a started
engine's outcome), past pytest's capture, and the hook a front end takes those lines by
(``python -m properties.serve run`` in Python: properties/serve/run.py; the hook itself:
properties/plugin/hooks.py)."""

from __future__ import annotations


def say(config, text: str) -> None:
    """A line on pytest's terminal, past any capture (a test's output is being captured)."""
    if config.hook.pytest_kit_say(text=text):
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        print(text)
        return
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        tr.write_line(text)
        return
    with capture.global_and_fixture_disabled():
        tr.write_line(text)
