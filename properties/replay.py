"""Rerun one example of one property, exactly as a failure message printed it.

    python -m properties.replay --impl=SPEC MODULE:CHECK "CASE"

MODULE:CHECK names a check function of the kit (e.g. properties.checks.greedy:check_equivalence)
and CASE is the printed case (e.g. "EngineCase(target=TableSpec(...), ...)"). Exit status 0 if
the property holds on that example, 1 if it is violated (the message is printed), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import torch

from properties.cases import namespace
from properties import guards
from properties.harness import PropertyFailure, PropertyHang
from properties.impl import ImplError, load


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m properties.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--kit-timeout", type=float, default=guards.TIMEOUT, metavar="SECONDS",
                        help="time limit of each call into the implementation (0: none)")
    parser.add_argument("check", help="MODULE:FUNCTION, e.g. properties.checks.rule:check_rule")
    parser.add_argument("case", help="the case, as printed in the failure message")
    args = parser.parse_args(argv)
    try:
        impl = load(args.impl)
    except ImplError as exc:
        print(exc, file=sys.stderr)
        return 2
    module_name, _, function = args.check.partition(":")
    try:
        check = getattr(importlib.import_module(module_name), function)
        case = eval(args.case, {"__builtins__": {}}, namespace())  # the kit's own dataclasses
    except Exception as exc:
        print(f"cannot set up the replay: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    try:
        guards.set_timeout(args.kit_timeout)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        check(impl, case)
    except (PropertyFailure, PropertyHang) as exc:
        print(exc)
        return 1
    except BaseException as exc:  # pytest.skip and friends
        if type(exc).__name__ == "Skipped":
            print(f"not applicable: {exc}")
            return 0
        raise
    print(f"{args.check} holds for --impl={args.impl} on {case!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
