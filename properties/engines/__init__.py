"""The production engines the kit starts and judges: one file per engine, one line each in
`ENGINES` (or one `register(...)` call).

An engine's file declares one `ENGINE` (an `Engine`) and everything engine-specific:

    find()                          its environment (EngineMissing names the make target)
    version(env)                    its version; `validated`: those its dialect was recorded from
    methods                         its speculation methods (name -> properties.methods.Method:
                                    what drafts, k, conventions)
    command(env, export_dir, method, port) -> Command
                                    the server's command line, env vars and health path, for the
                                    baseline (method None) and each method: the one source of the
                                    launcher and of the printed recipes (env None: as a user
                                    types it where the engine is installed)
    prepare(env, export_dir, log)   optional: files made before the servers start (GGUF)
    prepare_commands(env, dir[, drafts])
                                    optional: those steps as command lines, for the recipes
    dialect                         a Dialect (properties.adapters.dialects) or a subclass:
                                    request bodies and paths, how answers become Completions,
                                    neutral settings, `n`, and its speculation counters
                                    (`counters` / `per_response` / `count`)
    dialects(method)                optional: the dialect per method, where speculation is
                                    switched on per request (transformers serve)
    schedule                        its end-of-request draft habit (properties.acceptance)
    concurrency                     optional: requests it answers at once (1: no batches)

An engine driven through its Python API (no server of its own) declares a `Session` class in
its file and serves it with the kit's worker (properties/engines/python_api.py, inprocess.py):
to the kit it is a server like any other.

The client, the checks, the launcher and the speed measurement only call these; none of them
names an engine. Adding an engine is its file plus one line here (and a make target for its
environment if it has one); tests/test_engine_interface.py adds one from a test module.
An engine's file may live outside this package: its line then names the module in full. The
`fake` engine (the launcher's self-test) is test infrastructure, in a checkout of the project
only (tests/fakes/engine.py): where it is not there, `get("fake")` is a KeyError saying so, and
`available()` leaves it out.
"""

from __future__ import annotations

import importlib
import shlex
from dataclasses import dataclass, field, replace

from properties.adapters.dialects import Dialect
from properties.adapters.protocol import HttpError, Request, ServedError
from properties.methods import Method


@dataclass
class Command:
    """How to start one server: argv, extra environment, and its health path."""

    argv: list
    env: dict = field(default_factory=dict)
    health: str = "/health"
    cwd: str | None = None

    def shell(self) -> str:
        """The command as one shell line, its environment variables first."""
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in self.env.items())
        line = " ".join(shlex.quote(str(a)) for a in self.argv)
        return f"{env} {line}" if env else line


# engine name -> module (a name under properties.engines, or a full module path where it holds
# a dot) or an Engine (register)
ENGINES = {
    "vllm": "vllm",
    "llamacpp": "llamacpp",
    "transformers": "transformers",
    "sglang": "sglang",
    "fake": "tests.fakes.engine",       # a checkout of the project only
    "openvino": "openvino",
    "onnxruntime-genai": "onnxruntime_genai",
}


class EngineMissing(RuntimeError):
    """The engine's environment is not there; the message names the make target to run."""


class EngineNotHere(KeyError):
    """The engine's own module is not in this installation (the fake engine outside a checkout
    of the project)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass
class Engine:
    name: str
    title: str
    setup: str                      # what creates its environment, e.g. "make engine-vllm"
    validated: tuple                # versions the kit's dialect readings were recorded from
    methods: dict                   # method name -> Method
    dialect: Dialect
    find: object                    # () -> Environment; raises EngineMissing
    version: object                 # (Environment) -> str
    command: object                 # (Environment | None, export_dir, Method | None, port) -> Command
    prepare: object = None          # (Environment, export_dir, log) -> None (e.g. GGUF files)
    prepare_commands: object = None  # (Environment | None, export_dir[, drafts]) -> [(what, Command)]
    dialects: object = None         # (Method | None) -> Dialect, when speculation is per request
    start_timeout: float = 300.0
    notes: tuple = field(default_factory=tuple)
    runnable: bool = True           # False: recipe only (needs hardware this kit lacks)
    recipe: bool = True             # False: left out of the printed recipes (the self-test)
    schedule: str | None = None     # end-of-request draft habit (properties.acceptance)
    # requests it answers at once, where it cannot batch (1: batch size 1, as an engine driven
    # through a Python API that takes one sequence); None: as many as the kit sends
    concurrency: int | None = None
    # the head sizes its attention takes, where it refuses some: (rule in words, predicate on
    # head_dim); the trained export warns for a model it cannot run (properties/export/trained.py)
    head_sizes: tuple | None = None

    def method(self, name: str) -> Method:
        if name not in self.methods:
            raise KeyError(f"{self.name} has no method {name!r}; its methods: "
                           f"{', '.join(self.methods)}")
        return self.methods[name]

    def dialect_for(self, method: Method | None) -> Dialect:
        """The dialect of requests to the server of `method` (None: the baseline)."""
        return self.dialects(method) if self.dialects is not None else self.dialect


def register(name: str, engine: "Engine | str") -> None:
    """Add an engine to the table: its Engine, or its module (a file declaring ENGINE): a name
    under properties.engines, or a full module path (one with a dot). The same as one more line
    in ENGINES."""
    ENGINES[name] = engine


def module_of(entry: str) -> str:
    """The module an ENGINES entry names: a full module path where it holds a dot, else a name
    under properties.engines."""
    return entry if "." in entry else f"properties.engines.{entry}"


def get(name: str) -> Engine:
    """The engine of the table's `name`; a KeyError for a name not in the table, and
    EngineNotHere (a KeyError) where the engine's module is not in this installation."""
    if name not in ENGINES:
        raise KeyError(f"no engine {name!r}; the engines: {', '.join(ENGINES)}")
    entry = ENGINES[name]
    if isinstance(entry, Engine):
        return entry
    module = module_of(entry)
    try:
        return importlib.import_module(module).ENGINE
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
            raise       # the engine's file is there; something it imports is not
        where = (" (it is test infrastructure, in a checkout of the project only: run from the "
                 "checkout's root)" if module.startswith("tests.") else "")
        raise EngineNotHere(f"engine {name!r} is not in this installation: its module {module} "
                            f"cannot be imported ({exc}){where}") from None


def available() -> list[str]:
    """The table's engines whose module is in this installation (all but the fake engine's
    outside a checkout of the project)."""
    names = []
    for name in ENGINES:
        try:
            get(name)
        except EngineNotHere:
            continue
        names.append(name)
    return names


# ----------------------------------------------------------------------- an engine not named

PROBE = Request(prompt=(0,), max_tokens=1)


@dataclass(frozen=True)
class Unknown(Dialect):
    """A server whose engine is not named (``--impl=openai:URL`` without --served-engine):
    the request shapes of the table's engines are tried in order (the OpenAI API first) until
    one is not refused, and the speculation counters are those of whichever engine's
    server-wide counters the server exports."""

    name: str = "auto"
    honours_n: bool | None = False  # until resolved: the shape is not known, ask one at a time
    shapes: tuple = ()              # candidate dialects; one once resolved
    resolved: bool = False

    def resolve(self, client) -> Dialect:
        if self.resolved:
            return self
        refusals = []
        for shape in self.shapes:
            try:
                shape.complete(client, PROBE)
            except HttpError as exc:
                if exc.status not in (400, 422):
                    raise
                refusals.append(f"{shape.name}: {exc}")
                continue
            return replace(self, name=shape.name, shapes=(shape,), resolved=True,
                           neutral=shape.neutral, stop_in_ids=shape.stop_in_ids,
                           stop_in_text=shape.stop_in_text, honours_n=shape.honours_n,
                           path=shape.path, at_root=shape.at_root,
                           per_response=shape.per_response)
        raise HttpError(f"{client.url}: no request dialect is accepted: " + "; ".join(refusals),
                        400)

    def body(self, req, model):
        return self.shapes[0].body(req, model)

    def complete(self, client, req):
        return self.shapes[0].complete(client, req)

    def read(self, answer, req, where):
        return self.shapes[0].read(answer, req, where)

    def counters(self, client):
        for name in available():
            try:
                found = get(name).dialect.counters(client)
            except (ServedError, EngineMissing):
                continue
            if found is not None:
                return found
        return None

    def counters_missing(self, client) -> str | None:
        if self.per_response or self.counters(client) is not None:
            return None
        return (f"cannot judge: {client.url} exports no speculative-decoding counters at "
                f"/metrics (pass --served-engine=NAME if it reports them elsewhere)")


def unknown_dialect(generation_config: dict | None = None,
                    shapes=("openai", "transformers")) -> Unknown:
    """The dialect for a server whose engine is not named: the OpenAI API, else the request
    shape of transformers serve (text prompts; `generation_config` merged into each)."""
    from properties.engines.transformers import DIALECT
    known = {"openai": Dialect(),
             "transformers": DIALECT.with_generation_config(generation_config or {})}
    return Unknown(shapes=tuple(known[s] for s in shapes))
