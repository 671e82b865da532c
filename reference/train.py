"""Training the tiny trained models: a Qwen3-style target and a smaller separately trained draft.

    python -m reference.train --out reference/trained     (what `make models` runs)

The target is trained with an auxiliary loss at its exit layer (the final norm and head applied
to the residual stream after `exit_layer` blocks), so that the early-exit draft made of its first
layers predicts like the whole model. The small draft is trained on the same text with the same
tokenizer and learns partly from the target's own predictions (distillation): agreement with the
target, not text likelihood alone, is what a draft is for.

Everything is seeded; on the same machine and torch a rerun gives the same bits, elsewhere the
same quality (held-out loss and acceptance within the margins the manifest states).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from reference import corpus
from reference.checkpoint import save_pretrained
from reference.model import Config, Qwen3


@dataclass(frozen=True)
class Recipe:
    seq_len: int = 128
    batch: int = 32
    seed: int = 0
    target: Config = field(default_factory=lambda: Config(
        vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True))
    small: Config = field(default_factory=lambda: Config(
        vocab_size=2048, hidden_size=96, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True))
    exit_layer: int = 2           # the early-exit draft: the target's first 2 blocks
    exit_weight: float = 0.5      # weight of the auxiliary loss at the exit layer
    distill_weight: float = 0.5   # small draft: weight of KL(target || draft) beside the text loss
    target_steps: int = 720
    small_steps: int = 400
    lr: float = 3e-3
    warmup: int = 50
    eval_windows: int = 128       # held-out loss over this many windows of seq_len tokens

    def __post_init__(self):
        if self.small.vocab_size != self.target.vocab_size:
            raise ValueError(f"the small draft must share the target's vocabulary: small "
                             f"vocab_size={self.small.vocab_size}, target vocab_size="
                             f"{self.target.vocab_size}")

    @property
    def vocab_size(self) -> int:
        """The tokenizer's size: the target's vocabulary, stated once (in its config)."""
        return self.target.vocab_size

    def quick(self, steps: int) -> "Recipe":
        """The same recipe with few steps (tests; a smoke run of make models)."""
        return replace(self, target_steps=steps, small_steps=steps, warmup=min(self.warmup, steps))


class NoCache:
    """Stands in for a KVCache in training: a whole window at once, nothing kept."""

    length = 0

    def check_room(self, new_tokens):
        pass

    def write(self, layer, k, v):
        return k, v

    def advance(self, new_tokens):
        pass


def logits_at(model: Qwen3, ids, depths):
    """Logits after each number of blocks in `depths` (final norm and head applied there, as
    reference.model.EarlyExit does): {depth: [B, T, V]}; causal attention over the window."""
    from reference.model import prepare_inputs

    cache = NoCache()
    positions, mask = prepare_inputs(ids, cache, None, None, model.config.vocab_size)
    x = model.model.embed_tokens(ids)
    out = {}
    for depth, block in enumerate(model.layers, start=1):
        x = block(x, cache, positions, mask)
        if depth in depths:
            out[depth] = model.lm_head(model.model.norm(x))
    return out


def _windows(tokens, starts, seq_len):
    index = starts[:, None] + torch.arange(seq_len + 1)
    chunk = tokens[index]
    return chunk[:, :-1], chunk[:, 1:]


def _lr(recipe: Recipe, step: int, steps: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def init_model(config: Config, seed: int) -> Qwen3:
    torch.manual_seed(seed)
    model = Qwen3(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                # residual writes start small (scaled by depth), the usual GPT-2 style init
                p.normal_(0, 0.02 / math.sqrt(2 * config.num_hidden_layers))
            else:
                p.normal_(0, 0.02)
    return model


def train(model: Qwen3, tokens, recipe: Recipe, steps: int, depths: dict, teacher=None,
          log=None) -> list[float]:
    """AdamW on random windows of `tokens`. depths: {blocks: loss weight} (the last block is
    the model's output; others are exits). teacher: distil toward its output. Returns the
    training loss of every step."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    generator = torch.Generator().manual_seed(recipe.seed + steps)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": other, "weight_decay": 0.0}],
                                  lr=recipe.lr, betas=(0.9, 0.95))
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(recipe, step, steps)
        starts = torch.randint(0, len(tokens) - recipe.seq_len - 1, (recipe.batch,),
                               generator=generator)
        x, y = _windows(tokens, starts, recipe.seq_len)
        outs = logits_at(model, x, set(depths))
        loss = 0.0
        for depth, weight in depths.items():
            loss = loss + weight * F.cross_entropy(outs[depth].flatten(0, 1), y.flatten())
        text_loss = F.cross_entropy(outs[max(depths)].flatten(0, 1), y.flatten())
        if teacher is not None and recipe.distill_weight > 0:
            with torch.no_grad():
                target_logp = F.log_softmax(teacher(x), -1)
            draft_logp = F.log_softmax(outs[max(depths)], -1)
            kl = F.kl_div(draft_logp.flatten(0, 1), target_logp.flatten(0, 1),
                          log_target=True, reduction="batchmean")
            loss = (1 - recipe.distill_weight) * loss + recipe.distill_weight * kl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(text_loss.item())  # a plain float, outside the graph
        if log and (step % 50 == 0 or step == steps - 1):
            log(f"  step {step:4d}/{steps}  loss {losses[-1]:.3f}  lr {_lr(recipe, step, steps):.2e}")
    model.eval()
    return losses


@torch.no_grad()
def held_out_loss(model: Qwen3, tokens, recipe: Recipe, depth: int | None = None) -> float:
    """Mean next-token cross-entropy (nats) over the first eval_windows disjoint windows of the
    held-out stream, at the model's output or after `depth` blocks (an early exit)."""
    depth = depth or len(model.layers)
    n = min(recipe.eval_windows, (len(tokens) - 1) // recipe.seq_len)
    if n < 1:
        raise ValueError(f"held-out stream of {len(tokens)} tokens is shorter than one window")
    total, count = 0.0, 0
    for chunk in torch.arange(n).split(32):
        x, y = _windows(tokens, chunk * recipe.seq_len, recipe.seq_len)
        logits = logits_at(model, x, {depth})[depth]
        total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
        count += y.numel()
    return total / count


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_manifest(out: Path, manifest: dict):
    """manifest.json in `out`, with the sha256 of every other file there (check_manifest)."""
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            manifest["files"][path.relative_to(out).as_posix()] = sha256(path)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _teacher(target: Qwen3, depth: int):
    return lambda x: logits_at(target, x, {depth})[depth]


def build(out: Path, recipe: Recipe, log=print, prompts: int = 16) -> dict:
    """Train the tokenizer, the target and the small draft; write everything under `out`."""
    started = time.time()
    torch.manual_seed(recipe.seed)
    files = corpus.corpus_files()
    train_files, held_files = corpus.split(files)
    log(f"corpus: {len(files)} files from {corpus.stdlib_root()} ({len(held_files)} held out)")
    train_texts = [corpus.read(f) for f in train_files]
    held_texts = [corpus.read(f) for f in held_files]
    tokenizer = corpus.train_tokenizer(train_texts, recipe.vocab_size)
    train_ids = torch.tensor(corpus.encode_files(tokenizer, train_texts))
    held_ids = torch.tensor(corpus.encode_files(tokenizer, held_texts))
    log(f"tokenizer: {tokenizer.get_vocab_size()} tokens; {len(train_ids)} training tokens, "
        f"{len(held_ids)} held out ({time.time() - started:.0f} s)")

    timings = {}
    t0 = time.time()
    target = init_model(recipe.target, recipe.seed)
    log(f"target: {sum(p.numel() for p in target.parameters())} parameters")
    target_losses = train(target, train_ids, recipe, recipe.target_steps,
                          {recipe.target.num_hidden_layers: 1.0, recipe.exit_layer: recipe.exit_weight},
                          log=log)
    timings["target_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    small = init_model(recipe.small, recipe.seed + 1)
    log(f"small draft: {sum(p.numel() for p in small.parameters())} parameters")
    small_losses = train(small, train_ids, recipe, recipe.small_steps,
                         {recipe.small.num_hidden_layers: 1.0},
                         teacher=_teacher(target, recipe.target.num_hidden_layers), log=log)
    timings["small_s"] = round(time.time() - t0, 1)

    losses = {
        "target": held_out_loss(target, held_ids, recipe),
        "early_exit": held_out_loss(target, held_ids, recipe, recipe.exit_layer),
        "small": held_out_loss(small, held_ids, recipe),
    }
    log("held-out loss (nats/token): " + ", ".join(f"{k} {v:.3f}" for k, v in losses.items()))

    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(target, out / "target")
    save_pretrained(small, out / "small")
    tokenizer.save(str(out / "tokenizer.json"))
    held = heldout_prompts(held_ids, tokenizer, prompts, recipe.seed)
    (out / "heldout.json").write_text(json.dumps(held, indent=1) + "\n")

    from reference import acceptance  # measured on the models as saved (float32)
    from reference.pretrained import load_dir
    # load_dir wants a manifest (and the exit depth from it); the real one is written below
    (out / "manifest.json").write_text(json.dumps({"early_exit_layers": recipe.exit_layer}))
    pair = load_dir(out)
    measured = acceptance.measure_all(pair, [p["ids"] for p in held["prompts"][:8]], max_new_tokens=64, k=4)
    timings["total_s"] = round(time.time() - started, 1)

    manifest = {
        "what": "tiny trained Qwen3-style models for speculative decoding (python -m reference.train)",
        "data": {"source": "Python standard library sources (sysconfig stdlib)",
                 "python": platform.python_version(), "files": len(files),
                 "held_out_files": len(held_files), "excluded_dirs": sorted(corpus.EXCLUDED_PARTS),
                 "held_out_rule": f"sha256(relative path)[:4] % {corpus.HELD_OUT_EVERY} == 0",
                 "sha256": corpus.digest(files), "train_tokens": len(train_ids),
                 "held_out_tokens": len(held_ids)},
        "recipe": _jsonable(asdict(recipe)),
        "seed": recipe.seed,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "held_out_loss": {k: round(v, 4) for k, v in losses.items()},
        "final_train_loss": {"target": round(sum(target_losses[-20:]) / 20, 4) if len(target_losses) >= 20 else target_losses[-1],
                             "small": round(sum(small_losses[-20:]) / 20, 4) if len(small_losses) >= 20 else small_losses[-1]},
        "acceptance": measured,
        "timings": timings,
        "reproduce": "make models (retraining reproduces quality within the margins, not bits)",
        "margins": {"held_out_loss": 0.1, "acceptance": 0.1},
        "early_exit_layers": recipe.exit_layer,
        "files": {},
    }
    write_manifest(out, manifest)
    log(f"wrote {out} in {timings['total_s']:.0f} s")
    return manifest


def heldout_prompts(held_ids, tokenizer, count: int, seed: int, length: int = 48) -> dict:
    """`count` prompts of `length` tokens from the held-out stream, at seeded offsets that do not
    cross a file boundary; stored as text and ids so the demo needs no standard library."""
    eot = tokenizer.token_to_id(corpus.EOT)
    generator = torch.Generator().manual_seed(seed + 7)
    prompts, tries = [], 0
    while len(prompts) < count and tries < 100 * count:
        tries += 1
        start = int(torch.randint(0, len(held_ids) - length - 1, (), generator=generator))
        ids = held_ids[start:start + length].tolist()
        if eot in ids:
            continue
        prompts.append({"ids": ids, "text": tokenizer.decode(ids)})
    return {"length": length, "prompts": prompts}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def check_steps_and_threads(parser, args):
    """--steps (None or >= 1) and --threads (>= 1, then used by torch and the tokenizer)."""
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reference.train")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "trained")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps of each model (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    check_steps_and_threads(parser, args)
    recipe = Recipe(seed=args.seed)
    if args.steps is not None:
        recipe = recipe.quick(args.steps)
    build(args.out, recipe, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
