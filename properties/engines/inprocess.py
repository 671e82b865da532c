"""The worker that serves an engine driven through its Python API: the kit talks to it as to
any server (the OpenAI completions API with token ids, /health, /metrics), so every served
check, the deaths, the restarts and the launcher apply unchanged.

It runs with the ENGINE's Python (its environment under .engines/, whose pins clash with the
project's), so it is standard library only and imports nothing of the project: the engine's
file declares a `Session` class, and this worker compiles that class alone out of the file
(its module-level imports, which are the kit's, are not run). A session class therefore
imports what it needs inside its methods and names nothing else of its file.

    class Session:
        PARAMS = ("repetition_penalty",)  # request fields it takes besides the plain ones
        def __init__(self, config): ...   # load the models (config: the engine file's JSON)
        def generate(self, prompt, params) -> (ids, finish_reason, stats)
            # prompt: list of token ids; params: temperature, top_k, top_p, seed (or None),
            # max_tokens, stop_token_ids and the PARAMS fields asked; finish_reason "stop" or
            # "length"; stats: {"drafted", "accepted", "rounds"} of this call, or None, and
            # "pieces": the lengths of the engine calls the output was assembled from, if
            # several (each from the prompt and the tokens so far)
        def counters(self) -> dict   # optional: engine-wide cumulative counts, same keys
        BATCH = 8                    # optional, with generate_batch: the most rows per call
        def generate_batch(self, prompts, params_list) -> list of (ids, finish_reason, stats)
            # optional: the requests in flight together, answered by one engine call, one
            # (ids, finish_reason, stats) per row in order (stats None where the engine
            # counts per call only: then counters() holds the call's counts)

A session without generate_batch answers one request at a time (a lock): batch size 1. With
it, the requests in flight together are gathered: the first waits WINDOW seconds for others
(the kit's batches arrive within milliseconds), and the group, at most BATCH rows, goes to
generate_batch in one call; a group of one goes to generate. Requests arriving meanwhile form
the next group. Answers:

* a field the session does not take (not plain, not in PARAMS), or n > 1: HTTP 400 naming it
  (the kit's checks say "not supported");
* an exception inside the session (the engine's API): HTTP 500 whose message starts with the
  exception and its innermost frame ("RuntimeError: ... in file.py:function", the signature
  properties/serve/deaths.py reads from a log), the traceback printed to the log; the worker
  lives on, as a server that fails one request (every request of a batched call that raised);
* a hard crash (a signal, an abort in native code) kills the worker: faulthandler prints
  "Fatal Python error" and the Python stack to the log, and the kit reports the death.

    python inprocess.py --session FILE:CLASS --port P [--config JSON] [--window SECONDS]
"""

from __future__ import annotations

import argparse
import ast
import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# request fields every session takes (or that only shape the answer, which this worker makes)
PLAIN = ("prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids",
         "n", "model", "ignore_eos", "return_token_ids", "stream")
# counter names on /metrics (Prometheus text), for an engine whose counts are engine-wide
DRAFTED = "kit_inprocess_drafted_tokens_total"
ACCEPTED = "kit_inprocess_accepted_tokens_total"
ROUNDS = "kit_inprocess_rounds_total"
MODEL = "kit-target"
# how long the first request of a group waits for others to arrive (seconds): the kit's client
# submits a batch's requests at once, so they arrive within a few milliseconds of each other
WINDOW = 0.05


def load_class(path: str, name: str):
    """The class `name` of the Python file `path`, compiled alone: no other statement of the
    file runs (its imports are the kit's, absent from an engine's environment)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    if not found:
        raise SystemExit(f"--session={path}:{name}: the file has no top-level class {name!r}")
    module = ast.Module(body=found, type_ignores=[])
    namespace = {"__name__": "inprocess_session", "__file__": path}
    exec(compile(module, path, "exec"), namespace)
    return namespace[name]


def where(exc: BaseException) -> str:
    """'Type: message in file.py:function' (the innermost frame), one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    frame = f" in {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}" if frames else ""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}{frame}"


class Refusal(ValueError):
    """A request the session cannot take: answered HTTP 400."""


class Pending:
    """One request waiting for the call that answers it: its (ids, finish_reason, stats), or
    the error of the call's exception (its signature, see `where`)."""

    def __init__(self):
        self.done = threading.Event()
        self.answer, self.error = None, None

    def fail(self, exc: BaseException):
        self.error = {"message": where(exc), "type": type(exc).__name__}
        self.done.set()


def log_failure():
    """The traceback of the exception being handled, to the log (the worker's stdout)."""
    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()


class Worker:
    def __init__(self, session, window: float = WINDOW):
        self.session = session
        self.lock = threading.Lock()     # one engine call at a time
        self.totals = {"drafted": 0, "accepted": 0, "rounds": 0}
        self.batches = hasattr(session, "generate_batch")
        self.window, self.most = window, int(getattr(session, "BATCH", 8))
        self.waiting = []                # [(prompt, params, Pending)] not yet in a call
        self.arrived = threading.Condition()
        if self.batches:
            threading.Thread(target=self.gather, daemon=True, name="batcher").start()

    def params(self, body: dict) -> dict:
        taken = set(PLAIN) | set(getattr(self.session, "PARAMS", ()))
        extra = sorted(k for k in body if k not in taken)
        if extra:
            raise Refusal(f"not supported by this engine's session: {', '.join(extra)}")
        if int(body.get("n", 1)) != 1:
            raise Refusal(f"n={body.get('n')}: one completion per request")
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise Refusal(f"prompt must be a non-empty list of token ids, got {str(prompt)[:80]}")
        params = {"max_tokens": int(body["max_tokens"]),
                  "temperature": float(body.get("temperature", 1.0)),
                  "top_k": int(body.get("top_k") or 0), "top_p": float(body.get("top_p", 1.0)),
                  "seed": body.get("seed"), "stop_token_ids": list(body.get("stop_token_ids") or ())}
        params.update({k: body[k] for k in getattr(self.session, "PARAMS", ()) if k in body})
        return params

    def complete(self, body: dict) -> tuple[int, dict]:
        try:
            params = self.params(body)
        except (Refusal, KeyError, TypeError, ValueError) as exc:
            return 400, {"error": {"message": str(exc), "type": "BadRequestError"}}
        if self.batches:
            pending = self.batched(list(body["prompt"]), params)
        else:
            pending = Pending()
            with self.lock:
                try:
                    pending.answer = self.session.generate(list(body["prompt"]), params)
                except Exception as exc:   # the engine's API failed this request: answered
                    log_failure()
                    pending.fail(exc)
        if pending.error is not None:
            return 500, {"error": pending.error}
        ids, finish, stats = pending.answer
        ids = [int(t) for t in ids]
        choice = {"index": 0, "token_ids": ids, "finish_reason": finish}
        if stats is not None:
            choice["speculation"] = {k: int(stats.get(k) or 0) for k in self.totals}
            if stats.get("pieces"):   # lengths of the engine calls the output was made of
                choice["pieces"] = [int(n) for n in stats["pieces"]]
            with self.lock:
                for k in self.totals:
                    self.totals[k] += choice["speculation"][k]
        return 200, {"object": "text_completion", "model": MODEL, "choices": [choice]}

    def batched(self, prompt, params) -> "Pending":
        """This request, answered inside the group it lands in (or failed with its call)."""
        pending = Pending()
        with self.arrived:
            self.waiting.append((prompt, params, pending))
            self.arrived.notify()
        pending.done.wait()
        return pending

    def gather(self):
        """The batcher thread: forever, wait for a request, give others WINDOW to join it, and
        answer the group (at most BATCH rows) with one engine call."""
        while True:
            with self.arrived:
                while not self.waiting:
                    self.arrived.wait()
            time.sleep(self.window)
            with self.arrived:
                group, self.waiting = self.waiting[:self.most], self.waiting[self.most:]
            self.answer(group)

    def answer(self, group):
        prompts, params = [g[0] for g in group], [g[1] for g in group]
        try:
            with self.lock:
                if len(group) == 1:
                    answers = [self.session.generate(prompts[0], params[0])]
                else:
                    answers = list(self.session.generate_batch(prompts, params))
            if len(answers) != len(group):
                raise RuntimeError(f"generate_batch answered {len(answers)} rows for a call of "
                                   f"{len(group)}")
        except Exception as exc:   # the call failed: every request in it fails with its signature
            log_failure()
            for _, _, pending in group:
                pending.fail(exc)
            return
        for (_, _, pending), answer in zip(group, answers):
            pending.answer = tuple(answer)
            pending.done.set()

    def metrics(self) -> str:
        counts = self.session.counters() if hasattr(self.session, "counters") else self.totals
        return "".join(f"# TYPE {name} counter\n{name} {float(counts.get(key) or 0)}\n"
                       for name, key in ((DRAFTED, "drafted"), (ACCEPTED, "accepted"),
                                         (ROUNDS, "rounds")))


def handler(worker: Worker):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status, payload, kind="application/json"):
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": MODEL}]})
            elif self.path == "/metrics":
                self.send(200, worker.metrics(), "text/plain")
            else:
                self.send(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            if self.path != "/v1/completions":
                self.rfile.read(length)
                return self.send(404, {"error": f"no route {self.path}"})
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as exc:
                return self.send(400, {"error": {"message": f"not JSON: {exc}"}})
            if not isinstance(body, dict):
                return self.send(400, {"error": {"message": "the body must be a JSON object"}})
            self.send(*worker.complete(body))

    return Handler


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="inprocess.py")
    parser.add_argument("--session", required=True, metavar="FILE:CLASS")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", default="{}", help="JSON given to the session")
    parser.add_argument("--window", type=float, default=WINDOW, metavar="SECONDS",
                        help="how long a batch's first request waits for others "
                             "(a session with generate_batch)")
    args = parser.parse_args(argv)
    faulthandler.enable()    # a crash in native code leaves its Python stack in the log
    # run as a script, Python puts this folder first on sys.path, where an engine file named
    # as its engine's package would shadow that package in the session's imports
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    path, _, name = args.session.rpartition(":")
    if not path or not name:
        parser.error(f"--session={args.session}: expected FILE:CLASS")
    session = load_class(path, name)(json.loads(args.config))
    if not args.window >= 0:
        parser.error(f"--window={args.window}: expected seconds >= 0")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(Worker(session, args.window)))
    server.daemon_threads = True
    print(f"{name} of {path} answers on http://127.0.0.1:{args.port}/v1", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
