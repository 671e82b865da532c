"""Feature-level heads written as vLLM loads them, from the reference heads' own weights.

A head method's export folder (a HeadDraft's `head`) is written beside the target, so that the
engine loads exactly the numbers the kit computes proposals from:

- `served_head(drafter)`: for the kit's 32-token served target, a head of the drafter's kind
  and hidden-state convention with seeded random weights (as draft-random is a seeded model),
  float32 values held in float64; EAGLE-3's embedding is the target's (vLLM shares the
  target's embedding when the head's equals it, so either way the numbers are the target's);
- `trained_head(drafter, models)`: the EAGLE-3 head trained on a trained pair's target
  (make models-heads), for `--models trained`.

vLLM 0.32.0's formats, from its source (site-packages/vllm/):
- EAGLE-3 (model_executor/models/qwen3_eagle3.py, Eagle3Qwen3ForCausalLM): a Qwen3 config of
  one layer with architectures ["Eagle3Qwen3ForCausalLM"], `eagle_aux_hidden_state_layer_ids`
  (the residual stream entering each named target layer: models/interfaces.py,
  _maybe_add_hidden_state), `target_hidden_size`; the tensors are the reference head's names
  (fc, midlayer.*, norm, lm_head, embed_tokens) and, with a draft vocabulary, `d2t` holding
  target id - draft id (compute_logits adds it to arange(draft_vocab_size)).
- Medusa (model_executor/models/medusa.py, transformers_utils/configs/medusa.py): model_type
  "medusa", num_heads, num_hidden_layers (residual layers per head), `medusa_fc_bias` (the
  layers have no bias unless it is set: the reference's have one); tensors
  blocks.{i}.layers.{j}.{weight,bias} and lm_heads.{i}.weight, the reference's names.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import torch

from properties.models import served
from reference.checkpoint import _safetensors
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads
from reference.heads.random import random_head

# one seed per kind, apart from the served models' (9001, 9002)
SEEDS = {"eagle3": 9003, "medusa": 9004}
DTYPE = torch.float32
# Medusa heads of the served head methods: one per drafted position (the methods' k)
MEDUSA_HEADS = 4


@lru_cache(maxsize=8)
def served_head(drafter):
    """The reference head (float64, weights exact in float32) a HeadDraft of the served
    methods loads: its kind, its hidden-state convention, a seeded random init."""
    if drafter.kind not in SEEDS:
        raise ValueError(f"no served head of kind {drafter.kind!r}: the kit exports "
                         f"{sorted(SEEDS)} for vLLM")
    target = served.build("target")
    options = {"hidden": drafter.hidden} if drafter.hidden is not None else {}
    if drafter.kind == "medusa":
        options["num_heads"] = MEDUSA_HEADS
    head = random_head(drafter.kind, target, seed=SEEDS[drafter.kind], **options)
    if isinstance(head, Eagle3Head):
        with torch.no_grad():
            head.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    _fit_readout(head, target, SEEDS[drafter.kind])
    # the numbers a float32 checkpoint stores, as the served models are
    return head.to(DTYPE).to(torch.float64).eval().requires_grad_(False)


@torch.no_grad()
def _fit_readout(head, target, seed: int, rows: int = 256, length: int = 32):
    """Fit the head's lm_head(s) by least squares to the target's own logits of the token it
    drafts, on greedy continuations of seeded random prompts. A head with random weights
    throughout accepts almost nothing (about 1 of 120 drafted greedily here), too few for
    its counters to show that the engine drafts with it; with the fitted readout about 1 in 9
    drafted tokens is accepted (EAGLE-3), 1 in 6 (Medusa), over 80 greedy rounds of seeded
    random prompts."""
    from reference.cache import KVCache
    c = target.config
    generator = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, c.vocab_size, (rows, 4), generator=generator)
    while seqs.shape[1] < length:    # the target's greedy continuations
        cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim,
                        seqs.shape[1], torch.float64, "cpu")
        seqs = torch.cat([seqs, target(seqs, cache)[:, -1].argmax(-1)[:, None]], 1)
    cache = KVCache(c.num_hidden_layers, rows, c.num_key_value_heads, c.head_dim, length,
                    torch.float64, "cpu")
    logits, features = target.forward_hidden(seqs, cache, head.hidden)   # logits[:, j]: t_{j+1}
    if isinstance(head, Eagle3Head):
        # the pair (f_j, t_{j+1}) drafts t_{j+2}, whose target logits are row j + 1
        own = KVCache(1, rows, c.num_key_value_heads, c.head_dim, length, torch.float64, "cpu")
        _, g = head(seqs[:, 1:], head.start(features[:, :-1]), own)
        _least_squares(head.lm_head, head.norm(g), logits[:, 1:])
    else:
        # Medusa head i (from 0) reads f_j and drafts t_{j+2+i}: target logits row j + 1 + i
        for i, (block, lm_head) in enumerate(zip(head.blocks, head.lm_heads)):
            _least_squares(lm_head, block(features[:, :length - 1 - i]), logits[:, 1 + i:])


def _least_squares(linear, x, y):
    """linear.weight := the W minimizing |x W^T - y| (y centred per row: softmax ignores a
    row's shift), x [..., H], y [..., V]."""
    x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    y = y - y.mean(-1, keepdim=True)
    linear.weight.copy_(torch.linalg.lstsq(x, y).solution.T)


def trained_head(drafter, models: str = "trained"):
    """The trained pair's EAGLE-3 head in float64 (the only trained head committed)."""
    from properties.export.trained import pair_of
    if drafter.kind != "eagle3":
        raise ValueError(f"no trained head of kind {drafter.kind!r}: only eagle3 is trained "
                         f"(make models-heads)")
    pair = pair_of(models, torch.float64)
    return pair.eagle3().to(torch.float64)


def write_vllm(head, path) -> Path:
    """Write a reference EAGLE-3 head or Medusa heads to `path` in vLLM's format (float32)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(DTYPE).contiguous().cpu()
             for name, t in head.state_dict().items() if name != "draft_to_target"}
    if isinstance(head, Eagle3Head):
        config = _eagle3_config(head)
        if head.draft_to_target is not None:
            d2t = head.draft_to_target.cpu()
            state["d2t"] = d2t - torch.arange(len(d2t))   # vLLM stores the offset
    elif isinstance(head, MedusaHeads):
        c = head.config
        config = {"model_type": "medusa", "architectures": ["MedusaModel"],
                  "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
                  "num_heads": head.num_heads, "num_hidden_layers": len(head.blocks[0].layers),
                  "medusa_fc_bias": True, "torch_dtype": "float32"}
    else:
        raise TypeError(f"write_vllm takes an Eagle3Head or MedusaHeads, got "
                        f"{type(head).__name__}")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _safetensors().save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _eagle3_config(head) -> dict:
    c, hidden = head.config, head.hidden
    if hidden.where != "input" or hidden.normed:
        # vLLM feeds only the residual stream entering each named layer
        raise ValueError(f"vLLM's EAGLE-3 reads the un-normed inputs of target layers; this "
                         f"head reads the {hidden.describe()}")
    config = asdict(c) | {
        "model_type": "qwen3", "architectures": ["Eagle3Qwen3ForCausalLM"],
        "num_hidden_layers": 1, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "torch_dtype": "float32",
        "target_hidden_size": head.target_config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(hidden.layers),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(hidden.layers)},
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "rope_scaling": None}
    if head.draft_to_target is not None:
        config["draft_vocab_size"] = len(head.draft_to_target)
    return config


def load_vllm(path, target):
    """Read a folder `write_vllm` wrote back into a reference head for `target` (float64): what
    the engine loads, as the reference computes it (the export's round trip)."""
    from reference.hidden import HiddenStates
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    state = _safetensors().load_file(str(path / "model.safetensors"))
    if config.get("model_type") == "medusa":
        head = MedusaHeads(target.config, config["num_heads"],
                           num_layers=config["num_hidden_layers"])
    elif config.get("architectures") == ["Eagle3Qwen3ForCausalLM"]:
        hidden = HiddenStates(tuple(config["eagle_aux_hidden_state_layer_ids"]), "input")
        d2t = state.pop("d2t", None)
        head = Eagle3Head(target.config, hidden,
                          None if d2t is None else (d2t + torch.arange(len(d2t))).tolist())
    else:
        raise ValueError(f"{path}/config.json is neither vLLM's Medusa nor its EAGLE-3 "
                         f"(Eagle3Qwen3ForCausalLM) head")
    if getattr(head, "draft_to_target", None) is not None:
        state["draft_to_target"] = head.draft_to_target
    head.load_state_dict(state, strict=True)
    return head.to(torch.float64).eval().requires_grad_(False)


def greedy_proposals(head, target, context, k: int) -> tuple:
    """The head's argmax proposals (at most k; Medusa: at most its number of heads) in a round
    whose newest token is context[-1], as reference/heads/proposer.py drafts them: from the
    target's float64 features of the verified tokens context[:-1], chained on its own
    proposals. () for a one-token context (no verified feature)."""
    from reference.sampling import greedy_token
    context = [int(t) for t in context]
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"greedy_proposals: k must be an int >= 0, got {k!r}")
    if len(context) < 2 or k == 0:
        return ()
    features = _features(head, target, context[:-1])
    limit = min(k, head.num_heads) if isinstance(head, MedusaHeads) else k
    out = []
    for _ in range(limit):
        out.append(int(greedy_token(_round_row(head, features, context, out))))
    return tuple(out)


@torch.no_grad()
def _features(head, target, verified) -> torch.Tensor:
    """The target's features of the verified tokens, as the head reads them: [len, width]."""
    from reference.cache import KVCache
    c = target.config
    cache = KVCache(len(target.layers), 1, c.num_key_value_heads, c.head_dim, len(verified),
                    torch.float64, "cpu")
    return target.forward_hidden(torch.tensor([list(verified)]), cache, head.hidden)[1][0]


@torch.no_grad()
def _round_row(head, features, context, prefix) -> torch.Tensor:
    """The head's logits [V] (-inf outside a draft vocabulary) for the proposal after `prefix`
    in the round whose newest token is context[-1]; features of context[:-1]."""
    from reference.heads.replay import round_logits
    # rows 0 .. n - 1 of the features are read; the proposals' rows never are
    return round_logits(head, features, list(context) + list(prefix), len(context) - 1,
                        len(prefix) + 1)[-1]


# The served heads' rounds for the exact replays (properties/acceptance.py, acceptance_sampled.py),
# which a HeadDraft answers with: a chained head's proposals depend on where its round started
# (the verified features end there), so they are a function of (context, prefix), not of the
# sequence alone as a draft model's are.

@lru_cache(maxsize=4096)
def round_proposals(drafter, context: tuple, n: int) -> tuple:
    """greedy_proposals of the served head `drafter` loads, cached."""
    return greedy_proposals(served_head(drafter), served.build("target"), context, n)


@lru_cache(maxsize=1024)
def _served_features(drafter, verified: tuple) -> torch.Tensor:
    return _features(served_head(drafter), served.build("target"), verified)


def round_logits(drafter, context, prefix) -> torch.Tensor:
    """The served head's logits [V] for the proposal after `prefix` in a round whose newest
    token is context[-1] (a context of two or more tokens)."""
    context = tuple(int(t) for t in context)
    if len(context) < 2:
        raise ValueError(f"round_logits: a head drafts from a verified feature, so the context "
                         f"needs two or more tokens, got {list(context)}")
    return _round_row(served_head(drafter), _served_features(drafter, context[:-1]), context,
                      [int(t) for t in prefix])


def export(directory, drafter, models: str = "kit") -> Path:
    """Write the head a HeadDraft loads into `directory`/<drafter.head>: the served head, or
    with `models` a trained pair, that pair's trained head."""
    head = served_head(drafter) if models == "kit" else trained_head(drafter, models)
    if drafter.hidden is not None and head.hidden != drafter.hidden:
        raise ValueError(f"the {models} {drafter.kind} head reads the {head.hidden.describe()}, "
                         f"not the {drafter.hidden.describe()} the method declares")
    return write_vllm(head, Path(directory) / drafter.head)


def export_declared(directory) -> dict[str, Path]:
    """Every served head the engines' methods declare (not the trained-only ones), written into
    `directory`: what `python -m properties.serve export DIR` adds, so that the recipes' head
    command lines find their folders. head name -> path."""
    from properties import engines
    from properties.methods import HeadDraft
    drafters = {m.drafter.head: m.drafter for name in engines.available()
                for m in engines.get(name).methods.values()
                if isinstance(m.drafter, HeadDraft) and not m.drafter.trained_only}
    return {head: export(directory, drafter) for head, drafter in sorted(drafters.items())}
