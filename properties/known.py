"""Known failures: one format for every way the kit is run (``--known-failures=FILE``).

An entry names one defect of one implementation, so that a run whose only failures are known
still says NOT CONFORMANT but exits 0, and a new defect, even in the same test, is never
counted as an old one. Each entry is one line, six fields separated by " | " ('#' starts a
comment line):

    VERSION | METHOD | TEST ID | CAUSE REGEX | REPRODUCTION | CONFIRMED BY (date, run)

VERSION     the engine's version, or * (an implementation without one: --impl=NAME)
METHOD      the speculative method (the launcher's METHOD), the --impl name, or *
TEST ID     a node id, optionally without its [parameters]
CAUSE REGEX searched in the failure's cause line: the defect's own signature (a crash's
            exception and frame, the outcome pattern its reproduction shows), never the kit's
            generic wording alone (refused: it would hide a new defect of the same kind)
REPRODUCTION the standalone script (or document section) that shows the defect
CONFIRMED BY the run that confirmed the entry (date, version)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIELDS = "VERSION | METHOD | TEST ID | CAUSE REGEX | REPRODUCTION | CONFIRMED BY (date, run)"

# The kit's own words for a kind of failure. An entry whose cause pattern matches one of them
# by itself would also match any new defect of that kind: it must name the defect's signature.
GENERIC_CAUSES = (
    "speculation changes the law", "the server ignores `seed`",
    "position 0: token 5 has probability 0 under the sampler (top_k=0, top_p=1.0)",
    "the server died at a request (RuntimeError: something)",
    "server died at a request (ValueError: x)", "the server failed a request: HTTP 500",
    "the outputs are not distributed as the target's sampling",
)


@dataclass(frozen=True)
class KnownFailure:
    version: str
    method: str
    test: str
    pattern: str
    script: str
    confirmed: str

    def matches(self, nodeid: str, cause: str) -> bool:
        return (nodeid == self.test or nodeid.split("[", 1)[0] == self.test) and bool(
            re.search(self.pattern, cause or ""))

    def applies(self, version: str, method: str) -> bool:
        return self.version in (version, "*") and self.method in (method, "*")


def read(path, version: str = "*", method: str = "*") -> list[KnownFailure]:
    """The entries of a known-failures file that apply to `version` and `method`; a malformed
    line is a ValueError naming the file, the line and what is wrong."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--known-failures={path}: no such file")
    entries = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        text = "" if line.lstrip().startswith("#") else line.strip()
        if not text:
            continue
        parts = [p.strip() for p in text.split(" | ")]   # a regex may hold "|" itself
        if len(parts) != 6:
            raise ValueError(f"{path}:{number}: expected '{FIELDS}', got {line!r}")
        entry = KnownFailure(*parts)
        try:
            generic = [g for g in GENERIC_CAUSES if re.search(entry.pattern, g)]
        except re.error as exc:
            raise ValueError(f"{path}:{number}: cause regex {entry.pattern!r}: {exc}") from None
        if generic:
            raise ValueError(f"{path}:{number}: cause regex {entry.pattern!r} matches the kit's "
                             f"generic wording {generic[0]!r}: name the defect's own signature "
                             f"(the crash's exception and frame, or the outcome pattern its "
                             f"reproduction shows), so that a new defect is never counted as "
                             f"this one")
        if not entry.confirmed:
            raise ValueError(f"{path}:{number}: name the run that confirmed the entry (date, "
                             f"version)")
        if entry.applies(version, method):
            entries.append(entry)
    return entries


def match(entries, nodeid: str, cause: str) -> KnownFailure | None:
    return next((k for k in entries if k.matches(nodeid, cause)), None)
