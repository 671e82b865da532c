"""An HTTP client for OpenAI-compatible completion servers: transport, timeouts, bounded
concurrency, `n`, traffic, and the watchdog that tells a dead server from a failed request.

It knows no engine. What goes into a request and how an answer is read is its dialect's
(properties.adapters.dialects.Dialect: the OpenAI completions API by default; each engine's
file in properties/engines/ declares its own). Token ids travel as ids where the server takes
and returns them; otherwise through the served models' tokenizer, whose text <-> ids map is
exact (properties.models.tokenizer).

Every failure is a ServedError naming the URL and what went wrong; nothing waits forever
(each request has a timeout, and a pool of `concurrency` threads bounds what is in flight).
"""

from __future__ import annotations

import http.client
import json
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from properties.adapters.dialects import OPENAI, Dialect
from properties.adapters.protocol import (BadResponse, Completion, HttpError, Request,
                                          ServedError, ServedTimeout, Unreachable)

__all__ = ["BadResponse", "Client", "Completion", "HttpError", "Request", "ServedError",
           "ServedTimeout", "Traffic", "Unreachable", "curl_line", "parse_url"]


def curl_line(url: str, body: dict) -> str:
    """The request as a shell command anyone can replay."""
    return (f"curl -sS {shlex.quote(url)} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body, sort_keys=True))}")


@dataclass
class Traffic:
    """What the client has sent: for the summary's requests per second."""

    requests: int = 0           # HTTP completion requests answered
    completions: int = 0
    busy_seconds: float = 0.0   # wall time during which at least one batch was in flight
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def rate(self) -> float:
        return self.requests / self.busy_seconds if self.busy_seconds > 0 else 0.0


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of an http(s) URL; ValueError names a bad one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL {url!r} must look like http://HOST:PORT/v1")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"server URL {url!r} has an invalid port") from None
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


class Client:
    """Completions from one server, in `dialect` (the OpenAI completions API by default)."""

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 60.0,
                 concurrency: int = 8, dialect: Dialect = OPENAI):
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not (isinstance(concurrency, int) and concurrency >= 1):
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.url = url
        self.scheme, self.host, self.port, self.base = parse_url(url)
        self.dialect = dialect
        self.model = model
        self.watchdog = None    # properties.serve.deaths.Watchdog, set by the plugin: is a failure a death?
        self.timeout = float(timeout)
        self.concurrency = concurrency
        self.supports_n: bool | None = None     # learned from the first request with n > 1
        self.traffic = Traffic()
        self._local = threading.local()
        self._resolved = False

    def __repr__(self):
        return f"Client({self.url!r}, dialect={self.dialect.name!r})"

    # ----------------------------------------------------------------- transport

    def _connection(self, fresh=False):
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _exchange(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        where = f"{method} {self.url.rstrip('/')}{path[len(self.base):] if path.startswith(self.base) else path}"
        for attempt in (0, 1):
            conn = self._connection(fresh=attempt == 1)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (socket.timeout, TimeoutError):
                conn.close()
                self._local.conn = None
                raise ServedTimeout(f"{where}: no answer within {self.timeout:g} s (raise it with "
                                    f"--served-timeout=SECONDS)") from None
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                # a kept-alive connection the server closed: one retry on a fresh one
                if attempt == 1:
                    raise Unreachable(f"{where}: the server closed the connection "
                                      f"({type(exc).__name__}: {exc})") from None
            except (ConnectionRefusedError, socket.gaierror, OSError) as exc:
                conn.close()
                self._local.conn = None
                raise Unreachable(f"{where}: cannot connect to {self.host}:{self.port} "
                                  f"({type(exc).__name__}: {exc}); is the server running?") from None
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, body: dict | None = None,
             root: bool = False) -> bytes:
        """One HTTP exchange under the base path (`root`: at the server's root, e.g. llama.cpp's
        /completion); HttpError for a status >= 400, with a curl replay for a 5xx."""
        full = path if root else self.base + path
        status, data = self._exchange(method, full, body)
        if status >= 400:
            text = data.decode("utf-8", "replace").strip()
            replay = (f"\nreplay: {curl_line(self._root() + full, body)}"
                      if body is not None and status >= 500 else "")
            raise HttpError(f"{method} {self._root()}{full} answered HTTP {status}: "
                            f"{text[:500]}{replay}", status)
        return data

    def _root(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def call_json(self, method: str, path: str, body: dict | None = None, root: bool = False):
        data = self.call(method, path, body, root=root)
        try:
            return json.loads(data)
        except ValueError:
            raise BadResponse(f"{method} {self.url.rstrip('/')}{path}: the answer is not JSON: "
                              f"{data[:200]!r}") from None

    def get_root_text(self, path: str) -> str:
        """GET a path at the server's root (not under the base path), e.g. /metrics."""
        status, data = self._exchange("GET", path, None)
        if status >= 400:
            raise HttpError(f"GET {self.scheme}://{self.host}:{self.port}{path} answered HTTP "
                            f"{status}", status)
        return data.decode("utf-8", "replace")

    # ----------------------------------------------------------------- the dialect

    def resolve(self) -> None:
        """Learn the served model's name and the dialect to speak (once)."""
        if self._resolved:
            return
        if self.model is None:
            listing = self.call_json("GET", "/models")
            data = listing.get("data") if isinstance(listing, dict) else None
            if not data or not isinstance(data, list) or "id" not in data[0]:
                raise BadResponse(f"GET {self.url.rstrip('/')}/models lists no model: "
                                  f"{str(listing)[:300]}")
            self.model = str(data[0]["id"])
        self.dialect = self.dialect.resolve(self)
        self._resolved = True

    def body(self, req: Request) -> dict:
        """The JSON body this client sends for `req` (its dialect's request shape)."""
        return self.dialect.body(req, self.model)

    def where(self) -> str:
        """The completions endpoint, as error messages name it."""
        d = self.dialect
        return f"POST {self._root() + d.path if d.at_root else self.url.rstrip('/') + d.path}"

    def post(self, body: dict):
        """POST one completion request at the dialect's path; a failure goes to the watchdog
        first (a death is a finding, raised as ServerDied), then is raised as it is."""
        path, root = self.dialect.path, self.dialect.at_root
        try:
            return self.call_json("POST", path, body, root=root)
        except ServedError as exc:
            if self.watchdog is not None and (
                    not isinstance(exc, HttpError) or exc.status >= 500):
                url = self._root() + (path if root else self.base + path)
                self.watchdog.examine(url, body, exc)
            raise

    def read_answer(self, answer, req: Request) -> list[Completion]:
        """The completions of one response body (parsed JSON) to request `req`, read by this
        client's dialect."""
        return self.dialect.read(answer, req, self.where())

    def _complete(self, req: Request) -> list[Completion]:
        out = self.dialect.complete(self, req)
        with self.traffic.lock:
            self.traffic.requests += 1
        return out

    # ----------------------------------------------------------------- public

    def complete(self, req: Request) -> list[Completion]:
        """The request's completions: n of them (several requests where n is not supported)."""
        self.resolve()
        if req.sampling.n > 1 and self.dialect.honours_n is False:
            self.supports_n = False   # e.g. transformers serve ignores n (it logs a warning)
        if req.sampling.n > 1 and self.supports_n is False:
            return [c for i in range(req.sampling.n)
                    for c in self._complete(_single(req, i))]
        got = self._complete(req)
        if req.sampling.n > 1:
            if len(got) == req.sampling.n:
                self.supports_n = True
            elif len(got) == 1 and self.supports_n is None:
                self.supports_n = False
                got += [c for i in range(1, req.sampling.n) for c in self._complete(_single(req, i))]
            else:
                raise BadResponse(f"{self.url}: asked for n={req.sampling.n} completions, got {len(got)}")
        elif len(got) != 1:
            raise BadResponse(f"{self.url}: asked for one completion, got {len(got)}")
        return got

    def complete_many(self, requests: list[Request]) -> list[list[Completion]]:
        """All requests, at most `concurrency` in flight; results in request order. The first
        error is raised once every request has finished or failed."""
        self.resolve()
        start = time.perf_counter()
        try:
            if self.concurrency == 1 or len(requests) <= 1:
                results = [self.complete(r) for r in requests]
            else:
                with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)),
                                        thread_name_prefix="kit-served") as pool:
                    results = list(pool.map(self.complete, requests))
        finally:
            with self.traffic.lock:
                self.traffic.busy_seconds += time.perf_counter() - start
        with self.traffic.lock:
            self.traffic.completions += sum(len(r) for r in results)
        return results


def _single(req: Request, i: int) -> Request:
    """The i-th of n single requests standing in for one request with n: its own seed."""
    seed = None if req.sampling.seed is None else (req.sampling.seed * 1_000_003 + i) % 2**31
    return replace(req, sampling=replace(req.sampling, n=1, seed=seed))
