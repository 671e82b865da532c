"""Distilling a drafter from a frozen target: what every head's training shares (make
models-heads runs reference/train_heads.py for EAGLE-3, train_mtp.py, train_medusa.py and
train_dflash.py, each after the other).

Each of those files says what its drafter reads and what each of its losses is: a list of
KL(p_target || q) terms over a batch of corpus windows, one per pass of a training-time test,
per head or per mask. This file says how such losses are minimised (`distill`: AdamW, a warm-up
then a cosine, gradients clipped at 1, windows drawn from a generator seeded by the recipe), how
they are reported on held-out text (`held_out_kl`), how the result is measured beside the other
drafts (`measure_drafts`) and recorded in the trained pair's manifest (`entry`,
`write_heads_entry`; `build` does all of it for one drafter), how a drafter's own weights start (`small_init`), and the command
line they all take (`cli`).

A recipe is any frozen dataclass with seed, steps, batch, seq_len, lr, warmup and eval_windows
and a quick(steps) method (train_heads.HeadRecipe is the first).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from reference import corpus


@torch.no_grad()
def window_forward(target, ids, hidden):
    """The frozen target over whole windows ids [B, T + 1], no cache: (logits, the hidden
    states `hidden` names). Every head's distillation reads its teacher this way."""
    from reference.train import NoCache
    return target.forward_hidden(ids, NoCache(), hidden)


def lr_at(recipe, step: int) -> float:
    """Linear warm-up over recipe.warmup steps, then a cosine down to a tenth of recipe.lr."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def small_init(drafter, seed: int, keep=()):
    """Seed every weight of `drafter` not named in `keep`: norms at one, the rest drawn from
    N(0, 0.02^2) by a generator seeded with `seed`, the projections back into the residual
    stream (o_proj, down_proj) a further 1/sqrt(2) smaller, so the drafter starts close to
    passing its input through."""
    generator = torch.Generator().manual_seed(seed)
    for name, p in drafter.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            p.copy_(torch.randn(p.shape, generator=generator) * 0.02 / math.sqrt(2))
        elif name not in keep:
            p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


def distill(drafter, params, losses_of, train_ids, recipe, weights, log=print, label="pass"):
    """Minimise sum_t weights[t] * losses_of(ids)[t] over recipe.steps random windows of
    train_ids -> (the drafter, eval and frozen; the per-step losses). The windows come from a
    generator seeded with recipe.seed + 1, so a drafter's initialisation (seeded with
    recipe.seed by its own file) and its data are drawn apart."""
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    history = []
    drafter.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(recipe, step)
        starts = torch.randint(0, len(train_ids) - recipe.seq_len - 2, (recipe.batch,),
                               generator=generator)
        ids = train_ids[starts[:, None] + torch.arange(recipe.seq_len + 1)]
        losses = losses_of(ids)
        loss = sum(w * l for w, l in zip(weights, losses))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        history.append([round(float(l.detach()), 4) for l in losses])
        if log and (step % 50 == 0 or step == recipe.steps - 1):
            log(f"  step {step:4d}/{recipe.steps}  KL by {label} "
                + " ".join(f"{l:.3f}" for l in history[-1]))
    return drafter.eval().requires_grad_(False), history


@torch.no_grad()
def held_out_kl(losses_of, held_ids, recipe, count: int, chunk: int = 16) -> list[float]:
    """The mean of each of the `count` losses over the first recipe.eval_windows disjoint
    held-out windows, `chunk` windows a forward."""
    n = min(recipe.eval_windows, (len(held_ids) - 1) // (recipe.seq_len + 1))
    totals = [0.0] * count
    for part in torch.arange(n).split(chunk):
        ids = held_ids[part[:, None] * (recipe.seq_len + 1) + torch.arange(recipe.seq_len + 1)]
        for t, loss in enumerate(losses_of(ids)):
            totals[t] += float(loss) * len(part)
    return [round(x / n, 4) for x in totals]


def corpus_ids(pair, log=print) -> tuple:
    """The training and held-out token ids of the corpus the pair's target was trained on (the
    same split and tokenizer): the windows every head of this target is distilled on."""
    started = time.time()
    files = corpus.corpus_files()
    train_files, held_files = corpus.split(files)
    # a grown pair's manifest (make models-large) names its base's instead of its own data
    data = pair.manifest.get("data") or {}
    if "sha256" in data and corpus.digest(files) != data["sha256"]:
        log("warning: this Python's standard library differs from the text the target was "
            "trained on (manifest data.sha256); the head is distilled on this one")
    tokenizer = pair.tokenizer
    train_ids = torch.tensor(corpus.encode_files(tokenizer, [corpus.read(f) for f in train_files]))
    held_ids = torch.tensor(corpus.encode_files(tokenizer, [corpus.read(f) for f in held_files]))
    log(f"corpus: {len(train_ids)} training tokens, {len(held_ids)} held out "
        f"({time.time() - started:.0f} s)")
    return train_ids, held_ids


def measure_drafts(pair, drafts: dict, prompts: int = 8, log=print) -> dict:
    """Acceptance of each draft (name -> a draft model or head of pair.target) at T = 0 and 1
    on the first `prompts` held-out prompts, 64 tokens, k = 4: the heads' manifest figures."""
    from reference import acceptance
    held = [p["ids"] for p in pair.held["prompts"][:prompts]]
    measured = {}
    for name, draft in drafts.items():
        measured[name] = {f"T={t:g}": acceptance.measure(pair.target, draft, held, 64, 4, t)
                          for t in (0.0, 1.0)}
        log(f"acceptance {name}: " + ", ".join(
            f"{k} {v['acceptance']} (exact {v['exact']}, {v['tokens_per_target_call']} tokens "
            f"per target call)" for k, v in measured[name].items()))
    return measured


def entry(what: str, drafter, recipe, history, kl, measured, train_s: float, started: float,
          convention=None, untrained=None) -> dict:
    """A head's manifest entry: what it is, what it reads, its recipe and cost, its training
    and held-out KL (per pass, head or mask), and its acceptance beside the other drafts'."""
    out = {"what": what, "hidden": asdict(drafter.hidden) | {"layers": list(drafter.hidden.layers)}}
    if convention is not None:
        out["convention"] = convention
    out |= {
        "recipe": asdict(recipe), "seed": recipe.seed, "steps": recipe.steps,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "final_train_kl": [round(sum(h[t] for h in history[-20:]) / len(history[-20:]), 4)
                           for t in range(len(kl))],
        "held_out_kl": kl,
    }
    if untrained is not None:
        out["held_out_kl_untrained"] = untrained
    out |= {
        "acceptance": measured,
        "timings": {"train_s": train_s, "total_s": round(time.time() - started, 1)},
        "reproduce": "make models-heads (a retrain reproduces quality within the manifest's "
                     "margins, not bits)",
    }
    return out


def write_heads_entry(models: Path, name: str, entry: dict):
    """Set manifest["heads"][name] and rehash the directory's files, reading the manifest just
    before writing it: other heads' entries, written by other runs, are kept as they are."""
    from reference.train import write_manifest
    manifest = json.loads((models / "manifest.json").read_text())
    manifest.setdefault("heads", {})[name] = entry
    manifest["files"] = {}
    write_manifest(models, manifest)


def build(models: Path, name: str, what: str, recipe, train, losses, count: int, *, init=None,
          compare=(), chunk: int = 16, convention=None, noun: str = "head", label: str = "pass",
          log=print, prompts: int = 8) -> dict:
    """Train the drafter `name` on the pair in `models` and record it: train(target, train_ids,
    recipe, log) -> (drafter, history); losses(drafter, target, ids) -> its `count` loss terms
    (per pass, head or mask: `label`); init(target, recipe), where given, the untrained start
    whose held-out KL the entry keeps beside the trained one. The drafter is saved to
    models/name in float16 and measured as saved, beside the small draft and the heads named in
    `compare` that are already trained; its entry goes into the manifest's "heads"."""
    from reference.heads.checkpoint import load_head, save_head
    from reference.pretrained import load_dir

    started = time.time()
    torch.manual_seed(recipe.seed)
    pair = load_dir(models)
    target = pair.target
    train_ids, held_ids = corpus_ids(pair, log)
    untrained = None
    if init is not None:
        start = init(target, recipe)
        untrained = held_out_kl(lambda ids: losses(start, target, ids), held_ids, recipe, count,
                                chunk)
        log(f"held-out KL(target || {noun}) by {label}, untrained: {untrained}")
    t0 = time.time()
    drafter, history = train(target, train_ids, recipe, log)
    train_s = round(time.time() - t0, 1)
    kl = held_out_kl(lambda ids: losses(drafter, target, ids), held_ids, recipe, count, chunk)
    log(f"held-out KL(target || {noun}) by {label}: {kl}")

    out = models / name
    save_head(drafter, out, dtype=torch.float16)
    drafts = {name: load_head(out, target), "small": pair.small}   # as saved (float16)
    drafts |= {other: pair.head(other) for other in compare if pair.has_head(other)}
    measured = measure_drafts(pair, drafts, prompts, log)
    record = entry(what, drafter, recipe, history, kl, measured, train_s, started,
                   convention=convention, untrained=untrained)
    write_heads_entry(models, name, record)
    log(f"wrote {out} in {time.time() - started:.0f} s")
    return record


def cli(prog: str, recipe, build, argv=None):
    """The command line of a head's training: python -m PROG [--models DIR] [--seed N]
    [--steps N] [--threads N]; build(models, recipe, log) trains, saves and records."""
    from reference.train import check_steps_and_threads

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--models", type=Path, default=Path(__file__).parent / "trained",
                        help="the trained pair's folder (its target is frozen)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_steps_and_threads(parser, args)
    recipe = replace(recipe, seed=args.seed)
    if args.steps is not None:
        recipe = recipe.quick(args.steps)
    build(args.models, recipe, log=lambda s: print(s, flush=True))
