"""Benchmark plumbing for `pytest --benchmark-only fast/`: side-by-side ratios and their targets.

Each ratio in the issue compares two measurements taken in the same run. A benchmark test
stores its measurement in `figures` (one dict for the session); the test that completes a pair
computes the ratio, saves it in its own `benchmark.extra_info`, and records it here. At the end
of the run the terminal summary lists every ratio against its target, and the JSON written by
--benchmark-json/--benchmark-autosave carries them under "ratios".

Times are the minimum over rounds: on a shared machine the minimum is the measurement least
disturbed by other processes. Under --benchmark-disable (the default in pyproject, so the
normal suite runs each benchmark once as a smoke test) nothing is timed and no ratio recorded.
"""

import pytest
import torch

from fast.testing import one_thread

RATIOS = []


class Figures:
    """Measurements of this session, by name, and the ratios derived from them."""

    def __init__(self):
        self.values = {}

    def seconds(self, benchmark):
        """The minimum time per call of the benchmark just run, or None when not timed."""
        stats = getattr(benchmark, "stats", None)
        return None if stats is None else stats.stats.min

    def put(self, name: str, value) -> None:
        if value is not None:
            self.values[name] = value

    def get(self, name: str):
        return self.values.get(name)

    def ratio(self, benchmark, label: str, value: float | None, target: str | None = None,
              met: bool | None = None, note: str = "") -> None:
        """Record a ratio (None: its counterpart was not measured in this run)."""
        if value is None:
            return
        entry = {"figure": label, "ratio": round(value, 4), "target": target or "(none)",
                 "met": met, "note": note}
        benchmark.extra_info.update({"ratio": entry["ratio"], "target": entry["target"],
                                     "met": met, "note": note})
        RATIOS.append(entry)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """`pytest --benchmark-only fast/` must time: pyproject's addopts carry --benchmark-disable
    (so that the normal suite runs each benchmark once, as a smoke test), and pytest-benchmark
    refuses the two together. Asking for benchmarks only is asking for timings."""
    if config.getoption("benchmark_only", False):
        config.option.benchmark_enable = True


@pytest.fixture(scope="session")
def figures():
    return Figures()


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """The tiny models' ops last microseconds: on a small shared CPU a second intra-op thread
    only adds contention. Both sides of every ratio run under the same setting."""
    if torch.cuda.is_available():
        yield
        return
    with one_thread():
        yield


def pytest_terminal_summary(terminalreporter):
    if not RATIOS:
        return
    terminalreporter.section("speculative decoding ratios (one run, side by side)")
    for entry in RATIOS:
        verdict = {True: "met", False: "MISSED", None: ""}[entry["met"]]
        line = f"{entry['figure']:<58} {entry['ratio']:>9.3f}   target {entry['target']:<10} {verdict}"
        terminalreporter.write_line(line + (f"  ({entry['note']})" if entry["note"] else ""))


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["ratios"] = list(RATIOS)
