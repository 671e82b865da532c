"""The pytest side of the report: the directory's check before the run, each test's records
and outcome as they arrive (on the xdist controller too), and the JSON the page is built from.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

MESSAGE_CHARS = 8000     # a failure's message kept for the page (they are rarely longer)
REPLAY_PREFIXES = ("python -m properties.replay", "python -m pytest")


def prepare(path: str) -> Path:
    """The report directory, created and shown to be writable now: a typo or a read-only
    folder is a usage error before any test runs, not a lost report after them."""
    folder = Path(path)
    probe = folder / ".kit-report-probe"
    try:
        if folder.exists() and not folder.is_dir():
            raise OSError(f"{folder} exists and is not a directory")
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise pytest.UsageError(f"--kit-report={path}: cannot write the report there "
                                f"({exc.strerror or exc})") from None
    return folder


def outcome_entry(report, family: str, outcome: str, reason: str) -> dict:
    """What the page shows of one test: its outcome, why it did not apply, or its failure's
    message with the lines that replay it."""
    entry = {"family": family, "outcome": outcome, "reason": reason,
             "seconds": round(float(getattr(report, "duration", 0.0)), 3)}
    if outcome in ("failed", "xfailed", "xpassed"):
        crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
        text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
        entry["message"] = text[:MESSAGE_CHARS]
        entry["replay"] = [line.strip() for line in text.splitlines()
                           if line.strip().startswith(REPLAY_PREFIXES)][:4]
    if outcome == "xfailed":
        entry["reason"] = getattr(report, "wasxfail", "") or reason
    return entry


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def seed_text(config) -> str:
    """How this run's examples were drawn, so that a reader can draw them again."""
    from hypothesis import settings
    seed = config.getoption("hypothesis_seed", None)
    if seed is not None:
        return f"--hypothesis-seed={seed}"
    try:
        derandomized = settings.get_profile(settings.get_current_profile_name()).derandomize
    except Exception:   # an unknown profile name: Hypothesis itself reports that
        derandomized = False
    if derandomized:
        return "derandomized (the profile draws the same examples on every run)"
    return ("random (Hypothesis's default; each failure below carries its own replay line, "
            "and the example database replays it first)")


def header(config, session, summary: dict, verdict_line: str) -> dict:
    from properties import profiles
    names = ("torch", "numpy", "scipy", "hypothesis", "pytest", "matplotlib",
             "speculative-conformance")
    versions = {"python": platform.python_version()}
    versions.update({n: v for n in names if (v := _version(n))})
    commit = _commit(Path(config.rootpath))
    if commit:
        versions["kit commit"] = commit
    return {"impl": summary["impl"], "description": summary["description"],
            "versions": versions, "profile": profiles.current(), "seed": seed_text(config),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(session.started_wall)),
            "seconds": round(time.monotonic() - session.started, 1),
            "verdict": summary["verdict"], "verdict_line": verdict_line,
            "command": " ".join([os.path.basename(sys.executable), "-m", "pytest",
                                 *config.invocation_params.args])}


def build(config, session, summary: dict, verdict_line: str) -> dict:
    """The page's data; a run whose engine the kit started adds what was measured on its
    servers after the tests (the evidence that speculation ran, the speed-up)."""
    tests = {}
    for nodeid, entry in sorted(session.report_tests.items()):
        entry = dict(entry)
        entry["evidence"] = session.evidence.get(nodeid, [])
        tests[nodeid] = entry
    data = {"header": header(config, session, summary, verdict_line), "summary": summary,
            "tests": tests}
    if session.launch is not None:
        data["served"] = session.launch.report_entry()
    return data


def write(folder: Path, data: dict) -> Path:
    """report.json and index.html in `folder`; returns the page's path."""
    from properties.report import page
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    index = folder / "index.html"
    index.write_text(page.render(data))
    return index
