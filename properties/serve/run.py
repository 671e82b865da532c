"""A production engine as part of the kit's own run: ``pytest properties/ --engine=NAME
--method=NAME`` (``python -m properties.serve run ENGINE METHOD`` builds those arguments).

`Launch` is the session's servers (properties/session.py): made when the session is
(properties/plugin/served.py), it exports the kit's checkpoints (or a trained pair's), starts
the speculating server and the baseline (the same engine without speculation) on free ports
and waits for their health with a bounded timeout; the served Impl is built from it,
configured. During the run it restarts a server that died at a request (the death is the
finding, reported at that request). When the tests are done it shows that speculation ran
(the engine's own counters), measures the speed-up, and the verdict (properties/verdict.py,
the same function as for any run) is written with its record to the run directory
(result.json, the report, the logs); the servers are stopped when the run ends, also on
Ctrl-C, SIGTERM and usage errors.

Exit status (the verdict's): 0 CONFORMANT, or NOT CONFORMANT with every failure listed as known
in the --known-failures file; 1 NOT CONFORMANT or NOT SHOWN; 2 INCOMPLETE; 3 could not start
(environment missing, unvalidated version, a server that does not come up).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from properties import engines, families
from properties.engines import EngineMissing
from properties.export import heads as head_export
from properties.export import kit as export
from properties.export import trained as trained_export
from properties.methods import HeadDraft
from properties.models import served as served_models
from properties.serve import deaths, speed
from properties.serve.server import LaunchError, Server
from properties.verdict import Outcome

# the repository: the kit's tests and its rootdir (REPO), and where run directories go (ROOT,
# which a test may point elsewhere)
REPO = ROOT = Path(__file__).resolve().parents[2]
MODELS = ("kit", *trained_export.PAIRS)


class SetupError(Exception):
    """The run cannot start (exit 3): the message says why and what to do."""


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@dataclass
class Launch:
    engine: object              # properties.engines.Engine
    method: object              # properties.methods.Method
    version: str
    models: str                 # "kit", or a trained pair (properties/export/trained.py PAIRS)
    run_dir: Path
    spec: Server                # the speculating server
    base: Server                # the baseline: the same engine without speculation
    results: str | None = None
    measure_speed: bool = True
    restarts: list = field(default_factory=list)
    speculation: dict | None = None    # the engine's counters: drafted / accepted / source
    speed: dict | None = None
    trained_result: dict | None = None  # what the served_trained family measured
    record: dict = field(default_factory=dict)
    _sigterm: object = None

    @property
    def trained(self) -> bool:
        return self.models != "kit"

    # ------------------------------------------------------------------ start

    @classmethod
    def start(cls, engine_name: str, method_name: str | None, *, models: str = "kit",
              run_dir=None, results=None, allow_unvalidated: bool = False,
              measure_speed: bool = True, port: int | None = None,
              baseline_port: int | None = None, say=print) -> "Launch":
        """Export, prepare and start both servers; SetupError (nothing left running) when the
        run cannot start."""
        engine, method, env, version = resolve(engine_name, method_name, models,
                                               allow_unvalidated)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        tag = f"-{models}" if models != "kit" else ""      # -trained, -trained-large
        run_dir = Path(run_dir or ROOT / "runs" / f"{engine.name}-{method.name}{tag}-{stamp}")
        run_dir.mkdir(parents=True, exist_ok=True)
        say(f"[kit] {engine.title} {version}, method {method.name} ({method.description}); run "
            f"directory {run_dir}")
        export_dir = run_dir / "export"
        serve_target(method, models)
        if models != "kit":
            trained_export.export(export_dir, method, models)   # the target and this draft
        else:
            export.export(export_dir)
        if isinstance(method.drafter, HeadDraft):   # its head, in the engine's format
            head_export.export(export_dir, method.drafter, models)
        if engine.prepare is not None:
            engine.prepare(env, export_dir, run_dir / "prepare.log")
        spec = Server(f"{engine.name}-{method.name}",
                      lambda p: engine.command(env, export_dir, method, p), run_dir,
                      start_timeout=engine.start_timeout, port=port)
        base = Server(f"{engine.name}-baseline",
                      lambda p: engine.command(env, export_dir, None, p), run_dir,
                      start_timeout=engine.start_timeout, port=baseline_port)
        launch = cls(engine, method, version, models, run_dir, spec, base, results,
                     measure_speed)
        launch._sigterm = signal.signal(signal.SIGTERM, _interrupt)
        launch.record = {"engine": engine.name, "title": engine.title, "version": version,
                         "method": method.name, "method_description": method.description,
                         "method_lossy": method.lossy,
                         # the path judged, for the engines' matrix (properties/report/grid.py)
                         "path": {"drafter": method.drafter.describe(), "k": method.k,
                                  "proposals": method.proposals or getattr(
                                      engine.dialect_for(method), "draft_proposals", None),
                                  "verification": method.verification},
                         "families": [] if launch.trained else list(families.SERVED),
                         "date": time.strftime("%Y-%m-%d"), "run_dir": str(run_dir),
                         "models": models}
        if served_models.served_target() != "target":
            launch.record["target"] = served_models.served_target()
        deaths.REGISTRY.deaths.clear()
        try:
            for server in (base, spec):
                say(f"[kit] starting {server.name} (health within {server.start_timeout:g} s)")
                server.start()
                say(f"[kit] {server.name} answers at {server.url} (log {server.log_path})")
        except (LaunchError, KeyboardInterrupt) as exc:
            launch.stop()
            text = str(exc).splitlines()[0] if str(exc) else "interrupted"
            launch.record.update(verdict="SETUP", verdict_text=text)
            launch._write()
            raise SetupError(str(exc) or "interrupted while starting the servers") from None
        return launch

    def settings(self) -> dict:
        """What the served Impl is built with (properties.adapters.served.make_impl)."""
        return {"engine": self.engine, "method": self.method, "baseline": self.base.url,
                "dialect": self.engine.dialect_for(self.method),
                "baseline_dialect": self.engine.dialect_for(None)}

    def families(self, chosen) -> tuple:
        """The families the run judges: on a trained pair only served_trained has an exact
        answer; on the kit's models the served families (or those chosen of them)."""
        if self.trained:
            return families.SERVED_TRAINED
        return tuple(f for f in (chosen or families.SERVED) if f in families.SERVED)

    # ------------------------------------------------------------------ during the run

    def server_for(self, url: str):
        return {self.spec.url: self.spec, self.base.url: self.base}.get(url)

    def restart(self, server: Server, death, say=print) -> None:
        say(f"[kit] the {server.name} server died at a request of {death.test or 'a test'}"
            f" ({death.signature}); restarting it on port {server.port} (log "
            f"{server.log_path}); the run goes on with the next test")
        server.restart()
        self.restarts.append({"server": server.name, "after": death.test,
                              "signature": death.signature, "log": str(server.log_path)})

    # ------------------------------------------------------------------ after the tests

    def finish(self, session, say=print) -> None:
        """On the servers, after the tests: revive one the last test killed, the evidence that
        speculation ran (the engine's counters), the speed-up."""
        for server in (self.spec, self.base):
            if server.process is not None and not server.alive():
                self.restart(server, deaths.REGISTRY.last() or deaths.Death(
                    server.url, {}, "not answering", "unknown", str(server.log_path)), say)
        prompts = tokens = None
        if self.trained:
            from properties.serve import trained
            t = self.trained_result or {}
            self.speculation = {"drafted": t.get("engine_drafted") or 0,
                                "accepted": t.get("engine_accepted") or 0,
                                "source": "the engine's counters over the trained check's "
                                          "greedy requests"}
            prompts, tokens = trained.prompts(models=self.models), trained.TOKENS
        else:
            self.speculation = speed.evidence(self.engine, self.spec, self.method)
        if self.measure_speed and session.outcomes:
            extra = ({"prompts": prompts, "tokens": tokens, "models": self.models}
                     if prompts else {})
            self.speed = speed.measure(self.engine, self.spec, self.base, say=say,
                                       method=self.method, **extra)

    def report_entry(self) -> dict:
        """What the report page shows of the servers (properties/report/collect.py)."""
        return {k: v for k, v in self.record.items() if k not in ("summary", "known")} | {
            "speculation": self.speculation, "speed": self.speed, "restarts": self.restarts,
            **({"trained": self.trained_result} if self.trained_result else {})}

    def record_outcome(self, session, data: dict) -> None:
        """result.json (and the results file) of the run, from the session's verdict."""
        matched = {n: session.known_matched.get(n, "") for e in data["families"].values()
                   for n in e["known_failures"]}
        self.record.update(
            verdict=data["verdict"], verdict_text=data["verdict_text"],
            summary=_families(data), restarts=self.restarts,
            deaths=[d.as_dict() for d in deaths.REGISTRY.deaths],
            known=[k.__dict__ for k in session.known], known_matched=matched,
            not_known=[{"test": n, "cause": e["causes"].get(n, "")}
                       for e in data["families"].values() for n in e["failures"]],
            speculation=self.speculation)
        if self.speed is not None:
            self.record["speed"] = self.speed
        if self.trained_result is not None:
            self.record["trained"] = self.trained_result
        if session.stopped_by_limit is not None:
            self.record["time_limit"] = {"seconds": session.time_limit,
                                         "reached": len(session.outcomes),
                                         "planned": len(session.planned)}
        if session.report_page is not None:
            self.record["report"] = str(session.report_page)
        self._write()
        if self.results:
            results_append(self.results, self.record)

    def outcome_lines(self, data: dict) -> list[str]:
        """The run's lines before its verdict: deaths, speculation, speed-up, the trained
        pair, and each failure no known entry matches, with its cause (so that a log's tail,
        CI's, says which defect is new)."""
        lines = [f"== {self.engine.name} {self.version} / {self.method.name} =="]
        if self.method.lossy:
            lines.append(f"the engine names this mode lossy: {self.method.lossy}")
        for d in deaths.REGISTRY.deaths:
            tag = "same finding as above" if d.same_as is not None else "FINDING"
            lines.append(f"server death ({tag}) in {d.test}: {d.signature}\n  replay: {d.curl()}")
        s = self.speculation
        if s:
            lines.append(f"speculation: {s.get('drafted', 0):g} tokens drafted, "
                         f"{s.get('accepted', 0):g} accepted ({s.get('source')})")
        if self.speed:
            sp = self.speed
            lines.append(f"speed-up of speculation over the baseline (greedy, one request at a "
                         f"time, alternating, the other server paused): {sp['speedup']:.3f}x "
                         f"({sp['tokens']} tokens per server per turn, {sp['turns']} turns each)")
        if self.trained_result:
            from properties.serve import trained
            lines += trained.describe({"trained": self.trained_result, "models": self.models})
        if data is not None:
            for e in data["families"].values():
                for nodeid in e["failures"]:
                    lines.append(f"not known: {nodeid}: "
                                 f"{e['causes'].get(nodeid) or '(no cause line)'}")
        return lines

    def who(self) -> str:
        return f"{self.engine.name} {self.version} / {self.method.name}"

    def stop(self) -> None:
        for server in (self.spec, self.base):
            server.stop()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def _write(self) -> None:
        (self.run_dir / "result.json").write_text(json.dumps(self.record, indent=2,
                                                             sort_keys=True))


def resolve(engine_name: str, method_name: str | None, models: str = "kit",
            allow_unvalidated: bool = False):
    """(engine, method, environment, version) of a run, or SetupError saying why not."""
    if method_name is None:
        raise SetupError(f"--engine={engine_name}: name its method with --method")
    try:
        engine = engines.get(engine_name)
        method = engine.method(method_name)
    except KeyError as exc:
        raise SetupError(str(exc.args[0])) from None
    if models not in MODELS:
        raise SetupError(f"models={models!r}: choose kit, {' or '.join(trained_export.PAIRS)}")
    # a trained pair: a shape the engine cannot run is refused here, before anything starts,
    # naming the model, its head_dim and the engine
    refused = trained_refusal(engine, method, models) if models != "kit" else (
        f"method {method.name} drafts with {method.drafter.describe()}, which only a trained "
        f"pair has: pass --models trained or --models trained-large"
        if method.drafter.trained_only else None)
    if refused:
        raise SetupError(refused)
    try:
        env = engine.find()
    except EngineMissing as exc:
        raise SetupError(str(exc)) from None
    version = engine.version(env)
    if engine.validated and version not in engine.validated and not allow_unvalidated:
        raise SetupError(f"{engine.title} {version} is not a version the kit's dialect readings "
                         f"were validated against ({', '.join(engine.validated)}): record its "
                         f"responses with `python tests/recorded/capture.py {engine.name}` and "
                         f"run the dialect tests (pytest tests/test_serve_dialects.py), or pass "
                         f"--allow-unvalidated")
    return engine, method, env, version


def trained_refusal(engine, method, models: str = "trained") -> str | None:
    """Why `engine` cannot run `method` on the pair `models` names (a draft it does not have, a
    head size the engine's attention refuses, a pair not made yet), or None."""
    try:
        trained_export.pair_of(models)   # a pair not made yet: said before anything starts
        return trained_export.refusal(engine, method, models)
    except KeyError as exc:
        return str(exc.args[0])
    except FileNotFoundError as exc:    # trained-large before `make models-large`
        return str(exc)


def serve_target(method, models: str = "kit") -> str:
    """Make the served target of this process the one `method`'s drafter is made for (a head
    of a deeper variant, properties/models/served.py VARIANTS; else the kit's own), for the
    export, the oracle and the replays of the run, and forget what was computed from another
    one. Returns its name."""
    from properties import acceptance, oracle
    wanted = getattr(method.drafter, "target", "target") if models == "kit" else "target"
    if served_models.served_target() != wanted:
        served_models.use_target(wanted)
        oracle.clear()
        acceptance._draft_greedy.cache_clear()
    return wanted


def _families(data: dict) -> dict:
    """The record's served families: known failures count among the failures (the engines
    grid marks a family "known" when every failure of it matched an entry)."""
    out = {}
    for family, entry in data["families"].items():
        if not family.startswith("served_"):
            continue
        out[family] = {k: entry.get(k, 0) for k in ("passed", "failed", "not_applicable",
                                                     "not_shown", "xfailed")}
        out[family]["failed"] += entry["xfailed"]
        out[family]["xfailed"] = 0
        out[family]["examples_shown"] = entry.get("examples_shown", [0, 0])
        out[family]["tests"] = {n: (["failed", r] if o == "xfailed" else [o, r])
                                for n, (o, r) in entry.get("tests", {}).items()}
        failures = {n: entry["causes"].get(n, "") for n in entry["failures"]}
        out[family]["failures"] = failures | dict(entry["known_failures"])
        out[family]["reasons"] = entry["reasons"]
    return out


# ---------------------------------------------------------------------- the front end

def arguments(engine_name: str, method_name: str, *, run_dir=None, known_path=None,
              families: str | None = None, allow_unvalidated: bool = False,
              measure_speed: bool = True, port: int | None = None,
              baseline_port: int | None = None, models: str = "kit",
              time_limit: float | None = None, results=None, pytest_args=()) -> list[str]:
    """The pytest command line of `python -m properties.serve run ENGINE METHOD ...`."""
    args = [str(REPO / "properties"), f"--engine={engine_name}", f"--method={method_name}",
            f"--models={models}", "-p", "no:cacheprovider", "-q", "-rfE", f"--rootdir={REPO}",
            "-o", "addopts=--benchmark-disable"]
    for flag, value in (("--kit-families", families), ("--run-dir", run_dir),
                        ("--known-failures", known_path), ("--port", port),
                        ("--baseline-port", baseline_port), ("--time-limit", time_limit),
                        ("--results", results)):
        if value is not None:
            args.append(f"{flag}={value}")
    if allow_unvalidated:
        args.append("--allow-unvalidated")
    if not measure_speed:
        args.append("--no-speed")
    return args + list(pytest_args)


class _Said:
    """The front end's listener: the kit's lines of this run (properties.plugin.kit.say), and
    the session when the run ends."""

    def __init__(self, say):
        self.say, self.session, self.last = say, None, ""

    def pytest_kit_say(self, text):
        self.say(text)
        self.last = text
        return True

    def pytest_unconfigure(self, config):
        from properties import session as sessions
        self.session = sessions.of(config)


def run(engine_name: str, method_name: str, *, say=print, **options) -> Outcome:
    """One launched run from Python (the tests', `make engines`'): its Outcome, its record in
    `outcome.summary`."""
    import pytest
    limit = options.get("time_limit")
    if limit is not None and not limit > 0:
        say(f"error: time_limit={limit!r}: give a number of seconds > 0")
        return Outcome("SETUP", f"time_limit={limit!r}", 3)
    try:
        resolve(engine_name, method_name, options.get("models", "kit"),
                options.get("allow_unvalidated", False))
    except SetupError as exc:       # said at once, before pytest starts
        say(f"error: {exc}")
        return Outcome("SETUP", str(exc), 3)
    listener = _Said(say)
    code = int(pytest.main(arguments(engine_name, method_name, **options),
                           plugins=[listener]))
    launch = getattr(listener.session, "launch", None)
    data = getattr(listener.session, "outcome", None)
    if launch is None or data is None:      # it could not start: its last line says why
        return Outcome("SETUP", listener.last.removeprefix("error: ") or
                       f"the run ended before its verdict (exit {code})", code or 3)
    return Outcome(data["verdict"], data["verdict_text"], data["exit"],
                   known=dict(launch.record.get("known_matched", {})),
                   new=[(d["test"], d["cause"]) for d in launch.record.get("not_known", [])],
                   summary=launch.record)


def main(args) -> int:
    """`python -m properties.serve run`: the pytest run of `arguments`, its exit status."""
    import pytest
    if args.time_limit is not None and not args.time_limit > 0:
        print(f"error: --time-limit={args.time_limit}: give a number of seconds > 0")
        return 3
    return int(pytest.main(arguments(
        args.engine, args.method, run_dir=args.run_dir, known_path=args.known_failures,
        families=args.families, allow_unvalidated=args.allow_unvalidated,
        measure_speed=not args.no_speed, port=args.port, baseline_port=args.baseline_port,
        models=args.models, time_limit=args.time_limit, results=args.results,
        pytest_args=args.pytest_args)))


def results_append(path, record: dict) -> None:
    """Add one run to a results file (JSON) and rewrite its Markdown table beside it."""
    path = Path(path)
    runs = json.loads(path.read_text()) if path.exists() else []
    key = ("engine", "method", "models")   # a trained run sits beside the kit's run
    runs = [r for r in runs if tuple(r.get(k, "kit") for k in key) !=
            tuple(record.get(k, "kit") for k in key)] + [record]
    path.write_text(json.dumps(runs, indent=2, sort_keys=True))
    path.with_suffix(".md").write_text(markdown(runs))


def markdown(runs) -> str:
    served = families.SERVED
    lines = ["| engine | version | method | path | date | " + " | ".join(served) +
             " | speculation shown | accepted / drafted (exact replay) | speed-up | verdict |",
             "|" + " --- |" * (len(served) + 9)]
    from properties.report.grid import acceptance, cell, on_trained_pair, path, shown
    trained = [r for r in runs if on_trained_pair(r)]
    if len(trained) == len(runs):
        lines = []      # trained runs only: their own table below
    for r in runs:
        if on_trained_pair(r):
            continue
        cells = [cell(r, f)[1] for f in served]
        sp = r.get("speed") or {}
        speed = f"{sp['speedup']:.2f}x" if "speedup" in sp else "not measured"
        lines.append(f"| {r['engine']} | {r.get('version', '?')} | {r['method']} | {path(r)} | "
                     f"{r.get('date', '')} | " + " | ".join(cells) +
                     f" | {shown(r)} | {acceptance(r)} | {speed} | {r.get('verdict_text', '')} |")
    if trained:
        # the pair column: the same engine and method give other figures on the other pair
        title = ("The trained pairs (`--models trained`: the committed pair; `--models "
                 "trained-large`: the weight-bound pair; greedy requests on held-out prompts; "
                 "acceptance = accepted / drafted tokens)")
        lines += ([""] if lines else []) + [title, "",
                  "| engine | version | method | pair | date | acceptance: engine | "
                  "acceptance: exact | tokens per target call | speed-up | verdict |",
                  "|" + " --- |" * 10]
        for r in trained:
            t, sp = r.get("trained") or {}, r.get("speed") or {}
            lines.append(f"| {r['engine']} | {r.get('version', '?')} | {r['method']} | "
                         f"{r['models']} | {r.get('date', '')} | {_ratio(t, 'engine')} | "
                         f"{_ratio(t, 'exact')} | "
                         f"{_number(t.get('tokens_per_target_call'))} | "
                         f"{_number(sp.get('speedup'), 'x')} | {r.get('verdict_text', '')} |")
    return "\n".join(lines) + "\n"


def _ratio(t: dict, who: str) -> str:
    d, a = t.get(f"{who}_drafted"), t.get(f"{who}_accepted")
    return "-" if d is None or a is None else f"{a:g} / {d:g}" + (f" ({a / d:.3f})" if d else "")


def _number(x, unit: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"

