"""The fast speculative engine: batched, vectorized, tree-verifying, graph-captured.

What the conformance kit (`pytest properties/ --impl=fast`) and callers use:
- accept_or_correct: the one-token rule, answered by the vectorized rejection sampler;
- speculative_generate: the chapter's engine API, the batched engine at B = 1;
- batched_generate: ragged batches, greedy or exact sampling (temperature, top-k, top-p);
- tree_generate: tree verification, one target call per round (fixed shapes, or dynamic trees
  grown by a draft model or a head drafter);
- FastEngine: the engine object (fixed max batch, cache length and k; reusable, graph-captured);
- PromptLookup: a drafter without a model (n-gram lookup in each row's context), passed where
  a draft model goes;
- HeadDrafter, MTPDrafter: drafters from an EAGLE-3 head and an MTP layer fed by the target's
  own verify forwards (fast/head.py, fast/mtp.py), passed where a draft model goes.
Models are Qwen3-family modules (reference.model.Qwen3 / EarlyExit, or wrappers exposing one
as `.module`); the engine runs its own batched forward over their weights.
"""

from fast.api import batched_generate, speculative_generate, tree_generate
from fast.engine import FastEngine
from fast.head import HeadDrafter
from fast.lookup import PromptLookup
from fast.mtp import MTPDrafter
from fast.rule import accept_or_correct
from fast.weights import KIT_MODEL_KINDS

__all__ = ["KIT_MODEL_KINDS", "FastEngine", "HeadDrafter", "MTPDrafter", "PromptLookup",
           "accept_or_correct", "batched_generate", "speculative_generate", "tree_generate"]
