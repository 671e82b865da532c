"""Training one MTP layer on the committed trained target, by distillation (make models-heads,
after the EAGLE-3 head).

    python -m reference.train_mtp --models reference/trained --threads 1

The target is frozen. Over random windows of its training corpus, one target forward gives its
normed last hidden state h_j and its next-token law at every position; the layer learns, at each
pair (h_j, t_{j+1}), the target's law of t_{j+2}: KL(p_target || q_layer) at temperature 1, as
the EAGLE-3 head does (reference/train_heads.py, whose corpus windows, learning-rate schedule,
pass mask, acceptance measure and manifest writer this module uses).

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

import argparse
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from reference.heads.base import lead_pairs
from reference.heads.checkpoint import load_head, save_head
from reference.heads.mtp import MTPLayer
from reference.hidden import last_layer
from reference.train_heads import (HeadRecipe, PassCache, corpus_ids, lr_at, measure_drafts,
                                   pass_mask, window_forward, write_heads_entry)

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
    """Per pass, KL(p_target || q_layer) over a batch of windows ids [B, T + 1], averaged over
    the pairs every pass reaches (pass t needs i >= t - 1)."""
    T = ids.shape[1] - 1
    logits, features = window_forward(target, ids, layer.hidden)
    # pair i (h_i, t_{i+1}) predicts the target's law at position i + 1
    p_log = F.log_softmax(logits[:, 1:T + 1], -1)                        # [B, T, V]
    first = recipe.passes - 1
    losses = []
    for logits_t in pass_logits(layer, features, ids, recipe.passes):
        q_log = F.log_softmax(logits_t, -1).to(p_log.dtype)
        kl = F.kl_div(q_log[:, first:], p_log[:, first:], log_target=True, reduction="none")
        losses.append(kl.sum(-1).mean())
    return losses


def init_layer(target, seed: int) -> MTPLayer:
    """An MTP layer for target in llama.cpp's convention, reading its normed last state: norms
    at one, the rest small and seeded (the embedding, final norm and lm_head are the target's,
    shared and frozen)."""
    layer = MTPLayer(target, last_layer(target.config.num_hidden_layers, normed=True),
                     **CONVENTION).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02 / math.sqrt(2))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return layer


def train_layer(target, train_ids, recipe: HeadRecipe, log=print) -> tuple:
    target.requires_grad_(False)      # the layer reads its embedding, norm and lm_head
    layer = init_layer(target, recipe.seed)
    params = list(layer.parameters())
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    weights = [recipe.pass_weight ** t for t in range(recipe.passes)]
    history = []
    layer.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(recipe, step)
        starts = torch.randint(0, len(train_ids) - recipe.seq_len - 2, (recipe.batch,),
                               generator=generator)
        ids = train_ids[starts[:, None] + torch.arange(recipe.seq_len + 1)]
        losses = mtp_losses(layer, target, ids, recipe)
        loss = sum(w * l for w, l in zip(weights, losses))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        history.append([round(float(l.detach()), 4) for l in losses])
        if log and (step % 50 == 0 or step == recipe.steps - 1):
            log(f"  step {step:4d}/{recipe.steps}  KL by pass "
                + " ".join(f"{l:.3f}" for l in history[-1]))
    return layer.eval().requires_grad_(False), history


@torch.no_grad()
def held_out_kl(layer, target, held_ids, recipe: HeadRecipe) -> list[float]:
    """Mean KL(p_target || q_layer) per pass over the first eval_windows disjoint held-out
    windows."""
    n = min(recipe.eval_windows, (len(held_ids) - 1) // (recipe.seq_len + 1))
    totals = [0.0] * recipe.passes
    for chunk in torch.arange(n).split(16):
        ids = held_ids[chunk[:, None] * (recipe.seq_len + 1) + torch.arange(recipe.seq_len + 1)]
        for t, loss in enumerate(mtp_losses(layer, target, ids, recipe)):
            totals[t] += float(loss) * len(chunk)
    return [round(x / n, 4) for x in totals]


def build(models: Path, recipe: HeadRecipe, log=print, prompts: int = 8) -> dict:
    """Train the layer on the pair in `models`, save it to models/mtp, measure, and add the
    "mtp" key to the manifest's "heads" entry."""
    from reference.pretrained import load_dir

    started = time.time()
    torch.manual_seed(recipe.seed)
    pair = load_dir(models)
    target = pair.target
    train_ids, held_ids = corpus_ids(pair, log)
    t0 = time.time()
    layer, history = train_layer(target, train_ids, recipe, log)
    train_s = round(time.time() - t0, 1)
    kl = held_out_kl(layer, target, held_ids, recipe)
    log(f"held-out KL(target || layer) by pass: {kl}")

    out = models / "mtp"
    save_head(layer, out, dtype=torch.float16)
    drafts = {"mtp": load_head(out, target), "small": pair.small}   # the layer as saved
    if (models / "eagle3" / "config.json").is_file():
        drafts["eagle3"] = pair.eagle3()
    measured = measure_drafts(pair, drafts, prompts, log)

    entry = {
        "what": "one MTP layer distilled from the target's normed last hidden state, in "
                "llama.cpp's draft-mtp convention (python -m reference.train_mtp)",
        "hidden": asdict(layer.hidden) | {"layers": list(layer.hidden.layers)},
        "convention": CONVENTION | {"mask0": False},
        "recipe": asdict(recipe), "seed": recipe.seed, "steps": recipe.steps,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in layer.parameters()),
        "final_train_kl": [round(sum(h[t] for h in history[-20:]) / len(history[-20:]), 4)
                           for t in range(recipe.passes)],
        "held_out_kl": kl,
        "acceptance": measured,
        "timings": {"train_s": train_s, "total_s": round(time.time() - started, 1)},
        "reproduce": "make models-heads (a retrain reproduces quality within the manifest's "
                     "margins, not bits)",
    }
    write_heads_entry(models, "mtp", entry)
    log(f"wrote {out} in {time.time() - started:.0f} s")
    return entry


def main(argv=None):
    from reference.train import check_steps_and_threads

    parser = argparse.ArgumentParser(prog="python -m reference.train_mtp")
    parser.add_argument("--models", type=Path, default=Path(__file__).parent / "trained",
                        help="the trained pair's folder (its target is frozen)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_steps_and_threads(parser, args)
    from dataclasses import replace
    recipe = replace(RECIPE, seed=args.seed)
    if args.steps is not None:
        recipe = recipe.quick(args.steps)
    build(args.models, recipe, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
