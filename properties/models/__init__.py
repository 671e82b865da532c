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

The parts: ``trace`` (instrumentation), ``tables`` (table LMs), ``specs`` (what a model is,
and the modules built from it), ``kit`` (the wrappers engines are handed), ``served`` (the fixed
models served engines load, and their ``tokenizer``), ``heads`` (the served heads of the
engines' head methods, and the rounds they draft).
"""

from properties.models.trace import (CacheViolation, Event, TableCache, Trace,  # noqa: F401
                                     TracedKVCache)
from properties.models.tables import LaggedLM, NegatedLM, NoisyLM, TableLM  # noqa: F401
from properties.models.specs import (QWEN3_DRAFTS, TABLE_DRAFTS, TRAINED_DRAFTS,  # noqa: F401
                                     DraftSpec, Qwen3Spec, TableSpec, TrainedSpec, qwen3_config,
                                     qwen3_draft_module, qwen3_module, table_draft_lm, table_lm,
                                     trained_dir, trained_pair, use_trained_models)
from properties.models.kit import (KitModel, Qwen3KitModel, TableKitModel,  # noqa: F401
                                   build_pair, build_target, draft_variants)
