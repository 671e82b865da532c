"""Training one MTP layer on the committed trained target, by distillation (make models-heads,
after the EAGLE-3 head).

    python -m reference.train_mtp --models reference/trained --threads 1

The target is frozen. Over random windows of its training corpus, one target forward gives its
normed last hidden state h_j and its next-token law at every position; the layer learns, at each
pair (h_j, t_{j+1}), the target's law of t_{j+2}: KL(p_target || q_layer) at temperature 1, as
the EAGLE-3 head does (reference/train_heads.py, whose pass mask this module uses; the loop,
windows, acceptance measure and manifest entry are reference/distill.py's, as every head's).

The convention trained is llama.cpp's draft-mtp (reference/heads/mtp.py; MTP_CONVENTION in
properties/engines/llamacpp.py): the normed last state, [enorm(e), hnorm(h)] embedding first, the
layer's normed output chained, and the lead pair: t_0 paired with a zero state at position 0,
pair j one position later. A window is treated as a sequence of its own, as the target's forward
over it is, so the lead pair is its first token. vLLM's convention (no lead pair, position 0's
embedding masked, the un-normed output chained) reads the same weights differently: the layer
runs there, but was not trained for it.

Training-time test: one MTP layer proposes k tokens a round by chaining its own output as the
next pair's h, so it is trained that way, as EAGLE-3's head is (train_heads.py's docstring):
pass 1 reads the target's states; pass t > 1 reads, at pair i, the layer's pass t - 1 output at
pair i - 1 with the true token t_{i+1}, and attends to the verified pairs (pass 1, the lead pair
included) at pairs <= i - t + 1 and to its own pairs of passes 2 .. t at i - t + 2 .. i. Four
passes: the engines' k = 4 chained proposals, each trained as used.

The layer is written to <models>/mtp/ (float16) and the manifest's "heads" entry gains an "mtp"
key (recipe, time, held-out KL per pass, acceptance beside the small draft's and the EAGLE-3
head's), with the new files' hashes. The target, the small draft and the other heads are not
touched.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from reference.heads.base import lead_pairs
from reference.heads.mtp import MTPLayer
from reference.hidden import last_layer
from reference.distill import build as distill_build
from reference.distill import cli, distill, small_init, window_forward
from reference.train_heads import HeadRecipe, PassCache, pass_kl, pass_mask

# the EAGLE-3 head's recipe (600 steps) with four passes, k = 4: about 1 s a step on one thread
RECIPE = HeadRecipe(passes=4)
# llama.cpp's draft-mtp (properties/engines/llamacpp.py MTP_CONVENTION)
CONVENTION = {"order": "embedding-first", "recycle": "normed", "lead": True}


def pass_logits(layer: MTPLayer, features, ids, passes: int) -> list:
    """The layer's logits in each pass of the training-time test over windows: features
    [B, T + 1, H] (the target's, over ids), ids [B, T + 1] -> per pass [B, T, V], row i the
    layer's law of t_{i+2} at step t of a round. The layer's own arithmetic (MTPLayer.forward),
    with the positions and masks of all pairs of a pass given at once."""
    B, T = ids.shape[0], ids.shape[1] - 1
    lead = lead_pairs(layer)
    P = T + lead                                      # pairs, the lead one first
    positions = torch.arange(P, device=ids.device).expand(B, P)
    e = layer.target.model.embed_tokens(ids[:, 1 - lead:T + 1])          # t_{i+1}: [B, P, H]
    if layer.mask0:     # vLLM: the pair at position 0 without its embedding
        e = torch.where((positions == 0)[..., None], torch.zeros_like(e), e)
    e = layer.enorm(e)
    zero = torch.zeros_like(features[:, :1])
    h = torch.cat([zero, features[:, :T]], 1) if lead else features[:, :T]   # [B, P, H]
    cache = PassCache()
    out = []
    for t in range(1, passes + 1):
        n = layer.hnorm(h)
        x = layer.eh_proj(torch.cat([e, n] if layer.order == "embedding-first" else [n, e], -1))
        mask = pass_mask(P, t).to(ids.device).expand(B, P, t * P)
        g = layer.mtp_block(x, cache, positions, mask)                   # [B, P, H]
        normed = layer.target.model.norm(g)
        out.append(layer.target.lm_head(normed)[:, lead:])               # [B, T, V]
        # pass t + 1 at pair i reads pass t's output at pair i - 1 (the first: never judged)
        chained = normed if layer.recycle == "normed" else g
        h = torch.cat([zero, chained[:, :-1]], 1)
    return out


def mtp_losses(layer: MTPLayer, target, ids, recipe: HeadRecipe) -> list:
    """Per pass, KL(p_target || q_layer) over a batch of windows ids [B, T + 1], as the EAGLE-3
    head's (train_heads.pass_kl): pair i (h_i, t_{i+1}) predicts the target's law at i + 1."""
    logits, features = window_forward(target, ids, layer.hidden)
    return pass_kl(logits, pass_logits(layer, features, ids, recipe.passes))


def init_layer(target, seed: int) -> MTPLayer:
    """An MTP layer for target in llama.cpp's convention, reading its normed last state: norms
    at one, the rest small and seeded (the embedding, final norm and lm_head are the target's,
    shared and frozen)."""
    layer = MTPLayer(target, last_layer(target.config.num_hidden_layers, normed=True),
                     **CONVENTION).float()
    small_init(layer, seed)
    return layer


def train_layer(target, train_ids, recipe: HeadRecipe, log=print) -> tuple:
    target.requires_grad_(False)      # the layer reads its embedding, norm and lm_head
    layer = init_layer(target, recipe.seed)
    weights = [recipe.pass_weight ** t for t in range(recipe.passes)]
    return distill(layer, list(layer.parameters()),
                   lambda ids: mtp_losses(layer, target, ids, recipe), train_ids, recipe,
                   weights, log)


def build(models: Path, recipe: HeadRecipe, log=print, prompts: int = 8) -> dict:
    """Train the layer on the pair in `models`, save it to models/mtp, measure, and add the
    "mtp" key to the manifest's "heads" entry."""
    return distill_build(models, "mtp", "one MTP layer distilled from the target's normed last "
                         "hidden state, in llama.cpp's draft-mtp convention (python -m "
                         "reference.train_mtp)", recipe, train_layer,
                         lambda layer, target, ids: mtp_losses(layer, target, ids, recipe),
                         recipe.passes, compare=("eagle3",),
                         convention=CONVENTION | {"mask0": False}, noun="layer", log=log,
                         prompts=prompts)


def main(argv=None):
    cli("python -m reference.train_mtp", RECIPE, build, argv)


if __name__ == "__main__":
    sys.exit(main())
