"""pytest options for served engines, the served Impl built from them, and the served tests'
fixtures.

Two ways to point the kit at a served engine, one run either way:

* ``--engine=NAME --method=NAME``: the kit starts the engine (properties/serve/run.py,
  Launch): it exports its checkpoints, starts the speculating server and the baseline, and the
  session holds them until the run ends (restarts, speed, stop). ``python -m properties.serve
  run ENGINE METHOD`` is the same run with a shorter command line.
* ``--impl=openai:URL``: a server someone else started, described by these options:

    --baseline=URL                  the same model served without speculation: greedy outputs
                                    must match it (ties within the logit tolerance aside)
    --served-engine=NAME            the engine behind the URL (properties.engines): its dialect
                                    (request shape, answers, speculation counters), its schedule
    --served-api=auto|openai|transformers
                                    the request shape when no engine is named (auto: tried in
                                    that order)
    --served-model=NAME             the model name to request (default: the first of /v1/models)
    --served-timeout=SECONDS        per request (default 60)
    --served-concurrency=N          requests in flight at once (default 8)
    --served-generation-config=JSON merged into each request's generation_config (transformers
                                    serve's dialect), e.g. '{"prompt_lookup_num_tokens": 4}'
    --served-draft=NAME             what drafts (properties.methods.DRAFTERS): perfect (the
                                    target), draft-early-exit, draft-random, ngram, none, unknown
    --served-k=K                    draft tokens per round
    --served-logit-tolerance=GAP    greedy ties (default 1e-3, for float32 servers)

Either way the Impl is built once, configured (`implementation`). Before the first served test
the fixture confirms that the server (and the baseline) serve the kit's target; otherwise the
run stops with one message saying what is served instead.
"""

from __future__ import annotations

import json

import pytest

from properties import methods
from properties import session as sessions
from properties.plugin.say import say

DEFAULTS = {"timeout": 60.0, "concurrency": 8}


def pytest_addoption(parser):
    group = parser.getgroup("served engines (--impl=openai:URL)")
    group.addoption("--baseline", default=None, metavar="URL",
                    help="the same model served without speculation (for greedy equality)")
    group.addoption("--served-api", default="auto", choices=("auto", "openai", "transformers"),
                    help="request shape when no engine is named: openai (vLLM/SGLang "
                         "extensions) or transformers")
    group.addoption("--served-model", default=None, metavar="NAME",
                    help="model name to request (default: the first of GET /v1/models)")
    group.addoption("--served-timeout", default=str(DEFAULTS["timeout"]), metavar="SECONDS",
                    help="timeout of one request (default 60)")
    group.addoption("--served-concurrency", default=str(DEFAULTS["concurrency"]), metavar="N",
                    help="requests in flight at once (default 8)")
    group.addoption("--served-generation-config", default=None, metavar="JSON",
                    help="JSON object merged into each request's generation_config "
                         "(transformers serve)")
    group.addoption("--served-draft", default="unknown", choices=tuple(methods.DRAFTERS),
                    help="what the server drafts with: perfect (the target), an exported "
                         "draft (the kit replays its acceptance exactly), ngram, none")
    group.addoption("--served-k", default="4", metavar="K",
                    help="draft tokens per round the server was started with (default 4)")
    group.addoption("--served-engine", default=None, metavar="NAME",
                    help="the engine behind the URL (vllm, llamacpp, transformers, ...): "
                         "its dialect (requests, answers, speculation counters)")
    group.addoption("--served-logit-tolerance", default=None, metavar="GAP",
                    help="float64 top-two logit gap below which a greedy divergence is a tie")
    start = parser.getgroup("production engines the kit starts (--engine, --method)")
    start.addoption("--engine", default=None, metavar="NAME",
                    help="start this engine (properties/engines/) with --method and without "
                         "(the baseline), judge it, stop it")
    start.addoption("--method", default=None, metavar="NAME",
                    help="the engine's speculative method, e.g. draft-early-exit, ngram")
    start.addoption("--models", default="kit", metavar="kit|trained|trained-large",
                    help="kit: the kit's models and its served families; trained, "
                         "trained-large: a trained pair, judged by the served_trained family")
    start.addoption("--run-dir", default=None, metavar="DIR",
                    help="where the logs, export and results go (default runs/ENGINE-METHOD-TIME)")
    start.addoption("--results", default=None, metavar="FILE.json",
                    help="add this run to a results file (and its .md table)")
    start.addoption("--allow-unvalidated", action="store_true", default=False,
                    help="run on an engine version the kit's dialects were not recorded from")
    start.addoption("--no-speed", action="store_true", default=False,
                    help="skip the speed-up measurement")
    start.addoption("--port", default=None, type=int, metavar="PORT",
                    help="port of the speculating server (default: a free one)")
    start.addoption("--baseline-port", default=None, type=int, metavar="PORT",
                    help="port of the baseline server (default: a free one)")


def _number(config, name, kind, low):
    text = config.getoption(name)
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{name}={text}: not a number") from None
    if not value >= low or value != value or value == float("inf"):
        raise pytest.UsageError(f"{name}={text}: must be a finite number >= {low}")
    return value


def options(config) -> dict:
    """The options common to every served run, validated (a bad value is one usage error
    naming it)."""
    tolerance = config.getoption("--served-logit-tolerance")
    return {
        "model": config.getoption("--served-model"),
        "timeout": _number(config, "--served-timeout", float, 1e-3),
        "concurrency": _number(config, "--served-concurrency", int, 1),
        "logit_tolerance": None if tolerance is None else _number(
            config, "--served-logit-tolerance", float, 0.0),
    }


def by_url(config) -> dict:
    """The settings of a server given by URL (--impl=openai:URL), from the command line."""
    extra = config.getoption("--served-generation-config")
    if extra is not None:
        try:
            extra = json.loads(extra)
        except ValueError as exc:
            raise pytest.UsageError(f"--served-generation-config={extra}: not JSON ({exc})") from None
        if not isinstance(extra, dict):
            raise pytest.UsageError(f"--served-generation-config={json.dumps(extra)}: must be a "
                                    f"JSON object")
    engine = _engine(config.getoption("--served-engine"))
    dialect, baseline_dialect = _dialects(engine, config.getoption("--served-api"), extra or {})
    return {"baseline": config.getoption("--baseline"), "engine": engine, "dialect": dialect,
            "baseline_dialect": baseline_dialect,
            "method": methods.by_option(config.getoption("--served-draft"),
                                        _number(config, "--served-k", int, 1))}


def implementation(config):
    """(the served Impl, the Launch) of this run: the engine the kit starts (--engine), a
    server given by URL (--impl=openai:URL), or (None, None) for an in-process --impl."""
    from properties.adapters.served import make_impl
    spec = config.getoption("--impl")
    if config.getoption("--engine") is None:
        if config.getoption("--method") is not None:
            raise pytest.UsageError("--method names a method of the engine the kit starts: give "
                                    "--engine=NAME too")
        if not spec.startswith("openai:"):
            return None, None
        return make_impl(spec, **options(config), **by_url(config)), None
    if spec != "reference" or config.getoption("--baseline"):
        raise pytest.UsageError(f"--engine={config.getoption('--engine')} starts the servers "
                                f"the kit checks: leave out --impl={spec} and --baseline")
    if getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        raise pytest.UsageError("--engine runs its servers in this process: leave out -n")
    from properties.serve.run import Launch, SetupError
    try:
        launch = Launch.start(config.getoption("--engine"), config.getoption("--method"),
                              models=config.getoption("--models"),
                              run_dir=config.getoption("--run-dir"),
                              results=config.getoption("--results"),
                              allow_unvalidated=config.getoption("--allow-unvalidated"),
                              measure_speed=not config.getoption("--no-speed"),
                              port=config.getoption("--port"),
                              baseline_port=config.getoption("--baseline-port"),
                              say=lambda text: say(config, text))
    except SetupError as exc:
        say(config, f"error: {exc}")
        pytest.exit(f"the kit could not start {config.getoption('--engine')}", returncode=3)
    return make_impl("openai:" + launch.spec.url, **options(config), **launch.settings()), launch


def _engine(name):
    if name is None:
        return None
    from properties import engines
    try:
        return engines.get(name)
    except KeyError as exc:
        raise pytest.UsageError(f"--served-engine={name}: {exc.args[0]}") from None


def _dialects(engine, api: str, extra: dict):
    """(the dialect of --impl, that of --baseline): the named engine's, else a probing one
    (properties.engines.Unknown); --served-generation-config goes to --impl's only."""
    from properties import engines
    if engine is None:
        shapes = ("openai", "transformers") if api == "auto" else (api,)
        return (engines.unknown_dialect(extra, shapes), engines.unknown_dialect(None, shapes))
    try:
        return engine.dialect.with_generation_config(extra), engine.dialect
    except ValueError as exc:
        raise pytest.UsageError(f"--served-generation-config with --served-engine="
                                f"{engine.name}: {exc}") from None


def _served_impl(config):
    from properties.adapters.served import ServedImpl
    run = sessions.of(config)
    impl = run.impl if run is not None else None
    return impl if isinstance(impl, ServedImpl) else None


@pytest.fixture(scope="session")
def served(pytestconfig):
    """The served Impl, configured and confirmed to serve the kit's target."""
    impl = _served_impl(pytestconfig)
    if impl is None:
        spec = sessions.of(pytestconfig).impl.spec
        pytest.skip(f"not applicable: --impl={spec} is not a served engine (--impl=openai:URL)")
    return _confirmed(pytestconfig, impl)


def _confirmed(config, impl):
    """The served Impl, its server (and baseline) confirmed once to serve the kit's target (on
    a trained pair: the pair's, which the served_trained family checks itself), its clients
    watched: a failed request that met a dead server is a finding."""
    if config.stash.get(_CONFIRMED, False):
        return impl
    run = sessions.of(config)
    if run.launch is None or not run.launch.trained:
        from properties.checks.served import Refusal, check_identity
        try:
            if impl.baseline is not None:
                check_identity(impl.baseline, impl.logit_tolerance, role="--baseline")
        except Refusal as exc:
            pytest.exit(f"the kit refuses to check this server: {exc}", returncode=4)
        try:
            check_identity(impl.client, impl.logit_tolerance, role="--impl")
        except Refusal as exc:
            if run.launch is None or impl.baseline is None:
                pytest.exit(f"the kit refuses to check this server: {exc}", returncode=4)
            # the kit started both servers from one export and the baseline serves its target:
            # what the speculating server's probe shows is speculation changing the output (a
            # mode the engine names lossy does), which the families judge and report
            say(config, f"[kit] the speculating server's greedy probe differs from the target's "
                        f"while its baseline (the same export) serves it: left to the families "
                        f"to judge ({exc})")
    from properties.serve.deaths import Watchdog
    for client in (impl.client, impl.baseline):
        if client is None:
            continue
        server = run.launch.server_for(client.url) if run.launch is not None else None
        client.watchdog = Watchdog(f"{client.scheme}://{client.host}:{client.port}/health",
                                   server=server)
    config.stash[_CONFIRMED] = True
    return impl


_CONFIRMED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _served_server_alive(request):
    """Before each served test: a server that died at an earlier request is restarted when the
    kit started it; otherwise the test is not run, and says at which request the server died."""
    impl = _served_impl(request.config)
    family = request.node.get_closest_marker("family")
    if impl is None or family is None or not str(family.args[0]).startswith("served_"):
        yield
        return
    launch = sessions.of(request.config).launch
    for client in (impl.client, impl.baseline):
        dog = getattr(client, "watchdog", None)
        if dog is None:
            continue
        dog.test = request.node.nodeid
        if not dog.dead:
            continue
        from properties.serve.deaths import REGISTRY
        death = REGISTRY.last()
        if dog.server is not None and launch is not None:
            launch.restart(dog.server, death, say=lambda text: say(request.config, text))
            dog.dead = False
        elif dog._alive():
            dog.dead = False   # it came back (restarted by someone else)
        else:
            pytest.skip(f"not run: the server died at {death.test or 'an earlier test'}: "
                        f"{death.headline()}; replay: {death.curl()}")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test whose explicit examples met a dead server fails with a group of exceptions: its
    cause is the death (the summary groups failures by cause). The judged requests of the test
    are attributed to it (properties.speculation: was anything drafted for them?)."""
    from properties import speculation
    speculation.begin(item.nodeid if _is_served(item) else None)
    try:
        outcome = yield
    finally:
        speculation.begin(None)
    excinfo = getattr(outcome, "excinfo", None)
    error = excinfo[1] if excinfo else None
    if isinstance(error, BaseExceptionGroup) and not getattr(error, "cause", ""):
        from properties.serve.deaths import ServerDied
        died = [e for e in _leaves(error) if isinstance(e, ServerDied)]
        if died:
            error.cause = died[0].cause


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A served test that passed, though none of its examples saw the engine draft at the
    positions it judged, is no evidence about speculation: it is reported "not shown", never
    as a pass. A test that did see speculation carries how many of its examples did."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not _is_served(item):
        return
    from properties import speculation
    tally = speculation.tally(item.nodeid)
    if tally is None:
        return
    examples, shown, unobservable = tally
    report.user_properties.append(("kit_shown", [examples, shown]))
    if report.passed and shown == 0:
        why = (f"none of its {examples} example(s) could show speculation (the engine reports "
               f"no draft statistics and its drafter is not one the kit replays)"
               if unobservable == examples else
               f"nothing was drafted at the judged positions in any of its {examples} "
               f"example(s)")
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: not shown: {why}")


def _is_served(item) -> bool:
    """A test of the kit's served families (not a test of the project's own code)."""
    family = item.get_closest_marker("family")
    return family is not None and str(family.args[0]).startswith("served_")


def _leaves(group):
    for e in group.exceptions:
        yield from (_leaves(e) if isinstance(e, BaseExceptionGroup) else (e,))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    impl = _served_impl(config)
    if impl is None or hasattr(config, "workerinput"):
        return
    lines = []
    for role, client in (("--impl", impl.client), ("--baseline", impl.baseline)):
        if client is None or client.traffic.requests == 0:
            continue
        t = client.traffic
        lines.append(f"{role} {client.url} (dialect {client.dialect.name}, model "
                     f"{client.model!r}): "
                     f"{t.requests} requests, {t.completions} completions, "
                     f"{t.rate():.1f} requests/s while busy (concurrency {client.concurrency})")
    if lines:
        terminalreporter.section("served engine traffic")
        for line in lines:
            terminalreporter.write_line(line)
