"""The terms the HTTP client, the dialects and the served checks share: a request in the
kit's terms, a completion read back, the engine's speculation counters, and the errors.

Nothing here knows an engine; each engine's dialect (properties/engines/, one file each)
turns a Request into its body and its answers into Completions.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.sampling import SamplingParams


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
    # lengths of the requests a completion was assembled from, when its dialect took several
    # (llama.cpp continued past its end-of-sequence id); empty for one request
    pieces: tuple = ()
    # where logprobs were asked: per generated token, (its logprob, ((token, logprob), ...) of
    # the top alternatives the server returned); None where the answer carries none
    logprobs: tuple | None = None
    # the completion's text as returned (a stop string may be cut from it), where given
    text: str | None = None


@dataclass(frozen=True)
class Counters:
    """An engine's server-wide speculation counters at one moment (cumulative)."""

    drafted: float
    accepted: float
    source: str = ""            # where they were read, e.g. "/metrics"
    rounds: float | None = None  # drafting rounds (vLLM: spec_decode_num_drafts), if counted
    # accepted tokens by draft position (position 1 first), where the engine counts them
    accepted_per_position: tuple | None = None


@dataclass(frozen=True)
class Counted:
    """What an engine says it drafted and accepted for some requests, with their answers."""

    drafted: float
    accepted: float
    answers: list               # per request, its completions
    source: str                 # in words: where the counts come from
    rounds: float | None = None  # drafting rounds among them, where the engine counts them
