"""Progress of a long kit run: a line per family now and then, in the terminal.

Two sources, both cheap. When a test ends, its family's line counts examples (each Hypothesis
test plans max_examples plus its explicit examples, a plain test one) done of those planned,
with the rate so far and the time left at that rate. While one test runs long (a statistical
example is thousands of engine calls), a ticker thread says how many engine calls it has made,
at what rate, and how many the current example's sample plan asks for. Quiet under ``-q`` and on
xdist workers (the controller speaks for them, at test granularity: calls made inside a worker
are not visible to it while the test runs).
"""

from __future__ import annotations

import threading
import time

EVERY = 30.0     # seconds between two lines of one family, and between two ticker lines

# The sample plan of the example in progress: calls it asks for; plans made in this process
# (a statistical example makes one plan, so the count tells examples apart).
planned_calls = 0
plans_made = 0


def planned(n: int) -> None:
    """statistics.plan made a plan of n samples (one per statistical example)."""
    global planned_calls, plans_made
    planned_calls, plans_made = int(n), plans_made + 1


def planned_examples(item) -> int:
    """How many examples a test runs at most: Hypothesis's max_examples plus its explicit
    @example cases (a test that is not a Hypothesis test is one example)."""
    test = getattr(item, "obj", None)
    settings = getattr(test, "_hypothesis_internal_use_settings", None)
    if settings is None:
        return 1
    return int(settings.max_examples) + len(getattr(test, "hypothesis_explicit_examples", ()))


def quiet(config) -> bool:
    return (getattr(config.option, "verbose", 0) < 0 or hasattr(config, "workerinput")
            or config.pluginmanager.get_plugin("terminalreporter") is None)


def family_line(family: str, done: int, planned: int, tests_done: int, tests: int,
                elapsed: float, calls: int) -> str:
    rate = done / elapsed if elapsed > 0 else 0.0
    left = (planned - done) / rate if rate > 0 else 0.0
    text = (f"[kit] {family}: {done}/{planned} examples ({tests_done}/{tests} tests) in "
            f"{elapsed:.0f} s, {rate:.2f} examples/s, {calls:,} engine calls so far in the run")
    return text + (f"; about {left:.0f} s left in this family" if done < planned else "; done")


class Ticker:
    """While a test runs longer than EVERY, a line every EVERY seconds: its engine calls so far
    and the current example's plan. Runs only in a process that makes the calls itself."""

    def __init__(self, write, calls_now):
        self.write, self.calls_now = write, calls_now
        self.test = None            # (nodeid, family, start time, calls at start)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kit-progress", daemon=True)
        self.thread.start()

    def begin(self, nodeid: str, family: str, examples: int = 1) -> None:
        self.test = (nodeid, family, time.monotonic(), self.calls_now(), plans_made, examples)

    def end(self) -> None:
        self.test = None

    def stop(self) -> None:
        self.stop_event.set()

    def _run(self) -> None:
        while not self.stop_event.wait(EVERY):
            test = self.test
            if test is None:
                continue
            nodeid, family, start, calls, plans, examples = test
            elapsed = time.monotonic() - start
            if elapsed < EVERY:
                continue
            made = self.calls_now() - calls
            started = plans_made - plans
            plan = (f"; example {started} of at most {examples}, whose sample plan asks for "
                    f"{planned_calls:,} runs" if started else "")
            self.write(f"[kit] {family}: {nodeid.split('::', 1)[-1]} running for "
                       f"{elapsed:.0f} s, {made:,} engine calls ({made / elapsed:.0f}/s){plan}")
