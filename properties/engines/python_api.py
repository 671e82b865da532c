"""The kit's side of an engine driven through its Python API (properties/engines/inprocess.py
is the worker that serves it): the worker's command line and the dialect it speaks.

An engine file of this kind declares a stdlib-only `Session` class (see inprocess.py) and its
`command()` returns `worker(python, __file__, method config, port)`, where `python` is its own
environment's interpreter. A session with `generate_batch` answers the requests in flight
together in one engine call (its Engine's `concurrency` says how many, at most). The dialect is the OpenAI one (token ids in and out) with the
engine's draft statistics in each answer (`speculation`: drafted, accepted, rounds), so the
counters checks compare them with the exact replay request by request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from properties.adapters.dialects import Dialect, read_prometheus
from properties.adapters.protocol import BadResponse, Completion
from properties.engines import Command
from properties.engines import inprocess

WORKER = Path(inprocess.__file__)


def worker(python, session_file, config: dict, port: int, cls: str = "Session",
           env: dict | None = None, window: float | None = None) -> Command:
    """The command that serves `cls` of `session_file` on `port` with `python` (the engine's
    environment), the session built from `config` (JSON); `window`: how long a batch's first
    request waits for others (inprocess.WINDOW when None), for a session that batches."""
    argv = [python, WORKER, "--session", f"{session_file}:{cls}", "--port", str(port),
            "--config", json.dumps(config, sort_keys=True)]
    if window is not None:
        argv += ["--window", str(window)]
    return Command(argv, env=dict(env or {}), health="/health")


@dataclass(frozen=True)
class InProcess(Dialect):
    """The worker's answers: one completion per request (the client asks n times, each with
    its own seed), token ids in and out, the stop id kept at the end of token_ids, and the
    engine's draft statistics per answer."""

    name: str = "python-api"
    honours_n: bool | None = False
    stop_in_ids: bool | None = True
    per_response: bool = True

    def body(self, req, model) -> dict:
        body = super().body(req, model)
        body.pop("n", None)
        return body

    def read_choice(self, choice: dict, req, where: str) -> Completion:
        read = super().read_choice(choice, req, where)
        spec = choice.get("speculation") or {}
        pieces = tuple(choice.get("pieces") or ())
        if pieces and sum(pieces) != len(read.tokens):
            raise BadResponse(f"{where}: pieces {list(pieces)} do not add up to the "
                              f"{len(read.tokens)} tokens returned")
        return Completion(read.tokens, read.finish_reason, spec.get("drafted"),
                          spec.get("accepted"), pieces=pieces if len(pieces) > 1 else (),
                          logprobs=read.logprobs, text=read.text)

    def counters(self, client):
        return read_prometheus(client, (inprocess.DRAFTED,), (inprocess.ACCEPTED,),
                               rounds=(inprocess.ROUNDS,))
