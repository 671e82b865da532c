"""The known-failures files the project ships (tests/known/): every entry parses as the kit
reads it (properties/known.py: six fields, a cause regex that names its own defect, a
confirming run) and points at a reproduction this repository holds, so that an entry is never
a claim without its evidence."""

from pathlib import Path

import pytest

from properties import known

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "tests" / "known").glob("*.txt"))


def entries(path: Path):
    """(line number, entry) of every entry, whatever its version and method."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            version, method = (p.strip() for p in line.split(" | ")[:2])
            out.append((number, known.read(path, version, method)))
    return out


def test_there_are_known_failure_files():
    assert {p.name for p in FILES} >= {"vllm.txt", "llamacpp.txt", "transformers.txt"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_entry_parses_and_names_a_reproduction_that_exists(path):
    listed = entries(path)
    for number, applying in listed:
        assert applying, f"{path.name}:{number}: the entry does not apply to its own version/method"
        for entry in applying:
            script = entry.script.split()[0]
            assert (ROOT / script).is_file(), (
                f"{path.name}:{number}: the reproduction {script!r} is not in the repository")
