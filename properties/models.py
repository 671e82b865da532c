"""The kit's models: float64, the chapter's interface, and instrumented.

Every kit model has the interface an engine written against the chapter uses:

    model(ids, cache) -> logits [B, T, V]      ids: int64 [B, T]; writes T cache entries
    model.new_cache(batch, capacity) -> cache  cache.length, cache.truncate(n)
    model.parameters()                         (for the device), model.config.vocab_size

Two kinds:

* ``qwen3``: seeded random tiny Qwen3 models from ``reference.model`` (float64), exposed as
  ``model.module`` so that engines with their own cache (the fast engine) can unwrap them;
  among them the committed *trained* target (``TrainedSpec``, reference/trained/) with its
  trained drafts: the one qwen3 target whose drafts agree with it as real drafts do (most
  proposals accepted, late draft positions reached), so bugs that only show there get exercised;
* ``table``: cheap table-driven language models. The logits after a prefix are a row of a
  seeded random table, chosen by a rolling hash of the whole prefix, so every token of the
  context matters and the exact law of a continuation is cheap to enumerate. Their cache
  stores the hashes, so an engine that feeds the wrong context, or keeps rolled-back entries,
  gets different logits, just as with a transformer.

Every call and every truncate is recorded in a `Trace`, together with the token ids each cache
holds at each position, so the kit can say in which round and at which position a cache stopped
holding a prefix of the committed sequence (see ``properties.invariants``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import torch

from reference.cache import KVCache
from reference.model import Config, EarlyExit, random_model

_MASK64 = (1 << 64) - 1


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


# --------------------------------------------------------------------------- table LMs

def _mix(h: int, token: int) -> int:
    """One step of the rolling hash (splitmix64 finalizer over the state and the token)."""
    z = (h ^ ((token + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class TableLM:
    """Next-token logits = table[hash(prefix) % rows]; -inf entries are tokens it never emits."""

    ROWS = 1021

    def __init__(self, vocab: int, seed: int, scale: float, sparsity: float, tie_gap: float = 0.0):
        rng = np.random.default_rng([seed, vocab, 7])
        self.vocab = vocab
        self.start = _mix(seed & _MASK64, vocab)
        self.table = rng.standard_normal((self.ROWS, vocab)) * scale
        if sparsity > 0 and vocab > 2:
            # each row keeps a random subset of at least two tokens
            keep = max(2, int(round(vocab * (1 - sparsity))))
            for row in self.table:
                row[rng.permutation(vocab)[keep:]] = -np.inf
        if tie_gap > 0 and vocab > 1:
            # a near tie in every context: the runner-up sits exactly tie_gap below the top
            for row in self.table:
                first, second = np.argsort(-row, kind="stable")[:2]
                row[second] = row[first] - tie_gap
        self.table.flags.writeable = False   # the kit's evidence: an engine cannot edit it

    def logits(self, h_prev: int, h: int) -> np.ndarray:
        return self.table[h % self.ROWS]


class NegatedLM:
    """A draft whose greedy choice is never the target's: the finite logits negated."""

    def __init__(self, base: TableLM):
        self.base, self.vocab, self.start = base, base.vocab, base.start

    def logits(self, h_prev, h):
        row = self.base.logits(h_prev, h)
        return np.where(np.isfinite(row), -row, -np.inf)


class NoisyLM:
    """A close draft: the target's logits plus small seeded noise (high acceptance)."""

    def __init__(self, base: TableLM, seed: int, eps: float = 0.3):
        self.base, self.vocab, self.start = base, base.vocab, base.start
        self.noise = np.random.default_rng([seed, 11]).standard_normal(base.table.shape) * eps
        self.noise.flags.writeable = False

    def logits(self, h_prev, h):
        return self.base.logits(h_prev, h) + self.noise[h % TableLM.ROWS]


class LaggedLM:
    """A draft shifted by one position: it predicts what the target predicted one step earlier."""

    def __init__(self, base: TableLM):
        self.base, self.vocab, self.start = base, base.vocab, base.start

    def logits(self, h_prev, h):
        return self.base.logits(h_prev, h_prev)


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class TableSpec:
    """A table-driven target. scale: logit standard deviation (larger = more peaked);
    sparsity: fraction of tokens each context gives probability 0."""

    vocab: int
    seed: int
    scale: float = 2.0
    sparsity: float = 0.0
    tie_gap: float = 0.0     # > 0: every context's top-two logits differ by exactly this

    @property
    def kind(self) -> str:
        return "table"


@dataclass(frozen=True)
class Qwen3Spec:
    """A seeded random tiny Qwen3 target (reference.model), float64."""

    vocab: int
    seed: int
    layers: int = 1
    hidden: int = 16

    @property
    def kind(self) -> str:
        return "qwen3"


@dataclass(frozen=True)
class TrainedSpec:
    """The committed trained target (reference/trained/, `make models`), float64. Its drafts:
    small (the separately trained 1-layer model), early_exit (the target's first layers, trained
    for it), perfect. Its vocabulary (2,048) is too large for exact laws of long outputs: it is
    used where the vocabulary does not matter (greedy, cache, bounds) or the law stays small
    (top-k sampling)."""

    vocab: int = 2048

    @property
    def kind(self) -> str:
        return "qwen3"


@dataclass(frozen=True)
class DraftSpec:
    """How the draft relates to the target.

    random      an independent model of the same kind and vocabulary
    perfect     the target itself (a separate wrapper with its own caches)
    early_exit  qwen3: the target's first layer, then its final norm and head
    negated     the target with its logits negated: its argmax is never the target's
    rolled      qwen3: the target with its head rows rolled by one token (argmax + 1)
    small       trained: the separately trained small draft
    noisy       the target's logits plus small noise: agrees most of the time
    lagged      table: the target's prediction one position earlier (shifted by one)
    """

    variant: str = "random"
    seed: int = 0


QWEN3_DRAFTS = ("random", "early_exit", "perfect", "negated", "rolled", "noisy")
TABLE_DRAFTS = ("random", "perfect", "negated", "noisy", "lagged")
TRAINED_DRAFTS = ("small", "early_exit", "perfect")


@lru_cache(maxsize=1)
def trained_pair():
    """The committed trained models in float64 (reloaded from disk after reset_models)."""
    from reference.pretrained import TRAINED_DIR, load_dir
    pair = load_dir(TRAINED_DIR, dtype=torch.float64)
    if pair.target.config.vocab_size != TrainedSpec.vocab:
        raise ValueError(f"the trained target's vocabulary is {pair.target.config.vocab_size}, "
                         f"TrainedSpec says {TrainedSpec.vocab}")
    return pair


def qwen3_config(spec: Qwen3Spec) -> Config:
    return Config(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
                  num_hidden_layers=spec.layers, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=8, max_position_embeddings=4096)


@lru_cache(maxsize=64)
def qwen3_module(spec: Qwen3Spec):
    if isinstance(spec, TrainedSpec):
        return trained_pair().target.eval().requires_grad_(False)
    return random_model(qwen3_config(spec), seed=spec.seed, dtype=torch.float64)


@lru_cache(maxsize=64)
def qwen3_draft_module(spec: Qwen3Spec, draft: DraftSpec):
    target = qwen3_module(spec)
    v = draft.variant
    if v == "perfect":
        return target
    if isinstance(spec, TrainedSpec):
        if v == "small":
            return trained_pair().small.eval().requires_grad_(False)
        if v == "early_exit":
            return EarlyExit(target, trained_pair().exit_layers).eval().requires_grad_(False)
        raise ValueError(f"the trained target's drafts are {TRAINED_DRAFTS}, got {v!r}")
    if v == "random":
        return qwen3_module(Qwen3Spec(spec.vocab, seed=10_000 + draft.seed, layers=1,
                                      hidden=spec.hidden))
    if v == "early_exit":
        if spec.layers < 2:
            raise ValueError("an early_exit draft needs a target with at least 2 layers")
        return EarlyExit(target, 1).eval().requires_grad_(False)
    module = copy.deepcopy(target)
    with torch.no_grad():
        head = module.lm_head.weight
        if v == "negated":
            head.neg_()
        elif v == "rolled":
            head.copy_(torch.roll(head.clone(), shifts=1, dims=0))
        elif v == "noisy":
            g = torch.Generator().manual_seed(draft.seed)
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
        else:
            raise ValueError(f"unknown qwen3 draft variant {v!r}; choose from {QWEN3_DRAFTS}")
    return module.eval().requires_grad_(False)


@lru_cache(maxsize=64)
def table_lm(spec: TableSpec):
    return TableLM(spec.vocab, spec.seed, spec.scale, spec.sparsity, spec.tie_gap)


@lru_cache(maxsize=64)
def table_draft_lm(spec: TableSpec, draft: DraftSpec):
    base = table_lm(spec)
    v = draft.variant
    if v == "perfect":
        return base
    if v == "random":
        return table_lm(TableSpec(spec.vocab, seed=10_000 + draft.seed, scale=spec.scale,
                                  sparsity=spec.sparsity, tie_gap=spec.tie_gap))
    if v == "negated":
        return NegatedLM(base)
    if v == "noisy":
        return NoisyLM(base, draft.seed)
    if v == "lagged":
        return LaggedLM(base)
    raise ValueError(f"unknown table draft variant {v!r}; choose from {TABLE_DRAFTS}")


# --------------------------------------------------------------------------- kit models

class KitModel:
    """Common part: validation, recording, and the optional fresh-prefill comparison."""

    kind: str

    def __init__(self, role: str, trace: Trace | None, name: str):
        self.role, self.name = role, name
        self.trace = trace if trace is not None else Trace()

    def __repr__(self):
        return f"<kit {self.kind} model {self.name} ({self.role})>"

    def eval(self):
        return self

    def new_cache(self, batch: int, capacity: int):
        number = len(self.trace.caches)
        cache = self._make_cache(number, int(batch), int(capacity))
        cache.owner = self
        self.trace.caches[number] = cache
        self.trace.add("new_cache", self.role, number, end=int(capacity))
        return cache

    def __call__(self, ids, cache, positions=None, mask=None):
        if not torch.is_tensor(ids) or ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"{self.role}: ids must be an integer tensor [batch, tokens], got "
                             f"{getattr(ids, 'dtype', type(ids).__name__)} "
                             f"{tuple(getattr(ids, 'shape', ()))}")
        owner = getattr(cache, "owner", None)
        if owner is not None and owner.trace.closed:
            _stale_use(cache, f"a {self.role} call")
        if owner is not self:
            whose = ("a cache the kit did not create" if owner is None
                     else f"a cache from an earlier call (the {owner.role}'s)"
                     if owner.trace is not self.trace else f"the {owner.role}'s cache")
            text = f"the {self.role} was called with {whose}"
            self.trace.violation(text)
            raise CacheViolation(text)
        rows = ids.detach().cpu().tolist()
        T = len(rows[0])
        if T == 0:
            raise ValueError(f"{self.role}: ids must hold at least one token")
        for row in rows:
            for t in row:
                if not 0 <= t < self.vocab_size:
                    raise ValueError(f"{self.role}: token id {t} is outside the vocabulary "
                                     f"[0, {self.vocab_size})")
        start = cache.length
        cache.check_room(T)
        event = self.trace.add("call", self.role, cache.number, start=start, tokens=tuple(rows[0]),
                               masked=mask is not None or positions is not None)
        logits = self._forward(ids, cache, rows, start, positions, mask)
        cache.tokens[:, start:start + T] = np.asarray(rows)
        if self.trace.check_logits and not event.masked:
            self._compare_with_fresh(cache, logits, start, T, event)
        return logits

    forward = __call__

    def _compare_with_fresh(self, cache, logits, start, T, event):
        held = cache.held(0)
        if len(held) != start + T:
            return
        fresh = self.fresh_logits(held)[start:start + T]
        got = logits[0].detach().to("cpu", torch.float64)
        finite = torch.isfinite(fresh)
        same_mask = torch.equal(finite, torch.isfinite(got))
        diff = (got[finite] - fresh[finite]).abs().max().item() if finite.any() else 0.0
        if not same_mask or diff > self.trace.logits_tolerance:
            self.trace.violation(
                f"call #{event.index} ({event.describe()}): the logits differ from a fresh prefill "
                f"of the {start + T} tokens the cache holds by {diff:.3g}: entries that are not "
                f"the tokens written there (rolled-back or stale keys/values) influenced them")

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def next_logits(self, prefix) -> torch.Tensor:
        """Float64 logits for the token after `prefix`, from a fresh prefill (no trace)."""
        return self.fresh_logits(list(prefix))[-1]


class Qwen3KitModel(KitModel):
    kind = "qwen3"

    def __init__(self, module, role, trace=None, name="qwen3"):
        super().__init__(role, trace, name)
        self.module = module
        self.config = module.config

    def parameters(self):
        return self.module.parameters()

    def _make_cache(self, number, batch, capacity):
        c = self.module.config
        p = self.module.model.embed_tokens.weight
        return TracedKVCache(self.trace, self.role, number, len(self.module.layers), batch,
                             c.num_key_value_heads, c.head_dim, capacity, p.dtype, p.device)

    def _forward(self, ids, cache, rows, start, positions, mask):
        with torch.inference_mode():
            return self.module(ids, cache, positions=positions, mask=mask)

    def fresh_logits(self, seq) -> torch.Tensor:
        p = self.module.model.embed_tokens.weight
        c = self.module.config
        cache = KVCache(len(self.module.layers), 1, c.num_key_value_heads, c.head_dim,
                        max(1, len(seq)), p.dtype, p.device)
        with torch.inference_mode():
            out = self.module(torch.tensor([list(seq)], device=p.device), cache)
        return out[0].to("cpu", torch.float64)


class TableKitModel(KitModel):
    kind = "table"

    def __init__(self, lm, role, trace=None, name="table"):
        super().__init__(role, trace, name)
        self.lm = lm
        self.config = SimpleNamespace(vocab_size=lm.vocab)
        self._param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64), requires_grad=False)

    def parameters(self):
        return iter([self._param])

    def _make_cache(self, number, batch, capacity):
        return TableCache(self.trace, self.role, number, batch, capacity)

    def _forward(self, ids, cache, rows, start, positions, mask):
        if positions is not None or mask is not None:
            raise ValueError("table models do not take positions or masks (tree verification "
                             "runs on qwen3 models)")
        B, T = len(rows), len(rows[0])
        out = np.empty((B, T, self.lm.vocab))
        for b, row in enumerate(rows):
            # the hash of the prefix before position `start` is what the cache holds there
            h_prev = int(cache.hashes[b, start - 1]) if start > 0 else self.lm.start
            for t, token in enumerate(row):
                h = _mix(h_prev, token)
                cache.hashes[b, start + t] = h
                out[b, t] = self.lm.logits(h_prev, h)
                h_prev = h
        cache._length = start + T
        return torch.from_numpy(out)

    def fresh_logits(self, seq) -> torch.Tensor:
        out = np.empty((len(seq), self.lm.vocab))
        h_prev = self.lm.start
        for t, token in enumerate(seq):
            h = _mix(h_prev, token)
            out[t] = self.lm.logits(h_prev, h)
            h_prev = h
        return torch.from_numpy(out)


# --------------------------------------------------------------------------- building pairs

def build_target(spec, trace: Trace | None = None, role: str = "target") -> KitModel:
    if spec.kind == "qwen3":
        return Qwen3KitModel(qwen3_module(spec), role, trace, name=f"{spec}")
    return TableKitModel(table_lm(spec), role, trace, name=f"{spec}")


def build_pair(spec, draft: DraftSpec, trace: Trace | None = None) -> tuple[KitModel, KitModel]:
    """The target and draft kit models for one run, sharing one trace."""
    trace = trace if trace is not None else Trace()
    target = build_target(spec, trace)
    if spec.kind == "qwen3":
        d = Qwen3KitModel(qwen3_draft_module(spec, draft), "draft", trace, name=f"{draft}")
    else:
        d = TableKitModel(table_draft_lm(spec, draft), "draft", trace, name=f"{draft}")
    return target, d


def draft_variants(spec) -> tuple[str, ...]:
    if isinstance(spec, TrainedSpec):
        return TRAINED_DRAFTS
    if spec.kind == "qwen3":
        return tuple(v for v in QWEN3_DRAFTS if v != "early_exit" or spec.layers >= 2)
    return TABLE_DRAFTS
