"""The production engines the kit starts and judges: one module per engine, one line each here.

Each module exposes one `ENGINE` (an Engine): how its environment is found (and which make
target creates it), its version, the command lines of its baseline and of each speculation
method, its health path, its response dialect (properties.adapters.dialects), and the versions
the kit has been validated against. The client and the checks stay engine-agnostic.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from properties.adapters.dialects import Dialect


@dataclass
class Command:
    """How to start one server: argv, extra environment, and its health path."""

    argv: list
    env: dict = field(default_factory=dict)
    health: str = "/health"
    cwd: str | None = None

# engine name -> module (under properties.engines)
ENGINES = {
    "vllm": "vllm",
    "llamacpp": "llamacpp",
    "transformers": "transformers",
    "sglang": "sglang",
    "fake": "fake",
}


class EngineMissing(RuntimeError):
    """The engine's environment is not there; the message names the make target to run."""


@dataclass(frozen=True)
class Method:
    """One speculation method of an engine."""

    name: str
    description: str
    # the kit's name for what drafts: "perfect" (the target), "draft-early-exit",
    # "draft-random" (export names, the kit replays their acceptance), "ngram", "none"
    draft: str
    k: int = 4


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
    command: object                 # (Environment, export_dir, Method | None, port) -> Command
    prepare: object = None          # (Environment, export_dir, log) -> None (e.g. GGUF files)
    start_timeout: float = 300.0
    # where the engine reports counters: served_draft names in the kit's replay terms
    notes: tuple = field(default_factory=tuple)
    runnable: bool = True           # False: recipe only (needs hardware this kit lacks)
    schedule: str | None = None     # end-of-request draft habit (properties.acceptance)
    kit_args: tuple = ()            # extra pytest options the kit passes for this engine

    def method(self, name: str) -> Method:
        if name not in self.methods:
            raise KeyError(f"{self.name} has no method {name!r}; its methods: "
                           f"{', '.join(self.methods)}")
        return self.methods[name]


def get(name: str) -> Engine:
    if name not in ENGINES:
        raise KeyError(f"no engine {name!r}; the engines: {', '.join(ENGINES)}")
    return importlib.import_module(f"properties.engines.{ENGINES[name]}").ENGINE
