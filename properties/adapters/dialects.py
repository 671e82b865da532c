"""How a server speaks: the OpenAI completions API (the default dialect, `Dialect`), and the
shared pieces an engine's own dialect builds on (a Prometheus text parser for its counters).

A dialect is never a defect. Servers differ in habits that have nothing to do with lossless
speculation: a matched stop token is kept in `token_ids` or dropped from `text`; default
sampling settings (repetition penalties, min_p, a top-k of 40, a generation config read from
the checkpoint) apply unless the request overrides them; `n` may be ignored; the request may
go to another path in another shape. Each engine's file (properties/engines/) declares its
dialect as a `Dialect` or a subclass of it:

    name, neutral          its name; the settings sent with every request, so that the
                           server's own defaults cannot change the law
    stop_in_ids/_in_text   whether a matched stop id is kept in token_ids / in the text
    honours_n              whether one request may ask for n completions
    path, at_root          where completions are requested (under the base URL, or at the root)
    body(req, model)       the JSON body of a Request
    read(answer, req, at)  the Completions of one parsed answer
    complete(client, req)  one request's Completions (a dialect may send several requests)
    resolve(client)        the dialect to use once the server is known (itself, here)
    kit_options()          pytest options that ask for this dialect by hand (recipes)
    counters(client)       the engine's server-wide speculation counters now, or None
    per_response           True: each completion carries the engine's draft statistics
    count(client, reqs)    the engine's own drafted/accepted counts for requests sent alone
    counters_missing(cl.)  why the counters cannot be read (None: they can, or must)

The client (properties.adapters.client) calls these and knows no engine. The readings are
shown right by tests against responses recorded from the real servers (tests/recorded/,
written by tests/recorded/capture.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from properties.adapters.protocol import BadResponse, Completion, Counted, Counters, Request
from properties.models import tokenizer


@dataclass(frozen=True)
class Dialect:
    """The OpenAI completions API as vLLM and SGLang extend it: the prompt as token ids,
    ``stop_token_ids``, ``top_k``, ``ignore_eos``, ``n``, ``seed``, ``return_token_ids``;
    choices with ``token_ids`` and/or ``text``. It keeps no speculation counters."""

    name: str = "openai"
    # sent with every request: the server's own defaults must not change the law
    neutral: dict = field(default_factory=dict)
    # a matched stop id: kept at the end of token_ids? left in the text? (None: either)
    stop_in_ids: bool | None = None
    stop_in_text: bool | None = None
    # a matched stop string: its tokens kept at the end of token_ids? (None: either)
    stop_string_in_ids: bool | None = None
    # the server honours `n` (several completions per request); None: learned by asking
    honours_n: bool | None = None
    notes: tuple = ()
    path: str = "/completions"
    at_root: bool = False
    # each completion carries the engine's draft statistics (Completion.drafted / .accepted)
    per_response: bool = False
    # the engine's formula for penalties, min_p and logit_bias (reference.penalties.Formula),
    # read from its source; None: the kit knows none (served_params compares with the baseline)
    formula: object = None
    # parameters its API cannot take at all (-> why), and those it refuses under speculation
    unsupported: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    # the engine accepts no drafted token after an end-of-sequence id and counts a drafted one
    # only as its round's last proposal (properties/acceptance.py replay): its counters of a
    # request that stopped there are replayed so
    eos_stops_acceptance: bool = False

    # ------------------------------------------------------------------- requests

    def resolve(self, client) -> "Dialect":
        """The dialect to speak once the server is reached (a probing dialect picks one)."""
        return self

    def body(self, req: Request, model) -> dict:
        body = {"model": model, "prompt": list(req.prompt), "max_tokens": req.max_tokens,
                "temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
                "n": req.sampling.n, "ignore_eos": True, "return_token_ids": True,
                "stream": False}
        body.update(self.neutral)
        if req.sampling.top_k:
            body["top_k"] = req.sampling.top_k
        if req.sampling.stop_ids:
            body["stop_token_ids"] = list(req.sampling.stop_ids)
        if req.sampling.seed is not None:
            body["seed"] = req.sampling.seed
        body.update(shaping(req.sampling))
        return body

    def complete(self, client, req: Request) -> list[Completion]:
        """The Completions of one request (one HTTP exchange here)."""
        return self.read(client.post(self.body(req, client.model)), req, client.where())

    def with_generation_config(self, config: dict) -> "Dialect":
        """This dialect with --served-generation-config merged into its requests; a dialect
        whose requests carry no generation config refuses a non-empty one (ValueError)."""
        if config:
            raise ValueError(f"the {self.name} dialect sends no generation_config, so "
                             f"{config!r} cannot be applied")
        return self

    def kit_options(self) -> tuple:
        """The kit's command-line options that ask for this dialect by hand (besides
        --served-engine), e.g. a per-request generation config."""
        return ()

    # ------------------------------------------------------------------- answers

    def choices(self, answer, where: str) -> list:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices:
            raise BadResponse(f"{where}: no choices in {str(answer)[:300]}")
        return sorted(choices, key=lambda c: c.get("index", 0))

    def read(self, answer, req: Request, where: str) -> list[Completion]:
        """The completions of one response body (parsed JSON) to request `req`."""
        return [self.read_choice(choice, req, where) for choice in self.choices(answer, where)]

    def read_choice(self, choice: dict, req: Request, where: str) -> Completion:
        text = choice.get("text") if isinstance(choice.get("text"), str) else None
        return Completion(self.tokens(choice, req, where), choice.get("finish_reason"),
                          logprobs=openai_logprobs(choice.get("logprobs"), where), text=text)

    def tokens(self, choice: dict, req: Request | None, where: str) -> tuple:
        """A choice's token ids: `token_ids` where given (checked against `text`), else the
        text through the served models' tokenizer (its text <-> ids map is exact)."""
        ids = choice.get("token_ids")
        text = choice.get("text")
        from_text = None
        if isinstance(text, str):
            try:
                from_text = tuple(tokenizer.encode(text))
            except tokenizer.TokenizeError as exc:
                if ids is None:
                    raise BadResponse(f"{where}: the completion text is not over the served "
                                      f"models' vocabulary (is the kit's target served?): "
                                      f"{exc}") from None
        if isinstance(ids, list):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise BadResponse(f"{where}: token_ids holds a non-integer: {ids[:20]}")
            ids = tuple(ids)
            stops = set(req.sampling.stop_ids) if req is not None else set()
            # a matched stop id may end token_ids but be left out of the text (vLLM)
            stop_cut = bool(ids) and ids[-1] in stops and from_text == ids[:-1]
            strings = req.sampling.stop_strings if req is not None else ()
            if from_text is not None and strings and not stop_cut:
                # a matched stop string may be cut from the text and kept in token_ids (vLLM);
                # whether the output stopped in the right place is the check's to judge
                rest = tokenizer.decode(ids[len(from_text):]) if ids[:len(from_text)] == from_text else None
                stop_cut = rest is not None and any(rest.startswith(x) for x in strings)
            if from_text is not None and from_text != ids and not stop_cut:
                raise BadResponse(f"{where}: token_ids {list(ids)} and text {text!r} disagree")
            return ids
        if from_text is None:
            raise BadResponse(f"{where}: a choice with neither token_ids nor text: "
                              f"{str(choice)[:300]}")
        return from_text

    # ------------------------------------------------------------------- counters

    def counters(self, client) -> Counters | None:
        """The engine's server-wide speculation counters now (cumulative), or None where it
        keeps none there (the OpenAI API has none). ServedError when it should and cannot."""
        return None

    def count(self, client, requests) -> Counted | None:
        """Send `requests` and return what the engine itself says it drafted and accepted for
        them: per-response draft statistics, or the difference of its server-wide counters
        around them (nothing else may reach the server meanwhile). None where the engine
        reports no counters (then nothing is sent)."""
        kind = "greedy " if all(r.sampling.temperature == 0 for r in requests) else ""
        if self.per_response:
            answers = client.complete_many(requests)
            done = [c for a in answers for c in a]
            if any(c.drafted is None for c in done):
                raise BadResponse(f"{client.url}: the response carries no draft statistics")
            return Counted(sum(c.drafted for c in done), sum(c.accepted or 0 for c in done),
                           answers, f"draft statistics of {len(requests)} {kind}responses")
        before = self.counters(client)
        if before is None:
            return None
        answers = client.complete_many(requests)
        after = self.counters(client)
        rounds = (None if after.rounds is None or before.rounds is None
                  else after.rounds - before.rounds)
        return Counted(after.drafted - before.drafted, after.accepted - before.accepted,
                       answers, f"{after.source} counters over {len(requests)} {kind}requests",
                       rounds)

    def for_pair(self, models: str) -> "Dialect":
        """This dialect for requests on the trained pair `models` names ("kit": the kit's own
        models): token ids need nothing of the pair, so itself; a dialect that speaks text
        (transformers serve) returns one that goes through the pair's tokenizer."""
        return self

    def counters_missing(self, client) -> str | None:
        """Why the engine's speculation counters cannot be read (a check that needs them
        cannot judge), or None. An engine that declares counters gets None: failing to read
        them is then a failure of the check, not a reason to skip it."""
        if self.per_response or type(self).counters is not Dialect.counters:
            return None
        return (f"cannot judge: {client.url} ({self.name}) reports no speculative-decoding "
                f"counters the kit can read")


# ----------------------------------------------------------------------- sampling fields

def shaping(s) -> dict:
    """The OpenAI API's fields (and vLLM's extensions) for what besides temperature, top-k and
    top-p a request asks, each only when it is on: the body of a plain request is unchanged."""
    body = {}
    if s.repetition_penalty != 1.0:
        body["repetition_penalty"] = s.repetition_penalty
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.min_p:
        body["min_p"] = s.min_p
    if s.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in s.logit_bias}   # JSON keys are strings
    if s.stop_strings:
        body["stop"] = list(s.stop_strings)
    if s.logprobs is not None:
        body["logprobs"] = s.logprobs
    return body


def token_of(text, where: str) -> int:
    """A token as an answer names it: its text (one character per kit token) or vLLM's
    "token_id:N" form."""
    if isinstance(text, str) and text.startswith("token_id:"):
        return int(text.split(":", 1)[1])
    ids = tokenizer.encode(text) if isinstance(text, str) else None
    if ids is None or len(ids) != 1:
        raise BadResponse(f"{where}: {text!r} in the logprobs is no single token of the kit's "
                          f"vocabulary")
    return ids[0]


def openai_logprobs(entry, where: str) -> tuple | None:
    """The completions API's `logprobs` object (tokens, token_logprobs, top_logprobs) as
    Completion.logprobs: per token (logprob, ((token, logprob), ...)); None when absent."""
    if not isinstance(entry, dict) or entry.get("token_logprobs") is None:
        return None
    values = entry["token_logprobs"]
    tops = entry.get("top_logprobs") or [None] * len(values)
    out = []
    for value, top in zip(values, tops):
        alternatives = tuple((token_of(t, where), float(lp)) for t, lp in (top or {}).items())
        out.append((None if value is None else float(value), alternatives))
    return tuple(out)


# ----------------------------------------------------------------------- Prometheus

def prometheus_sum(text: str, names) -> float | None:
    """The sum of every sample of the named counters in Prometheus text format (a counter may
    appear once per label set); None when the page has none of them."""
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[-1])
            except ValueError:
                raise BadResponse(f"/metrics: cannot read the value of {line[:200]!r}") from None
            seen = True
    return total if seen else None


def prometheus_counters(text: str, drafted, accepted, path: str = "/metrics",
                        rounds=()) -> Counters | None:
    """Counters from a Prometheus page's text; None when it lacks either (`rounds`: the
    counter of drafting rounds, where the engine has one)."""
    d, a = prometheus_sum(text, drafted), prometheus_sum(text, accepted)
    r = prometheus_sum(text, rounds) if rounds else None
    return None if d is None or a is None else Counters(d, a, path, r)


def read_prometheus(client, drafted, accepted, path: str = "/metrics", rounds=()) -> Counters:
    """The named counters of the server's Prometheus page now; BadResponse when it has none."""
    found = prometheus_counters(client.get_root_text(path), drafted, accepted, path, rounds)
    if found is None:
        raise BadResponse(f"{client.url}: {path} has no speculative-decoding counters "
                          f"({drafted[0]}, {accepted[0]})")
    return found


OPENAI = Dialect()
