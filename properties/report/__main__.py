"""``python -m properties.report grid RESULTS [OUT]``: the engines' matrix page (grid.py);
``python -m properties.report page DIR``: index.html again from DIR/report.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from properties.report import collect, grid

USAGE = "usage: python -m properties.report grid RESULTS.json [OUT.html] | page DIR"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "grid" and len(argv) <= 3:
        try:
            print(f"engines matrix: {grid.write(argv[1], argv[2] if len(argv) == 3 else None)}")
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if len(argv) == 2 and argv[0] == "page":
        source = Path(argv[1]) / "report.json"
        if not source.is_file():
            print(f"error: DIR={argv[1]}: no report.json there", file=sys.stderr)
            return 2
        print(f"report: {collect.write(Path(argv[1]), json.loads(source.read_text()))}")
        return 0
    print(USAGE, file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
