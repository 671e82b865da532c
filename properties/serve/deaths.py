"""A server that dies is a finding: the request that killed it, replayable, and one finding per
way of dying.

The client hands every failed request (no connection, a timeout, an HTTP 5xx) to its
Watchdog. The watchdog asks whether the server still answers its health path (waiting a few
seconds: an engine often answers 500 first and exits after). A live server means an ordinary
failure (the check reports it). A dead one means a finding: the request's exact JSON body and
a `curl` line that replays it, and the crash's signature (the last error line of the server's
log, numbers blanked), so that a later request that kills the server the same way is the same
finding, not a new one.

ServerDied is a BaseException (as PropertyHang): Hypothesis must not shrink by sending more
requests to a dead server; the test fails at once with the request that killed it.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from properties.adapters.client import curl_line

# How long a server that failed a request is watched for dying (seconds).
GRACE = 8.0


class ServerDied(BaseException):
    """The server died at a request (the message carries it, with a curl line)."""

    def __init__(self, message: str, death: "Death"):
        super().__init__(message)
        self.death = death
        self.cause = death.headline()


_EXCEPTION = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Fault)): (.+)")
_CHATTER = re.compile(r"\b(WARNING|INFO|DEBUG)\b")   # advice and progress, not the crash
# "Worker failed with error '...'": a parent process relaying a worker's exception, which the
# log shows (with its traceback) elsewhere
_WRAPPED = re.compile(r"failed with error '")
_FRAME = re.compile(r'File "([^"]+)", line \d+, in ([\w<>.]+)')
# Python's report of an exception raised in a __del__ or a callback ("Exception ignored in
# <function ...>", then its traceback and exception line): by definition the process went on,
# so it is never the crash (vLLM's EAGLE-3 warm-up prints one, a RecursionError in a oneDNN
# handle's __del__, and then serves)
_IGNORED = re.compile(r"^Exception ignored in\b")
_FATAL = re.compile(r"(?i)\b(abort(ed)?|segmentation fault|core dumped|assert(ion)? failed|"
                    r"terminate called|fatal)\b.*")
# ggml's GGML_ABORT and GGML_ASSERT (llama.cpp) print "SOURCE.cpp:LINE: message" and then a
# backtrace whose frames name ggml_abort, which \babort\b does not match: the message is the
# crash, without the path (machines differ) and the line (versions differ)
_GGML = re.compile(r"^\S+\.(?:c|cc|cpp|h|hpp):\d+: (.+)$")


def signature(log_text: str) -> str:
    """The crash's first exception with a message (the root cause comes first in a log; later
    lines are its consequences, e.g. 'EngineDeadError'), or the first fatal line, without
    numbers (one signature per way of dying)."""
    found, frame = "", ""
    lines = [line for line in log_text.splitlines() if not _CHATTER.search(line)]
    ignoring, after = False, 0    # after: the first line past the last ignored report
    for i, line in enumerate(lines):
        if _IGNORED.search(line):
            ignoring = True     # until its exception line, which is skipped too
            continue
        match = _EXCEPTION.search(line)
        if match and ignoring:
            ignoring, after = False, i + 1
            continue
        if match:
            found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
            if _WRAPPED.search(found):
                continue    # a process reporting another's failure: the root cause comes next
            # the innermost frame of its traceback, if the log has one: where it was raised
            for earlier in reversed(lines[max(after, i - 6):i]):
                where = _FRAME.search(earlier)
                if where:
                    frame = f" in {where.group(1).rsplit('/', 1)[-1]}:{where.group(2)}"
                    break
            break
    if not found:
        for line in lines:
            match = _GGML.search(line.strip()) or _FATAL.search(line)
            if match:
                found = match.group(1) if match.re is _GGML else match.group(0)
                break
    found = re.sub(r"0x[0-9a-fA-F]+|\d+(\.\d+)?", "N", found).strip()
    return (found[:300] + frame) if found else "no error line in the server's log"


@dataclass
class Death:
    url: str
    body: dict
    error: str              # what the client saw (status, reset connection, timeout)
    signature: str          # from the server's log
    log: str | None         # the log file, when the kit started the server
    test: str = ""          # the kit test that sent it
    same_as: int | None = None   # index of the first death of this signature

    def curl(self) -> str:
        return curl_line(self.url, self.body)

    def headline(self) -> str:
        return f"the server died at a request ({self.signature})"

    def as_dict(self) -> dict:
        return {"url": self.url, "body": self.body, "curl": self.curl(), "error": self.error,
                "signature": self.signature, "log": self.log, "test": self.test,
                "same_as": self.same_as}


@dataclass
class Registry:
    """Every death of a run, in order; a death with `same_as` None is a new finding."""

    deaths: list = field(default_factory=list)

    def add(self, death: Death) -> Death:
        for i, earlier in enumerate(self.deaths):
            if earlier.same_as is None and earlier.signature == death.signature:
                death.same_as = i
                break
        self.deaths.append(death)
        return death

    def last(self) -> Death | None:
        return self.deaths[-1] if self.deaths else None


REGISTRY = Registry()


def _answers_health(health_url: str) -> bool:
    try:
        with urllib.request.urlopen(health_url, timeout=5) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Watchdog:
    """Judges failed requests of one client. `server`: a properties.serve.server.Server when
    the kit started it (its process and log are then known), else None (health only)."""

    def __init__(self, health_url: str, server=None, registry: Registry = REGISTRY,
                 grace: float = GRACE):
        self.health_url = health_url
        self.server = server
        self.registry = registry
        self.grace = grace
        self.test = ""
        self.dead = False       # set at a death, cleared when the server is up again
        self.lock = threading.Lock()   # concurrent requests that fail together: one death

    def _alive(self) -> bool:
        if self.server is not None:
            return self.server.alive()
        return _answers_health(self.health_url)

    def examine(self, url: str, body: dict, error: Exception) -> None:
        """Raise ServerDied if the server died at this request; return if it lives."""
        with self.lock:
            self._examine(url, body, error)

    def _examine(self, url: str, body: dict, error: Exception) -> None:
        if self.dead:
            death = self.registry.last()
            raise ServerDied(f"not run: the server died at an earlier request of this test "
                             f"and was not restarted yet\n{death.curl() if death else ''}",
                             death) from None
        deadline = time.monotonic() + self.grace
        while True:
            if not self._alive():
                break
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)
        self.dead = True
        log = str(self.server.log_path) if self.server is not None else None
        sig = signature(self.server.log_tail(400_000)) if self.server is not None else (
            f"no answer at {self.health_url} after {type(error).__name__}")
        death = self.registry.add(Death(url, body, str(error), sig, log, self.test))
        same = ("" if death.same_as is None else
                f"\n(the same way of dying as finding {death.same_as + 1} of this run: one "
                f"finding, not a new one)")
        raise ServerDied(
            f"the server died at this request: {death.headline()}\nrequest: POST {url}\n"
            f"{json.dumps(body, sort_keys=True)}\nreplay: {death.curl()}\nthe client saw: "
            f"{error}\nserver log: {log or 'not kept (the kit did not start the server)'}{same}",
            death) from None
