"""``python -m properties.serve run ENGINE METHOD``: the kit starts a production engine and
judges it.

It exports the kit's checkpoints, starts the speculating server and the baseline server (the
same engine without speculation) on free ports, waits for their health with a bounded
timeout, runs the served families against them (in this process: the Launcher plugin hands the
checks the Engine object, its method and the servers, restarts a server that dies between
tests, reported at the request that killed it, and takes the kit's summary back), shows that
speculation ran (the engine's own counters), measures the speed-up, stops both servers (also
on Ctrl-C and on failure) and keeps their logs in the run directory.

Exit status: 0 CONFORMANT, or NOT CONFORMANT with every failure listed as known in the
--known-failures file given; 1 NOT CONFORMANT; 2 INCOMPLETE; 3 could not start (environment
missing, unvalidated version, a server that does not come up).
"""

from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from properties.report import collect
from properties import engines
from properties.export import kit as export
from properties.export import trained as trained_export
from properties.serve import deaths, speed
from properties.engines import EngineMissing
from properties.serve.server import LaunchError, Server

SERVED_FAMILIES = ("served_greedy,served_sequence,served_bounds,served_perfect_draft,served_batch,"
                   "served_params,served_acceptance")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Known:
    """One known failure: engine version, method, the failing test, the defect's signature
    (a regex on the failure's cause), the standalone script that reproduces it, and the run
    that confirmed it (date, version)."""

    version: str
    method: str
    test: str
    pattern: str
    script: str
    confirmed: str

    def matches(self, nodeid: str, cause: str) -> bool:
        return (nodeid == self.test or nodeid.split("[", 1)[0] == self.test) and bool(
            re.search(self.pattern, cause or ""))


# The kit's own words for a kind of failure. An entry whose cause pattern matches one of them
# by itself would also match any new defect of that kind: it must name the defect's signature
# (the crash's exception and frame; the outcome pattern its reproduction shows) instead.
GENERIC_CAUSES = (
    "speculation changes the law", "the server ignores `seed`",
    "position 0: token 5 has probability 0 under the sampler (top_k=0, top_p=1.0)",
    "the server died at a request (RuntimeError: something)",
    "server died at a request (ValueError: x)", "the server failed a request: HTTP 500",
    "the outputs are not distributed as the target's sampling",
)

FIELDS = "VERSION | METHOD | TEST ID | CAUSE REGEX | SCRIPT | CONFIRMED BY (date, run)"


def read_known(path, version: str, method: str) -> list[Known]:
    """The entries of a known-failures file for this engine version and method.

    Each entry is one line: VERSION | METHOD | TEST ID | CAUSE REGEX | SCRIPT | CONFIRMED,
    the fields separated by " | " ('#' starts a comment line). A cause regex that matches the
    kit's generic wording alone is refused (it would hide a new defect of the same kind)."""
    entries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = "" if line.lstrip().startswith("#") else line.strip()
        if not text:
            continue
        parts = [p.strip() for p in text.split(" | ")]   # a regex may hold "|" itself
        if len(parts) != 6:
            raise ValueError(f"{path}:{number}: expected '{FIELDS}', got {line!r}")
        entry = Known(*parts)
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
        if entry.version in (version, "*") and entry.method in (method, "*"):
            entries.append(entry)
    return entries


class Launcher:
    """The pytest plugin of a run. It hands the served plugin the engine object, its method
    and the servers in this process (`served()`: no command-line round trip), restarts a
    server that died before the next test, saying so, and takes the kit's summary when the
    session ends (`summary`)."""

    def __init__(self, engine, method, spec: Server, base: Server, say,
                 time_limit: float | None = None):
        self.engine, self.method = engine, method
        self.spec, self.base = spec, base
        self.servers = {spec.url: spec, base.url: base}     # url -> Server
        self.say = say
        self.restarts = []
        self.summary = None             # the kit's conformance summary, once the session ends
        # --time-limit: no test starts after the deadline; the tests not reached leave the
        # run INCOMPLETE (or NOT CONFORMANT on what was reached), never CONFORMANT
        self.deadline = None if time_limit is None else time.monotonic() + time_limit
        self.time_limit, self.stopped_by_limit = time_limit, False

    def pytest_sessionstart(self, session):
        self.session = session

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.deadline is not None and time.monotonic() > self.deadline and not self.stopped_by_limit:
            self.stopped_by_limit = True
            self.session.shouldstop = (f"the run's time limit ({self.time_limit:g} s) was reached "
                                       f"after {nodeid}")
            self._say(f"[kit] time limit of {self.time_limit:g} s reached after {nodeid}: no "
                      f"further test starts; the tests not reached leave the run incomplete")

    def served(self) -> dict:
        """The served plugin's settings (properties.plugin.served.options), from the engine."""
        return {"engine": self.engine, "baseline": self.base.url,
                "dialect": self.engine.dialect_for(self.method),
                "baseline_dialect": self.engine.dialect_for(None),
                "draft": self.method.draft, "k": self.method.k}

    def pytest_unconfigure(self, config):
        self.summary = getattr(config, "_kit_summary", None)

    def pytest_configure(self, config):
        self.config = config

    def _say(self, text: str) -> None:
        """Through pytest's terminal (not captured by a test), else as the run speaks."""
        config = getattr(self, "config", None)
        tr = config.pluginmanager.get_plugin("terminalreporter") if config else None
        capture = config.pluginmanager.get_plugin("capturemanager") if config else None
        if tr is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                tr.write_line(text)
        else:
            self.say(text)

    def server_for(self, url: str):
        return self.servers.get(url)

    def restart(self, server: Server, death) -> None:
        self._say(f"[kit] the {server.name} server died at a request of {death.test or 'a test'}"
                 f" ({death.signature}); restarting it on port {server.port} (log "
                 f"{server.log_path}); the run goes on with the next test")
        server.restart()
        self.restarts.append({"server": server.name, "after": death.test,
                              "signature": death.signature, "log": str(server.log_path)})


@dataclass
class Outcome:
    verdict: str
    text: str
    exit: int
    summary: dict = field(default_factory=dict)
    known: dict = field(default_factory=dict)   # failing test id -> the entry's script
    new: list = field(default_factory=list)     # (test id, cause) of failures no entry matches


def judge(summary: dict, known: list[Known], known_given: bool, speculation: dict) -> Outcome:
    """The run's verdict from the kit's summary, the known failures and the evidence that
    speculation ran. Known failures never make a run CONFORMANT."""
    failures = [(nodeid, entry["causes"].get(nodeid, ""))
                for entry in summary["families"].values() for nodeid in entry["failures"]]
    new = [(n, c) for n, c in failures if not any(k.matches(n, c) for k in known)]
    old = [(n, c) for n, c in failures if (n, c) not in new]
    matched = {n: next(k.script for k in known if k.matches(n, c)) for n, c in old}
    # the engine's counters over greedy requests, or the kit's own evidence per check (an
    # engine without counters: the replay of its lookup drafter, properties/speculation.py)
    ran = speculation.get("drafted", 0) > 0 or any(
        e.get("examples_shown", [0, 0])[1] > 0 for e in summary["families"].values())
    if summary["verdict"] == "INCOMPLETE" and not failures:
        return Outcome("INCOMPLETE", summary["verdict_text"], 2)
    if new:
        return Outcome("NOT CONFORMANT", f"NOT CONFORMANT: {len(new)} failure(s) not known"
                       + (f", {len(old)} known" if old else ""), 1, known=matched, new=new)
    if old:
        text = (f"NOT CONFORMANT (all failures known: {len(old)}, listed in the known-failures "
                f"file)")
        return Outcome("NOT CONFORMANT", text, 0 if known_given else 1, known=matched)
    if summary["verdict"] == "NOT SHOWN":
        return Outcome("NOT SHOWN", summary["verdict_text"], 1)
    if summary["verdict"] != "CONFORMANT":
        return Outcome(summary["verdict"], summary["verdict_text"], 2)
    if not ran:
        return Outcome("NOT SHOWN", "no failure, but speculation was not shown to have run "
                                    "(the engine's counters show no drafted token)", 1)
    return Outcome("CONFORMANT", "CONFORMANT", 0)


def _pytest_args(spec_url, run_dir, families, extra):
    args = ["properties/", f"--impl=openai:{spec_url}", f"--kit-families={families}",
            f"--conformance-json={run_dir / 'conformance.json'}",
            f"--kit-report={run_dir / 'report'}", "-p", "no:cacheprovider",
            "-q", "-rfE", f"--rootdir={ROOT}", "-o", "addopts=--benchmark-disable"]
    return args + list(extra)


def run(engine_name: str, method_name: str, *, run_dir=None, known_path=None,
        families: str = SERVED_FAMILIES, allow_unvalidated: bool = False,
        measure_speed: bool = True, pytest_args=(), say=print, port: int | None = None,
        baseline_port: int | None = None, models: str = "kit",
        time_limit: float | None = None) -> Outcome:
    if time_limit is not None and not time_limit > 0:
        say(f"error: time_limit={time_limit!r}: give a number of seconds > 0")
        return Outcome("SETUP", f"time_limit={time_limit!r}", 3)
    try:
        engine = engines.get(engine_name)
        method = engine.method(method_name)
    except KeyError as exc:
        say(f"error: {exc.args[0]}")
        return Outcome("SETUP", str(exc.args[0]), 3)
    trained_run = models in trained_export.PAIRS     # "trained" or "trained-large"
    if models != "kit" and not trained_run:
        say(f"error: models={models!r}: choose kit, {' or '.join(trained_export.PAIRS)}")
        return Outcome("SETUP", f"models={models!r}", 3)
    # a trained pair (properties/serve/trained.py): a shape the engine cannot run is refused
    # here, before anything starts, naming the model, its head_dim and the engine; the answer
    # depends on the pair (the committed small draft's head_dim is 24, the large pair's 32)
    refused = _trained_refusal(engine, method, models) if trained_run else (
        f"method {method.name} drafts with the trained pair's small draft: pass --models trained "
        f"or --models trained-large" if method.draft == "draft-small" else None)
    if refused:
        say(f"error: {refused}")
        return Outcome("SETUP", refused, 3)
    try:
        env = engine.find()
    except EngineMissing as exc:
        say(f"error: {exc}")
        return Outcome("SETUP", str(exc), 3)
    version = engine.version(env)
    if engine.validated and version not in engine.validated and not allow_unvalidated:
        text = (f"{engine.title} {version} is not a version the kit's dialect readings were "
                f"validated against ({', '.join(engine.validated)}): record its responses with "
                f"`python tests/recorded/capture.py {engine.name}` and run the dialect tests "
                f"(pytest tests/test_serve_dialects.py), or pass --allow-unvalidated")
        say(f"error: {text}")
        return Outcome("SETUP", text, 3)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = f"-{models}" if trained_run else ""      # -trained, -trained-large
    run_dir = Path(run_dir or ROOT / "runs" / f"{engine.name}-{method.name}{tag}-{stamp}")
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"[kit] {engine.title} {version}, method {method.name} ({method.description}); run "
        f"directory {run_dir}")
    export_dir = run_dir / "export"
    if trained_run:
        # the target and this method's draft, of the pair `models` names
        trained_export.export(export_dir, method, models)
    else:
        export.export(export_dir)
    if engine.prepare is not None:
        engine.prepare(env, export_dir, run_dir / "prepare.log")
    spec = Server(f"{engine.name}-{method.name}",
                  lambda p: engine.command(env, export_dir, method, p), run_dir,
                  start_timeout=engine.start_timeout, port=port)
    base = Server(f"{engine.name}-baseline",
                  lambda p: engine.command(env, export_dir, None, p), run_dir,
                  start_timeout=engine.start_timeout, port=baseline_port)
    known = read_known(known_path, version, method.name) if known_path else []
    previous = signal.signal(signal.SIGTERM, _interrupt)
    record = {"engine": engine.name, "title": engine.title, "version": version,
              "method": method.name, "method_description": method.description,
              "families": families.split(",") if models == "kit" else [],
              "date": time.strftime("%Y-%m-%d"), "run_dir": str(run_dir), "models": models}
    try:
        for server in (base, spec):
            say(f"[kit] starting {server.name} (health within {server.start_timeout:g} s)")
            server.start()
            say(f"[kit] {server.name} answers at {server.url} (log {server.log_path})")
        if trained_run:
            from properties.serve import trained
            outcome = Outcome(*trained.run_check(engine, method, spec, base, record, say,
                                                 measure_speed, models))
            record.update(verdict=outcome.verdict, verdict_text=outcome.text)
        else:
            launcher = Launcher(engine, method, spec, base, say, time_limit)
            deaths.REGISTRY.deaths.clear()
            import pytest
            code = pytest.main(_pytest_args(spec.url, run_dir, families, pytest_args),
                               plugins=[launcher])
            record["pytest_exit"] = int(code)
            summary = launcher.summary
            if summary is None:
                raise LaunchError(f"the kit's pytest run ended without a summary (exit code "
                                  f"{int(code)}: a usage error?)")
            for server in (spec, base):   # the last test may have killed one
                if not server.alive():
                    launcher.restart(server, deaths.REGISTRY.last() or deaths.Death(
                        server.url, {}, "not answering", "unknown", str(server.log_path)))
            speculation = speed.evidence(engine, spec, method)
            record["speculation"] = speculation
            if measure_speed:
                record["speed"] = speed.measure(engine, spec, base, say=say, method=method)
            outcome = judge(summary, known, known_path is not None, speculation)
            if launcher.stopped_by_limit:
                reached, planned = _reached(summary)
                record["time_limit"] = {"seconds": time_limit, "reached": reached,
                                        "planned": planned}
                outcome = limited(outcome, time_limit, reached, planned)
            record.update(verdict=outcome.verdict, verdict_text=outcome.text,
                          summary=_families(summary), restarts=launcher.restarts,
                          deaths=[d.as_dict() for d in deaths.REGISTRY.deaths],
                          known=[k.__dict__ for k in known], known_matched=outcome.known,
                          not_known=[{"test": n, "cause": c} for n, c in outcome.new])
    except LaunchError as exc:
        say(f"error: {exc}")
        record.update(verdict="SETUP", verdict_text=str(exc).splitlines()[0])
        outcome = Outcome("SETUP", str(exc), 3)
    except KeyboardInterrupt:
        say("[kit] interrupted: stopping the servers")
        record.update(verdict="INCOMPLETE", verdict_text="interrupted")
        outcome = Outcome("INCOMPLETE", "interrupted", 2)
    finally:
        for server in (spec, base):
            server.stop()
        signal.signal(signal.SIGTERM, previous)
        # the kit's page gets what was measured after its tests, from this same run
        page = collect.add_served(run_dir / "report", {k: v for k, v in record.items()
                                                         if k not in ("summary", "known")})
        if page is not None:
            record["report"] = str(page)
        (run_dir / "result.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    _print_outcome(record, outcome, say)
    outcome.summary = record
    return outcome


def limited(outcome: Outcome, seconds: float, reached: int, planned: int) -> Outcome:
    """A run stopped by its time limit: the verdict says how far it got, and it never exits 0
    (only failures not known exit 1; otherwise 2, as INCOMPLETE): with tests not reached,
    "every failure is known" is not the whole answer."""
    text = (f"{outcome.text} (stopped by its time limit of {seconds:g} s: {reached} of {planned} "
            f"tests reached)")
    return replace(outcome, text=text, exit=1 if outcome.exit == 1 else 2)


def _reached(summary: dict) -> tuple[int, int]:
    """(tests that reported an outcome, tests planned) over the run's families."""
    entries = summary["families"].values()
    return sum(len(e.get("tests", {})) for e in entries), sum(e["planned"] for e in entries)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _trained_refusal(engine, method, models: str = "trained") -> str | None:
    """Why `engine` cannot run `method` on the pair `models` names (a draft it does not have, a
    head size the engine's attention refuses, a pair not made yet), or None."""
    try:
        trained_export.pair_of(models)   # a pair not made yet: said before anything starts
        return trained_export.refusal(engine, method, models)
    except KeyError as exc:
        return str(exc.args[0])
    except FileNotFoundError as exc:    # trained-large before `make models-large`
        return str(exc)


def _families(summary: dict) -> dict:
    out = {}
    for family, entry in summary["families"].items():
        if not family.startswith("served_"):
            continue
        out[family] = {k: entry.get(k, 0) for k in ("passed", "failed", "not_applicable",
                                                     "not_shown", "xfailed")}
        out[family]["examples_shown"] = entry.get("examples_shown", [0, 0])
        out[family]["tests"] = entry.get("tests", {})
        out[family]["failures"] = {n: entry["causes"].get(n, "") for n in entry["failures"]}
        out[family]["reasons"] = entry["reasons"]
    return out


def _print_outcome(record: dict, outcome: Outcome, say) -> None:
    say("")
    say(f"== {record['engine']} {record.get('version', '?')} / {record['method']} ==")
    for d in record.get("deaths", []):
        tag = "same finding as above" if d["same_as"] is not None else "FINDING"
        say(f"server death ({tag}) in {d['test']}: {d['signature']}\n  replay: {d['curl']}")
    spec = record.get("speculation")
    if spec:
        say(f"speculation: {spec.get('drafted', 0):g} tokens drafted, {spec.get('accepted', 0):g}"
            f" accepted ({spec.get('source')})")
    if record.get("speed"):
        s = record["speed"]
        say(f"speed-up of speculation over the baseline (greedy, one request at a time, "
            f"alternating, the other server paused): {s['speedup']:.3f}x "
            f"({s['tokens']} tokens per server per turn, {s['turns']} turns each)")
    if record.get("trained"):
        from properties.serve import trained
        for line in trained.describe(record):
            say(line)
    # a failure no known entry matches is named with its cause line, so that a log's tail (CI's)
    # says which defect is new without the run directory
    for nodeid, cause in outcome.new:
        say(f"not known: {nodeid}: {cause or '(no cause line)'}")
    say(f"verdict for {record['engine']} {record.get('version', '?')} / {record['method']}: "
        f"{outcome.text}")
    if record.get("report"):
        say(f"report: {record['report']}")


def main(args) -> int:
    outcome = run(args.engine, args.method, run_dir=args.run_dir, known_path=args.known_failures,
                  families=args.families, allow_unvalidated=args.allow_unvalidated,
                  measure_speed=not args.no_speed, pytest_args=args.pytest_args,
                  port=args.port, baseline_port=args.baseline_port,
                  models=getattr(args, "models", "kit"),
                  time_limit=getattr(args, "time_limit", None))
    if args.results and outcome.summary.get("engine"):   # a run refused before it began: none
        results_append(args.results, outcome.summary)
    return outcome.exit


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
    families = SERVED_FAMILIES.split(",")
    lines = ["| engine | version | method | date | " + " | ".join(families) +
             " | drafted / accepted | speed-up | verdict |",
             "|" + " --- |" * (len(families) + 7)]
    from properties.report.grid import cell, on_trained_pair
    trained = [r for r in runs if on_trained_pair(r)]
    if len(trained) == len(runs):
        lines = []      # trained runs only: their own table below
    for r in runs:
        if on_trained_pair(r):
            continue
        cells = [cell(r, f)[1] for f in families]
        s = r.get("speculation") or {}
        sp = r.get("speed") or {}
        lines.append(f"| {r['engine']} | {r.get('version', '?')} | {r['method']} | "
                     f"{r.get('date', '')} | " + " | ".join(cells) +
                     f" | {s.get('drafted', 0):g} / {s.get('accepted', 0):g} | "
                     f"{sp.get('speedup', float('nan')):.2f}x | {r.get('verdict_text', '')} |")
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

