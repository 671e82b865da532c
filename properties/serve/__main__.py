"""``python -m properties.serve export DIR``: write the served models, print the recipes.

``python -m properties.serve recipes DIR`` prints the recipes for an existing export.
"""

from __future__ import annotations

import argparse
import sys

from properties.serve import export, models, recipes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m properties.serve",
                                     description="the kit's served models and how to serve them")
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("export", help="write the served models as HF directories "
                                               "into DIR and print the serving commands")
    write.add_argument("directory", metavar="DIR")
    show = commands.add_parser("recipes", help="print the serving commands for DIR")
    show.add_argument("directory", metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "export":
        try:
            paths = export.export(args.directory)
        except OSError as exc:
            print(f"error: cannot write DIR={args.directory!r}: {exc}", file=sys.stderr)
            return 2
        for name, path in paths.items():
            print(f"# {name}: {path}  ({models.MODELS[name]})")
        print()
    print(recipes.describe(args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
