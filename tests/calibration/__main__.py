"""``python -m tests.calibration run|power|summary ...``: the kit's stated error rates,
measured (CONFORMANCE.md, "Calibration"; ``make calibration RUNS=N``).

    run      RUNS runs of every statistical family on its correct implementations
    power    RUNS runs on implementations deviating by the design TV (and fractions of it)
    summary  the table, the QQ pictures and summary.json from OUT/runs.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.calibration import collect, deviate, engines, runner


def _families(text: str, allowed) -> list[str]:
    names = [f for f in text.split(",") if f]
    bad = [f for f in names if f not in allowed]
    if bad:
        raise SystemExit(f"--families: unknown {bad}; choose from {sorted(allowed)}")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.calibration")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "power"):
        p = sub.add_parser(name)
        p.add_argument("--runs", type=int, required=True)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--workers", type=int, default=2)
        p.add_argument("--minutes", type=float, default=None,
                       help="stop starting runs after this long (what finished is kept)")
        p.add_argument("--families", default=None)
        p.add_argument("--impls", default=None, help="comma-separated: run: only these of each family's correct implementations; "
                            "power: the implementations to deviate")
        p.add_argument("--tests", default=None,
                       help="comma-separated test names: only these tests of the families")
        if name == "power":
            p.add_argument("--fractions", default=None,
                           help="the deviations run, as fractions of each family's design TV "
                                f"(default {','.join(map(str, deviate.FRACTIONS))}; batched "
                                f"{','.join(map(str, deviate.FAMILY_FRACTIONS['batched']))})")
    s = sub.add_parser("summary")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--docs", type=Path, default=None, help="also write the pictures here")
    args = parser.parse_args(argv)
    if args.command == "summary":
        from tests.calibration import summary
        print(summary.write(args.out, args.docs))
        return 0
    if args.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {args.runs}")
    long_names = {v: k for k, v in engines.SHORT.items()}     # "own-sampler" -> its spec
    impls = [long_names.get(i, i) for i in args.impls.split(",")] if args.impls else None
    only = tuple(args.tests.split(",")) if args.tests else None
    if args.command == "run":
        families = _families(args.families or ",".join(collect.MODULES), collect.MODULES)
        task_list = runner.tasks(families, args.runs, args.seed, "null", impls=impls,
                                 tests=only)
    else:
        families = _families(args.families or ",".join(engines.POWER_IMPL), engines.POWER_IMPL)
        try:
            fractions = tuple(float(f) for f in args.fractions.split(",")) if args.fractions \
                else None
        except ValueError:
            raise SystemExit(f"--fractions: comma-separated numbers, got {args.fractions!r}")
        if fractions and not all(0 < f <= 1 for f in fractions):
            raise SystemExit(f"--fractions must lie in (0, 1], got {args.fractions!r}")
        task_list = []
        for family in families:
            task_list += runner.tasks([family], args.runs, args.seed, "power",
                                      deltas=deviate.deltas(family, fractions),
                                      impls=impls or [engines.POWER_IMPL[family]],
                                      tests=only or deviate.POWER_TESTS.get(family))
        task_list.sort(key=lambda t: t["seed"])
    runner.run(task_list, args.out, args.workers, args.minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
