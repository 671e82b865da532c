"""Instrumentation of the kit's models: every call and truncate recorded in a `Trace`, with the
token ids each cache holds at each position (read by ``properties.invariants``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from reference.cache import KVCache


class CacheViolation(ValueError):
    """An engine used a kit cache in a way the chapter's interface forbids."""


# --------------------------------------------------------------------------- the trace

@dataclass
class Event:
    index: int
    what: str           # "new_cache", "call", "truncate"
    role: str           # "target" or "draft"
    cache: int          # the cache's number within the trace
    start: int = 0      # call: cache length before the call; truncate: length before
    tokens: tuple = ()  # call: row 0's fed token ids
    end: int = 0        # truncate: the new length; new_cache: capacity
    masked: bool = False

    def describe(self) -> str:
        if self.what == "call":
            return (f"{self.role}(ids={list(self.tokens)}) on cache #{self.cache} at positions "
                    f"{self.start}..{self.start + len(self.tokens) - 1}"
                    + (" with a mask" if self.masked else ""))
        if self.what == "truncate":
            return f"{self.role} cache #{self.cache}: truncate {self.start} -> {self.end}"
        if self.what == "move":
            return (f"{self.role} cache #{self.cache}: move entries {list(self.tokens)} to "
                    f"{self.start}..{self.start + len(self.tokens) - 1}")
        return f"{self.role}.new_cache(capacity={self.end}) -> cache #{self.cache}"


@dataclass
class Trace:
    """What the engine did to the kit's models during one run."""

    events: list = field(default_factory=list)
    caches: dict = field(default_factory=dict)       # number -> cache object
    violations: list = field(default_factory=list)   # strings, in order of occurrence
    check_logits: bool = False                       # compare each call with a fresh prefill
    logits_tolerance: float = 1e-7
    closed: bool = False                             # the run it recorded has ended
    stale: list = field(default_factory=list)        # uses of caches from earlier runs

    @contextlib.contextmanager
    def active(self):
        """The engine's call: while it runs, a cache of an earlier (closed) run that the engine
        kept and touches again is reported to this trace. The trace is closed afterwards."""
        global _ACTIVE
        previous, _ACTIVE = _ACTIVE, self
        try:
            yield self
        finally:
            _ACTIVE = previous
            self.closed = True

    def foreign_use(self) -> str | None:
        """A message if the engine touched a cache it did not create in this run."""
        return self.stale[0] if self.stale else None

    def add(self, what, role, cache, **kw) -> Event:
        event = Event(len(self.events), what, role, cache, **kw)
        self.events.append(event)
        return event

    def violation(self, text: str) -> None:
        self.violations.append(text)

    def calls(self, role=None):
        return [e for e in self.events if e.what == "call" and (role is None or e.role == role)]

    def used_caches(self) -> bool:
        return any(e.what == "new_cache" for e in self.events)

    def tail(self, upto: int | None = None, count: int = 12) -> str:
        events = self.events if upto is None else self.events[:upto + 1]
        shown = events[-count:]
        lines = [f"  #{e.index}: {e.describe()}" for e in shown]
        if len(events) > len(shown):
            lines.insert(0, f"  ... {len(events) - len(shown)} earlier events")
        return "\n".join(lines)


_ACTIVE: Trace | None = None


def _stale_use(cache, what: str) -> None:
    """An engine touched `cache`, which belongs to an earlier, finished run."""
    text = (f"the engine touched a cache it did not create in this call: {what} on the "
            f"{cache.role}'s cache #{cache.number}, a cache from an earlier call (an engine must "
            f"not keep caches across calls: the next prompt's context is not the last one's)")
    if _ACTIVE is not None and _ACTIVE is not cache.trace:
        _ACTIVE.stale.append(text)
        _ACTIVE.violation(text)
    raise CacheViolation(text)


# --------------------------------------------------------------------------- caches

class _Recording:
    """What both cache kinds share: a length that only the model advances, truncate that
    never grows, and a record of the token ids held at every position."""

    def _setup(self, trace, role, number, batch, capacity):
        self.trace, self.role, self.number = trace, role, number
        self.tokens = np.full((batch, capacity), -1, dtype=np.int64)
        self._ready = True

    @property
    def length(self):
        return self._length

    @length.setter
    def length(self, n):
        if getattr(self, "_ready", False):
            # Assigning length directly is not the chapter's interface, but a shrinking
            # assignment is a rollback all the same; growing it would expose dead entries.
            self._truncate(n, how="length = ")
        else:
            self._length = n

    def truncate(self, n) -> None:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"truncate length n must be an int, got {type(n).__name__}")
        self._truncate(int(n), how="truncate")

    def _truncate(self, n, how):
        if self.trace.closed:
            _stale_use(self, f"{how.strip()}({n})")
        before = self._length
        self.trace.add("truncate", self.role, self.number, start=before, end=n)
        if n > before:
            text = (f"{self.role} cache #{self.number}: {how}({n}) would grow it from length "
                    f"{before} to {n} (a truncate never grows a cache: entries past the length "
                    f"are dead)")
            self.trace.violation(text)
            raise CacheViolation(text)
        if n < 0:
            raise ValueError(f"cannot truncate cache to n={n}: n must be >= 0")
        self._length = n

    def held(self, row: int = 0) -> list[int]:
        return self.tokens[row, : self._length].tolist()


class TracedKVCache(_Recording, KVCache):
    """reference.cache.KVCache, recording truncates and the token ids it holds."""

    def __init__(self, trace, role, number, num_layers, batch, kv_heads, head_dim, capacity,
                 dtype, device):
        self._ready = False
        KVCache.__init__(self, num_layers, batch, kv_heads, head_dim, capacity, dtype, device)
        self._setup(trace, role, number, batch, capacity)

    def advance(self, new_tokens: int) -> None:
        self.check_room(new_tokens)
        self._length += new_tokens

    def move(self, sources, start) -> None:
        """KVCache.move (tree verification keeps its accepted path this way), recorded: the
        event lists the source slots, and the token record moves with the entries."""
        KVCache.move(self, sources, start)
        sources = [int(s) for s in sources]
        self.trace.add("move", self.role, self.number, start=int(start), tokens=tuple(sources))
        if sources:
            self.tokens[:, start:start + len(sources)] = self.tokens[:, sources]


class TableCache(_Recording):
    """The table model's cache: the rolling hash of the prefix ending at each position."""

    def __init__(self, trace, role, number, batch, capacity):
        if capacity < 1 or batch < 1:
            raise ValueError(f"capacity and batch must be >= 1, got capacity={capacity}, batch={batch}")
        self._ready = False
        self.capacity = capacity
        self._length = 0
        self.hashes = np.zeros((batch, capacity), dtype=np.uint64)
        self._setup(trace, role, number, batch, capacity)

    def check_room(self, new_tokens: int) -> None:
        if self._length + new_tokens > self.capacity:
            raise ValueError(f"cache capacity exceeded: writing {new_tokens} tokens at length "
                             f"{self._length} needs {self._length + new_tokens} > capacity "
                             f"{self.capacity}")
