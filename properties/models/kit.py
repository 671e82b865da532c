"""The kit's model wrappers: the chapter's interface over a Qwen3 module or a table LM, float64,
validating every call and recording it in a trace; and the target/draft pairs of one run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from reference.cache import KVCache

from properties.models.specs import (QWEN3_DRAFTS, TABLE_DRAFTS, TRAINED_DRAFTS, DraftSpec,
                                     TrainedSpec, qwen3_draft_module, qwen3_module,
                                     table_draft_lm, table_lm)
from properties.models.tables import _mix
from properties.models.trace import CacheViolation, TableCache, Trace, TracedKVCache, _stale_use


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
        return self._traced(ids, cache, positions, mask)

    def _traced(self, ids, cache, positions, mask, hidden=None):
        """A call validated and recorded in the trace: logits, or (logits, features) when a
        head's hidden states are asked for (Qwen3KitModel.forward_hidden)."""
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
        if hidden is None:
            out = logits = self._forward(ids, cache, rows, start, positions, mask)
        else:
            out = self._forward_hidden(ids, cache, hidden, positions, mask)
            logits = out[0]
        cache.tokens[:, start:start + T] = np.asarray(rows)
        if self.trace.check_logits and not event.masked:
            self._compare_with_fresh(cache, logits, start, T, event)
        return out

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

    def forward_hidden(self, ids, cache, hidden, positions=None, mask=None):
        """The forward a feature-level head's engine asks for (reference.model.Qwen3's
        forward_hidden: logits and the hidden states `hidden` names), validated and traced as
        any call, so a head's engine is judged on the kit's models as a draft model's is."""
        return self._traced(ids, cache, positions, mask, hidden)

    def _forward_hidden(self, ids, cache, hidden, positions, mask):
        with torch.inference_mode():
            return self.module.forward_hidden(ids, cache, hidden, positions, mask)

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
