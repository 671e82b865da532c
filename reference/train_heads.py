"""Training an EAGLE-3 head on the committed trained target, by distillation from its hidden
states (make models-heads; make models runs it after retraining the pair).

    python -m reference.train_heads --models reference/trained --threads 1

The target is frozen. Over random windows of the training corpus (the same text and tokenizer
as the target's), one target forward gives its hidden states at the head's layers and its
next-token law at every position; the head learns, at each pair (f_j, t_{j+1}), the target's
law of t_{j+2}: the KL divergence KL(p_target || q_head), at temperature 1.

Training-time test (EAGLE-3): a head proposes k tokens a round by feeding its own output back,
so it is also trained that way. Pass 1 reads the target's features; pass t > 1 reads, at
position i, the head's pass t - 1 output at i - 1, and attends exactly as it would at step t of
a round: to the verified pairs (pass 1) at positions <= i - t + 1 and to its own pairs of passes
2 .. t at positions i - t + 2 .. i (one each). Every pass predicts the same target law (of
t_{i+2}, after the true prefix), which is what the verifier will compare its proposal with.

The head is written to <models>/eagle3/ (float16) and the trained directory's manifest gains a
"heads" entry (seed, steps, time, loss, acceptance beside the small draft's on the held-out
prompts) with the new files' hashes. The target and the small draft are not touched.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from reference import corpus
from reference.heads.checkpoint import load_head, save_head
from reference.heads.eagle3 import Eagle3Head


@dataclass(frozen=True)
class HeadRecipe:
    seed: int = 0
    steps: int = 600
    batch: int = 16
    seq_len: int = 96
    passes: int = 3               # training-time test depth: rounds of up to k = passes
    pass_weight: float = 0.8      # pass t's loss weighs pass_weight ** (t - 1)
    lr: float = 3e-3
    warmup: int = 30
    eval_windows: int = 64        # held-out KL over this many windows

    def quick(self, steps: int) -> "HeadRecipe":
        from dataclasses import replace
        return replace(self, steps=steps, warmup=min(self.warmup, steps))


class PassCache:
    """The cache of the training-time test for a chained head's one layer (EAGLE-3's here, the
    MTP layer's in train_mtp.py): pass t's attention sees the keys and values of passes
    1 .. t - 1 (kept as written, gradients flowing) beside its own. Only `write` is used: the
    layer is called directly with explicit positions and mask."""

    def __init__(self):
        self.keys, self.values = [], []

    def write(self, layer, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)


class _Window:
    """Stands in for a KVCache in the target's forward over a whole window."""

    length = 0

    def check_room(self, new_tokens):
        pass

    def write(self, layer, k, v):
        return k, v

    def advance(self, new_tokens):
        pass


@torch.no_grad()
def window_forward(target, ids, hidden):
    """The frozen target over whole windows ids [B, T + 1], no cache: (logits, the hidden
    states `hidden` names). Every head's distillation reads its teacher this way."""
    return target.forward_hidden(ids, _Window(), hidden)


def pass_mask(T: int, t: int) -> torch.Tensor:
    """[T, t * T] bool: what pass t's query at position i may attend to. Block 1 (pass 1, the
    verified pairs): positions j <= i - t + 1; block u = 2 .. t: position i - t + u only. For
    t = 1 that is the causal mask."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    blocks = [j <= i - t + 1] + [j == i - t + u for u in range(2, t + 1)]
    return torch.cat(blocks, dim=1)


def pass_logits(head: Eagle3Head, features, ids, passes: int) -> list:
    """The head's logits in each pass of the training-time test over windows: features
    [B, T + 1, width] (the target's, over ids), ids [B, T + 1] -> per pass [B, T, Vd], row i
    the head's law of t_{i+2} at step t of a round (see the module's docstring)."""
    B, T = ids.shape[0], ids.shape[1] - 1
    embeds = head.embed_tokens(ids[:, 1:T + 1])                           # t_{i+1}: [B, T, H]
    positions = torch.arange(T, device=ids.device).expand(B, T)
    cache = PassCache()
    h = head.fc(features[:, :T])                                          # pass 1: [B, T, H]
    out = []
    for t in range(1, passes + 1):
        mask = pass_mask(T, t).to(ids.device).expand(B, T, t * T)
        g = head.midlayer(embeds, h, cache, positions, mask)              # [B, T, H]
        out.append(head.lm_head(head.norm(g)))                            # [B, T, Vd]
        # pass t + 1 at position i reads pass t's output at i - 1 (position 0: never judged)
        h = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)
    return out


def head_losses(head: Eagle3Head, target, ids, recipe: HeadRecipe) -> list:
    """Per pass, KL(p_target || q_head) over a batch of windows ids [B, T + 1], averaged over
    the positions every pass reaches (pass t needs i >= t - 1)."""
    T = ids.shape[1] - 1
    logits, features = window_forward(target, ids, head.hidden)
    # pair i (feature f_i, token t_{i+1}) predicts the target's law at position i + 1
    p_log = F.log_softmax(logits[:, 1:T + 1], -1)                        # [B, T, V]
    first = recipe.passes - 1
    losses = []
    for logits_t in pass_logits(head, features, ids, recipe.passes):
        q_log = F.log_softmax(logits_t, -1).to(p_log.dtype)
        kl = F.kl_div(q_log[:, first:], p_log[:, first:], log_target=True, reduction="none")
        losses.append(kl.sum(-1).mean())
    return losses


def init_head(target, seed: int) -> Eagle3Head:
    """An EAGLE-3 head for target: its embedding a frozen copy of the target's, its final norm
    and lm_head starting as the target's (the head's output imitates a late hidden state),
    the rest small and seeded."""
    head = Eagle3Head.from_target(target).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02 / math.sqrt(2))
            elif name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.model.norm.weight)
    head.embed_tokens.weight.requires_grad_(False)
    return head


def lr_at(recipe, step: int) -> float:
    """Linear warm-up over recipe.warmup steps, then a cosine down to a tenth of recipe.lr."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_head(target, train_ids, recipe: HeadRecipe, log=print) -> tuple[Eagle3Head, list]:
    head = init_head(target, recipe.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    weights = [recipe.pass_weight ** t for t in range(recipe.passes)]
    history = []
    head.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(recipe, step)
        starts = torch.randint(0, len(train_ids) - recipe.seq_len - 2, (recipe.batch,),
                               generator=generator)
        ids = train_ids[starts[:, None] + torch.arange(recipe.seq_len + 1)]
        losses = head_losses(head, target, ids, recipe)
        loss = sum(w * l for w, l in zip(weights, losses))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        history.append([round(float(l.detach()), 4) for l in losses])
        if log and (step % 50 == 0 or step == recipe.steps - 1):
            log(f"  step {step:4d}/{recipe.steps}  KL by pass "
                + " ".join(f"{l:.3f}" for l in history[-1]))
    return head.eval().requires_grad_(False), history


@torch.no_grad()
def held_out_kl(head, target, held_ids, recipe: HeadRecipe) -> list[float]:
    """Mean KL(p_target || q_head) per pass over the first eval_windows disjoint held-out
    windows."""
    n = min(recipe.eval_windows, (len(held_ids) - 1) // (recipe.seq_len + 1))
    totals = [0.0] * recipe.passes
    for chunk in torch.arange(n).split(16):
        ids = held_ids[chunk[:, None] * (recipe.seq_len + 1) + torch.arange(recipe.seq_len + 1)]
        for t, loss in enumerate(head_losses(head, target, ids, recipe)):
            totals[t] += float(loss) * len(chunk)
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


def write_heads_entry(models: Path, name: str, entry: dict):
    """Set manifest["heads"][name] and rehash the directory's files, reading the manifest just
    before writing it: other heads' entries, written by other runs, are kept as they are."""
    from reference.train import write_manifest
    manifest = json.loads((models / "manifest.json").read_text())
    manifest.setdefault("heads", {})[name] = entry
    manifest["files"] = {}
    write_manifest(models, manifest)


def build(models: Path, recipe: HeadRecipe, log=print, prompts: int = 8) -> dict:
    """Train the head on the pair in `models`, save it to models/eagle3, measure, and add the
    "heads" entry to models/manifest.json."""
    from reference.pretrained import load_dir

    started = time.time()
    torch.manual_seed(recipe.seed)
    pair = load_dir(models)
    target = pair.target
    train_ids, held_ids = corpus_ids(pair, log)
    t0 = time.time()
    head, history = train_head(target, train_ids, recipe, log)
    train_s = round(time.time() - t0, 1)
    kl = held_out_kl(head, target, held_ids, recipe)
    log(f"held-out KL(target || head) by pass: {kl}")

    out = models / "eagle3"
    save_head(head, out, dtype=torch.float16)
    saved = load_head(out, target)          # measured as saved (float16 -> the target's dtype)
    measured = measure_drafts(pair, {"eagle3": saved, "small": pair.small}, prompts, log)

    entry = {
        "what": "an EAGLE-3 head distilled from the target's hidden states "
                "(python -m reference.train_heads)",
        "hidden": asdict(head.hidden) | {"layers": list(head.hidden.layers)},
        "recipe": asdict(recipe), "seed": recipe.seed, "steps": recipe.steps,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in head.parameters()),
        "final_train_kl": [round(sum(h[t] for h in history[-20:]) / len(history[-20:]), 4)
                           for t in range(recipe.passes)],
        "held_out_kl": kl,
        "acceptance": measured,
        "timings": {"train_s": train_s, "total_s": round(time.time() - started, 1)},
        "reproduce": "make models-heads (a retrain reproduces quality within the manifest's "
                     "margins, not bits)",
    }
    write_heads_entry(models, "eagle3", entry)
    log(f"wrote {out} in {time.time() - started:.0f} s")
    return entry


def main(argv=None):
    from reference.train import check_steps_and_threads

    parser = argparse.ArgumentParser(prog="python -m reference.train_heads")
    parser.add_argument("--models", type=Path, default=Path(__file__).parent / "trained",
                        help="the trained pair's folder (its target is frozen)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_steps_and_threads(parser, args)
    recipe = HeadRecipe(seed=args.seed)
    if args.steps is not None:
        recipe = recipe.quick(args.steps)
    build(args.models, recipe, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
