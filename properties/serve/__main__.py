"""``python -m properties.serve export DIR``: write the served models, print the recipes
(``--models trained`` or ``--models trained-large``: a trained pair instead, the committed one or
the weight-bound one of `make models-large`).

``python -m properties.serve recipes DIR`` prints the recipes for an existing export.

``python -m properties.serve methods [ENGINE ...]`` lists ENGINE:METHOD for every method the
engines declare that runs on the kit's models here, then ENGINE:METHOD:PAIR for every trained pair
a method declares (`Method.pairs`; the trained check and its speed-up): what ``make engines``
runs; ``--all`` lists every method and pair, saying why one is left out (a trained pair's only,
refused on this machine, a head size the engine refuses).
"""

from __future__ import annotations

import argparse
import sys

from properties import engines
from properties.export import kit as export
from properties.export import recipes
from properties.export import trained as trained_export
from properties.models import served as models


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m properties.serve",
                                     description="the kit's served models and how to serve them")
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("export", help="write the served models as HF directories "
                                               "into DIR and print the serving commands")
    write.add_argument("directory", metavar="DIR")
    write.add_argument("--models", choices=("kit", *trained_export.PAIRS), default="kit",
                       help="kit: the kit's exact-vocabulary models (every served check); "
                            "trained: the committed trained pair (speed and acceptance on "
                            "models where speculation pays); trained-large: the weight-bound "
                            "trained pair (reference/trained-large, made by `make models-large`)")
    show = commands.add_parser("recipes", help="print the serving commands for DIR")
    show.add_argument("directory", metavar="DIR")
    go = commands.add_parser("run", help="start ENGINE with METHOD and its baseline, judge "
                                         "them, stop them: the same run as `pytest properties/ "
                                         "--engine=ENGINE --method=METHOD`")
    go.add_argument("engine", help=f"one of {', '.join(engines.ENGINES)} (properties/engines/)")
    go.add_argument("method", help="e.g. draft-early-exit, draft-random, perfect-draft, ngram")
    go.add_argument("--known-failures", metavar="FILE", default=None,
                    help="known failures (tests/known/ENGINE.txt): a run whose only "
                         "failures are listed there exits 0 (still NOT CONFORMANT)")
    go.add_argument("--run-dir", default=None, help="where the logs, export and results go "
                                                   "(default runs/ENGINE-METHOD-TIME)")
    go.add_argument("--results", default=None, metavar="FILE.json",
                    help="add this run to a results file (and its .md table)")
    go.add_argument("--families", default=None, help="served families to run (comma list)")
    go.add_argument("--allow-unvalidated", action="store_true",
                    help="run on an engine version the kit's dialects were not recorded from")
    go.add_argument("--no-speed", action="store_true", help="skip the speed-up measurement")
    go.add_argument("--models", choices=("kit", *trained_export.PAIRS), default="kit",
                    help="kit: the kit's models and its served families; trained: the committed "
                         "trained pair, checked on greedy output and exact acceptance, with the "
                         "speed-up (properties/serve/trained.py); trained-large: the same on the "
                         "weight-bound pair (`make models-large`), where the target's weights "
                         "make speculation pay")
    go.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="start no test after SECONDS of tests: the run ends with the tests "
                         "reached, INCOMPLETE (or NOT CONFORMANT on what was reached), and says "
                         "how many of how many it reached")
    go.add_argument("--port", type=int, default=None,
                    help="port of the speculating server (default: a free one)")
    go.add_argument("--baseline-port", type=int, default=None,
                    help="port of the baseline server (default: a free one); after a lone "
                         "--, more pytest options")
    listing = commands.add_parser("methods", help="ENGINE:METHOD of every method that runs on "
                                                  "the kit's models here (make engines)")
    listing.add_argument("engines", nargs="*", metavar="ENGINE",
                         help=f"engines to list (default: {', '.join(engines.ENGINES)})")
    listing.add_argument("--all", action="store_true",
                         help="every declared method, one per line, with why one is left out")
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "--" goes to pytest as it is (argparse would take options from it)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)
    args.pytest_args = extra
    if args.command == "run":
        from properties.serve import run
        return run.main(args)
    if args.command == "methods":
        return list_methods(args.engines or list(engines.ENGINES), args.all)
    if args.command == "export":
        trained = args.models in trained_export.PAIRS
        if trained:
            # a pair whose directory is missing (a checkout without reference/trained-large)
            # is no fault of DIR: said apart, with the make target that makes it
            try:
                trained_export.pair_of(args.models)
            except FileNotFoundError as exc:
                print(f"error: --models {args.models}: {exc}", file=sys.stderr)
                return 2
        try:
            paths = (trained_export.export(args.directory, models=args.models) if trained
                     else export.export(args.directory))
        except (OSError, FileNotFoundError) as exc:
            print(f"error: cannot write DIR={args.directory!r}: {exc}", file=sys.stderr)
            return 2
        described = trained_export.DESCRIPTIONS[args.models] if trained else models.MODELS
        for name, path in paths.items():
            print(f"# {name}: {path}  ({described[name]})")
        if not trained:   # the served heads the engines' head methods load
            from properties.export import heads
            for name, path in heads.export_declared(args.directory).items():
                print(f"# {name}: {path}  (a feature-level head, in its engine's format)")
        print()
        if trained:
            print(recipes.describe_trained(args.directory, args.models))
            return 0
    print(recipes.describe(args.directory))
    return 0


def left_out(method) -> str | None:
    """Why `make engines` does not run this method on the kit's models, or None."""
    if method.drafter.trained_only:
        return f"a trained pair's only (--models {' or '.join(method.pairs)})"
    if method.refused:
        return f"refused on this machine: {method.refused}"
    return None


def left_out_on(engine, method, pair: str) -> str | None:
    """Why `make engines` does not run this method on the trained pair `pair` it declares, or
    None: the refusal the launcher would give before any server starts (a head size the
    engine's attention refuses, a pair not made in this checkout), or the engine's own."""
    if method.refused:
        return f"refused on this machine: {method.refused}"
    from properties.serve.run import trained_refusal
    return trained_refusal(engine, method, pair)


def list_methods(names: list, every: bool) -> int:
    """ENGINE:METHOD for a run on the kit's models, ENGINE:METHOD:PAIR for one on a trained
    pair the method declares (Method.pairs): what `make engines` runs, in that order."""
    unknown = [n for n in names if n not in engines.ENGINES]
    if unknown:
        print(f"error: ENGINE={unknown[0]!r}: choose from {', '.join(engines.ENGINES)}",
              file=sys.stderr)
        return 2
    runs, trained_runs = [], []
    for name in names:
        try:
            engine = engines.get(name)
        except engines.EngineNotHere as exc:      # the fake engine outside a checkout
            print(f"# {name}: {exc}", file=sys.stderr)
            continue
        for method in engine.methods.values():
            why = left_out(method)
            if every:
                print(f"{name}:{method.name}  {method.description}"
                      + (f"  [left out: {why}]" if why else ""))
            elif why is None and engine.runnable:
                runs.append(f"{name}:{method.name}")
            for pair in method.pairs:
                why = left_out_on(engine, method, pair)
                if every:
                    print(f"{name}:{method.name}:{pair}  on the {pair} pair"
                          + (f"  [left out: {why}]" if why else ""))
                elif why is None and engine.runnable:
                    trained_runs.append(f"{name}:{method.name}:{pair}")
    if not every:
        print(" ".join(runs + trained_runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
