"""Evidence that speculation ran, and what it buys: measured on the running servers.

`evidence` sends a few greedy requests to the speculating server and reads the engine's own
counters through its dialect (`Dialect.count`: a page of server-wide counters, or the draft
statistics in its responses): no drafted token means speculation was not shown to have run,
whatever the flags said. Where the kit replays the method's drafter (a draft model, a head, a
script) and the engine declares its end-of-request schedule, the same requests' counts are
replayed exactly beside them (properties/acceptance.py): the engine's acceptance against the
exact one, in the engines' matrix.

`measure` times greedy requests one at a time, on the speculating and the baseline server in
alternating turns; while one is measured the other's processes are paused (SIGSTOP), so the
two never compete for the cores. The ratio of the baseline's time to the speculating
server's time for the same requests is the speed-up (below 1: speculation loses, as it must
with the kit's random-weight models, whose drafts are rarely accepted).
"""

from __future__ import annotations

import os
import signal
import time

from properties.adapters.client import Client, Request, ServedError

PROMPTS = ((3, 9, 27, 3, 9, 27), (30, 1, 17, 8, 12), (0, 1, 2, 0, 1, 2, 0, 1), (5, 6, 5, 6, 5))
TOKENS = 32


def _client(dialect, server) -> Client:
    return Client(server.url, dialect=dialect, timeout=120, concurrency=1)


def evidence(engine, server, method=None) -> dict:
    """The engine's own counts of drafted and accepted tokens over a few greedy requests to
    the server of `method`."""
    dialect = engine.dialect_for(method)
    client = _client(dialect, server)
    requests = [Request(p, TOKENS) for p in PROMPTS]
    try:
        counted = dialect.count(client, requests)
    except ServedError as exc:
        return {"drafted": 0, "accepted": 0, "source": f"cannot read the counters: {exc}"}
    if counted is None:
        return {"drafted": 0, "accepted": 0,
                "source": f"{engine.title} reports no speculation counters"}
    found = {"drafted": counted.drafted, "accepted": counted.accepted, "source": counted.source}
    exact = exact_counts(engine, method, [(r.prompt, len(a.tokens)) for r, (a, *_) in
                                          zip(requests, counted.answers)])
    if exact is not None:
        found["exact"] = exact
    return found


def exact_counts(engine, method, requests) -> dict | None:
    """The exact drafted and accepted counts of greedy requests (prompt, tokens produced) under
    `method`, replayed from the kit's float64 models; None where the kit does not replay the
    method's drafter or the engine declares no schedule."""
    if method is None or not method.drafter.replays or engine.schedule is None:
        return None
    from properties import acceptance, methods
    drafted = accepted = 0
    for prompt, produced in requests:
        e = acceptance.greedy(tuple(prompt), TOKENS, methods.exact_draft(method.drafter),
                              method.k, engine.schedule,
                              produced=produced if produced < TOKENS else None,
                              eos_stops_acceptance=engine.dialect.eos_stops_acceptance)
        drafted, accepted = drafted + e.drafted, accepted + e.accepted
    return {"drafted": drafted, "accepted": accepted, "schedule": engine.schedule}


def _pause(server, on: bool) -> None:
    if server.process is not None:
        try:
            os.killpg(server.process.pid, signal.SIGSTOP if on else signal.SIGCONT)
        except ProcessLookupError:
            pass


def _time(client, requests) -> float:
    start = time.perf_counter()
    for r in requests:
        client.complete(r)
    return time.perf_counter() - start


def measure(engine, spec, base, turns: int = 3, say=print, method=None, prompts=PROMPTS,
            tokens: int = TOKENS, models: str = "kit") -> dict:
    """`prompts`, `tokens`: the greedy requests timed (default the kit's; a trained run's are
    held-out prompts of the trained tokenizer); `models`: the pair served ("kit": the kit's)."""
    requests = [Request(tuple(p), tokens) for p in prompts]
    if models == "kit":
        dialects = engine.dialect_for(method), engine.dialect_for(None)
    else:
        from properties.serve import trained
        dialects = (trained.dialect_for(engine, method, models),
                    trained.dialect_for(engine, None, models))
    clients = {"spec": _client(dialects[0], spec), "base": _client(dialects[1], base)}
    servers = {"spec": spec, "base": base}
    seconds = {"spec": [], "base": []}
    try:
        for name in ("spec", "base"):     # warm-up, both running
            _time(clients[name], requests[:1])
        for turn in range(turns):
            for name, other in (("spec", "base"), ("base", "spec")):
                _pause(servers[other], True)
                try:
                    seconds[name].append(_time(clients[name], requests))
                finally:
                    _pause(servers[other], False)
    except ServedError as exc:
        say(f"[kit] speed-up not measured: {exc}")
        return {}
    spec_s, base_s = sum(seconds["spec"]), sum(seconds["base"])
    return {"speedup": base_s / spec_s, "spec_seconds": seconds["spec"],
            "base_seconds": seconds["base"], "turns": turns,
            "tokens": tokens * len(requests), "requests_per_turn": len(requests)}
