"""An HTTP client for OpenAI-compatible completion servers: bounded concurrency, timeouts,
and the two request dialects the kit speaks.

* ``openai``: the completions API as vLLM and SGLang extend it: the prompt as token ids,
  ``stop_token_ids``, ``top_k``, ``ignore_eos``, ``n``, ``seed``, ``return_token_ids``.
* ``transformers``: ``transformers serve``, whose /v1/completions takes a text prompt and a
  ``generation_config`` JSON string (sampling settings, stop ids as ``eos_token_id``, and
  speculation such as ``prompt_lookup_num_tokens``), and returns text only.

Token ids travel as ids where the server takes and returns them; otherwise through the served
models' tokenizer, whose text <-> ids map is exact (properties.models.tokenizer). When a
response carries both ids and text, they must agree.

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

from properties.adapters import dialects
from properties.models import tokenizer
from reference.sampling import SamplingParams

APIS = ("auto", "openai", "transformers", "llamacpp")


def curl_line(url: str, body: dict) -> str:
    """The request as a shell command anyone can replay."""
    return (f"curl -sS {shlex.quote(url)} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body, sort_keys=True))}")


class ServedError(Exception):
    """The server could not be used for a request: the message says why, naming the URL."""


class Unreachable(ServedError):
    pass


class ServedTimeout(ServedError):
    pass


class HttpError(ServedError):
    def __init__(self, message, status: int):
        super().__init__(message)
        self.status = status


class BadResponse(ServedError):
    pass


@dataclass(frozen=True)
class Request:
    """One completion request in the kit's terms (token ids, never text)."""

    prompt: tuple
    max_tokens: int
    sampling: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class Completion:
    tokens: tuple
    finish_reason: str | None
    # the engine's own draft statistics for this completion, where its response carries them
    drafted: int | None = None
    accepted: int | None = None
    # lengths of the requests a completion was assembled from, when it took several (llama.cpp
    # continued past its end-of-sequence id); empty for one request
    pieces: tuple = ()


@dataclass
class Traffic:
    """What the client has sent: for the summary's requests per second."""

    requests: int = 0           # HTTP completion requests answered
    completions: int = 0
    drafted: int = 0            # the engine's per-response draft statistics, summed
    accepted: int = 0
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
    """Completions from one server. `extra_generation_config` is merged into every request's
    generation_config (dialect transformers): how the kit turns prompt lookup on."""

    def __init__(self, url: str, *, api: str = "auto", model: str | None = None,
                 timeout: float = 60.0, concurrency: int = 8,
                 extra_generation_config: dict | None = None,
                 dialect: dialects.Dialect = dialects.GENERIC):
        if api not in APIS:
            raise ValueError(f"api={api!r}: choose from {APIS}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not (isinstance(concurrency, int) and concurrency >= 1):
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.url = url
        self.scheme, self.host, self.port, self.base = parse_url(url)
        self.dialect = dialect
        self.api = dialect.api if api == "auto" and dialect.api != "auto" else api
        self.model = model
        self.watchdog = None    # properties.serve.deaths.Watchdog, set by the plugin: is a failure a death?
        self.timeout = float(timeout)
        self.concurrency = concurrency
        self.extra_generation_config = dict(extra_generation_config or {})
        self.supports_n: bool | None = None     # learned from the first request with n > 1
        self.traffic = Traffic()
        self._local = threading.local()
        self._resolved = False

    def __repr__(self):
        return f"Client({self.url!r}, api={self.api!r})"

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

    def get_text(self, path: str) -> str:
        return self.call("GET", path).decode("utf-8", "replace")

    def get_root_text(self, path: str) -> str:
        """GET a path at the server's root (not under the base path), e.g. /metrics."""
        status, data = self._exchange("GET", path, None)
        if status >= 400:
            raise HttpError(f"GET {self.scheme}://{self.host}:{self.port}{path} answered HTTP "
                            f"{status}", status)
        return data.decode("utf-8", "replace")

    # ----------------------------------------------------------------- the dialects

    def resolve(self) -> None:
        """Learn the served model's name and, for api=auto, the dialect (once)."""
        if self._resolved:
            return
        if self.model is None:
            listing = self.call_json("GET", "/models")
            data = listing.get("data") if isinstance(listing, dict) else None
            if not data or not isinstance(data, list) or "id" not in data[0]:
                raise BadResponse(f"GET {self.url.rstrip('/')}/models lists no model: "
                                  f"{str(listing)[:300]}")
            self.model = str(data[0]["id"])
        if self.api == "auto":
            probe = Request(prompt=(0,), max_tokens=1)
            try:
                self.api = "openai"
                self._complete(probe)
            except HttpError as exc:
                if exc.status not in (400, 422):
                    raise
                self.api = "transformers"
                try:
                    self._complete(probe)
                except HttpError as second:
                    self.api = "auto"
                    raise HttpError(f"{self.url}: neither request dialect is accepted. openai "
                                    f"(token-id prompt): {exc}; transformers (text prompt): "
                                    f"{second}", second.status) from None
        self._resolved = True

    def body(self, req: Request) -> dict:
        """The JSON body this client sends for `req` (its dialect's request shape)."""
        return self._body(req)

    def _body(self, req: Request) -> dict:
        sampling = req.sampling.temperature > 0
        if self.api == "transformers":
            config = {"do_sample": sampling, "max_new_tokens": req.max_tokens, "min_new_tokens": 0,
                      "eos_token_id": list(req.sampling.stop_ids) or None, "top_k": req.sampling.top_k,
                      "top_p": req.sampling.top_p}
            if sampling:
                config["temperature"] = req.sampling.temperature
            config.update(self.extra_generation_config)
            body = {"model": self.model, "prompt": tokenizer.decode(req.prompt),
                    "max_tokens": req.max_tokens, "generation_config": json.dumps(config)}
            if req.sampling.seed is not None:
                body["seed"] = req.sampling.seed
            return body
        if self.api == "llamacpp":
            # llama-server's own /completion: token-id prompt, tokens back, one completion
            # per request, stops as strings (one character per kit token)
            body = {"prompt": list(req.prompt), "n_predict": req.max_tokens,
                    "temperature": req.sampling.temperature, "top_k": req.sampling.top_k, "top_p": req.sampling.top_p,
                    "stream": False}
            body.update(self.dialect.neutral)
            if req.sampling.stop_ids:
                body["stop"] = [tokenizer.decode([t]) for t in req.sampling.stop_ids]
            if req.sampling.seed is not None:
                body["seed"] = req.sampling.seed
            return body
        body = {"model": self.model, "prompt": list(req.prompt), "max_tokens": req.max_tokens,
                "temperature": req.sampling.temperature, "top_p": req.sampling.top_p, "n": req.sampling.n,
                "ignore_eos": True, "return_token_ids": True, "stream": False}
        body.update(self.dialect.neutral)
        if req.sampling.top_k:
            body["top_k"] = req.sampling.top_k
        if req.sampling.stop_ids:
            body["stop_token_ids"] = list(req.sampling.stop_ids)
        if req.sampling.seed is not None:
            body["seed"] = req.sampling.seed
        return body

    def _post(self, body: dict):
        """POST one completion request; a failure goes to the watchdog first (a death is a
        finding, raised as ServerDied), then is raised as it is."""
        path, root = ("/completion", True) if self.api == "llamacpp" else ("/completions", False)
        try:
            return self.call_json("POST", path, body, root=root)
        except ServedError as exc:
            if self.watchdog is not None and (
                    not isinstance(exc, HttpError) or exc.status >= 500):
                url = self._root() + (path if root else self.base + path)
                self.watchdog.examine(url, body, exc)
            raise

    def _complete(self, req: Request) -> list[Completion]:
        if self.api == "llamacpp":
            out = [self._complete_llamacpp(req)]
        else:
            out = self.read_answer(self._post(self._body(req)), req)
        with self.traffic.lock:
            self.traffic.requests += 1
            self.traffic.drafted += sum(c.drafted or 0 for c in out)
            self.traffic.accepted += sum(c.accepted or 0 for c in out)
        return out

    def _complete_llamacpp(self, req: Request) -> Completion:
        """One completion from llama-server, continued past its end-of-sequence id.

        llama.cpp gives a BPE vocabulary without an end-of-sequence token the default id 11,
        which is one of the kit's ordinary tokens; `ignore_eos` would forbid it outright.
        So the request leaves it on, and a completion that stopped there (stop_type "eos")
        is continued by a new request whose prompt is the prompt and the tokens so far: by
        the chain rule the continuation is drawn from the right conditional law, and a greedy
        one is the same argmax sequence. Seeds of continuations derive from the request's."""
        tokens, drafted, accepted, part, pieces = (), 0, 0, req, ()
        while True:
            (got,) = self.read_answer(self._post(self._body(part)), part)
            tokens += got.tokens
            pieces += (len(got.tokens),)
            drafted += got.drafted or 0
            accepted += got.accepted or 0
            stopped_by_request = bool(tokens) and tokens[-1] in req.sampling.stop_ids
            if (got.finish_reason != "eos" or len(tokens) >= req.max_tokens
                    or stopped_by_request or not got.tokens):
                reason = got.finish_reason
                if reason == "eos":   # id 11 is no stop of the kit's: only the length ended it
                    reason = "stop" if stopped_by_request else "length"
                return Completion(tokens, reason, drafted, accepted,
                                  pieces if len(pieces) > 1 else ())
            seed = None if req.sampling.seed is None else (req.sampling.seed * 1_000_003 + len(tokens)) % 2**31
            part = replace(req, prompt=tuple(req.prompt) + tokens,
                           max_tokens=req.max_tokens - len(tokens),
                           sampling=replace(req.sampling, seed=seed))

    def read_answer(self, answer, req: Request) -> list[Completion]:
        """The completions of one response body (parsed JSON) to request `req`, read by this
        client's dialect."""
        where = f"POST {self.url.rstrip('/')}/completions"
        if self.api == "llamacpp":
            if not isinstance(answer, dict) or "content" not in answer:
                raise BadResponse(f"{where}: no content in {str(answer)[:300]}")
            choices = [answer]
        else:
            choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices:
            raise BadResponse(f"{where}: no choices in {str(answer)[:300]}")
        return [self._read(choice, req)
                for choice in sorted(choices, key=lambda c: c.get("index", 0))]

    def _read(self, choice: dict, req: Request) -> Completion:
        if self.api != "llamacpp":
            return Completion(self._tokens(choice, req), choice.get("finish_reason"))
        where = f"POST {self._root()}/completion"
        ids = choice.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                for t in ids):
            raise BadResponse(f"{where}: no token list in {str(choice)[:300]} (return_tokens)")
        tokens = tuple(ids)
        stop_type = choice.get("stop_type")
        word = choice.get("stopping_word") or ""
        if stop_type == "word" and word:
            stop = tokenizer.encode(word)
            # the stop word's token is kept at the end of `tokens` or not, depending on the
            # version; the kit's convention keeps it
            if len(stop) == 1 and not (tokens and tokens[-1] == stop[0]):
                tokens = tokens + tuple(stop)
        reason = {"word": "stop", "limit": "length"}.get(stop_type, stop_type)
        timings = choice.get("timings") or {}
        drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        if drafted is None and isinstance(timings, dict) and "predicted_n" in timings:
            drafted, accepted = 0, 0    # llama-server omits them when nothing was drafted
        return Completion(tokens, reason, drafted, accepted)

    def _tokens(self, choice: dict, req: Request | None = None) -> tuple:
        ids = choice.get("token_ids")
        text = choice.get("text")
        where = f"POST {self.url.rstrip('/')}/completions"
        from_text = None
        if isinstance(text, str):
            try:
                from_text = tuple(tokenizer.encode(text))
            except tokenizer.TokenizeError as exc:
                if ids is None:
                    raise BadResponse(f"{where}: the completion text is not over the served "
                                      f"models' vocabulary (is the kit's target served?): {exc}") from None
        if isinstance(ids, list):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise BadResponse(f"{where}: token_ids holds a non-integer: {ids[:20]}")
            ids = tuple(ids)
            stops = set(req.sampling.stop_ids) if req is not None else set()
            # dialect: a matched stop id ends token_ids but is left out of the text (vLLM)
            stop_cut = bool(ids) and ids[-1] in stops and from_text == ids[:-1]
            if from_text is not None and from_text != ids and not stop_cut:
                raise BadResponse(f"{where}: token_ids {list(ids)} and text {text!r} disagree")
            return ids
        if from_text is None:
            raise BadResponse(f"{where}: a choice with neither token_ids nor text: {str(choice)[:300]}")
        return from_text

    # ----------------------------------------------------------------- public

    def complete(self, req: Request) -> list[Completion]:
        """The request's completions: n of them (several requests where n is not supported)."""
        self.resolve()
        if req.sampling.n > 1 and (self.api in ("transformers", "llamacpp")
                          or self.dialect.honours_n is False):
            self.supports_n = False   # transformers serve ignores n (it logs a warning)
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
