"""The weight-bound target: the trained target grown (reference/widen.py) to a size whose step
is bound by reading its weights on a CPU, then trained a little further on the same corpus.

    python -m reference.grow --base reference/trained --out reference/trained-large

The committed pair's target (1.44M parameters) is so small that a step costs per-operation
overhead, not weight reads: a draft is then not much cheaper than the target, and speculation
cannot pay (BENCHMARKS.md, "The trained pair"). LARGE holds about 15M parameters, 60 MB in
float32: twice a 32 MB L3 cache, so each step streams its weights from memory, as a deployed
target does. Growing keeps the tokenizer and the held-out prompts, and starts from the target's
function, so a short training suffices.

The small draft is trained anew, distilled from the grown target: the base pair's draft has
head_dim 24, which vLLM's CPU attention refuses at the first request, so SMALL uses head_dim 32
(what the target uses, and what every served engine here runs).

Stored in float16 (about 30 MB): the model is rounded to float16 *before* anything is measured,
so loading the stored weights into float32 gives exactly the model whose loss and acceptance the
manifest states.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from reference import corpus
from reference.checkpoint import save_pretrained
from reference.model import Config
from reference.pretrained import load_dir
from reference.train import (Recipe, _jsonable, _teacher, check_steps_and_threads,
                             held_out_loss, init_model, sha256, train, write_manifest)
from reference.widen import widen

# The committed target's shape grown: hidden 128 -> 384, heads 4/2 -> 12/6 (head_dim 32 and the
# group size kept), MLP 384 -> 1152, 6 -> 8 layers (the early exit stays the first 2).
LARGE = dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=8,
             num_attention_heads=12, num_key_value_heads=6)
# The large pair's small draft: one layer of width 128 (4/2 heads of 32): about 0.05 of a target
# step at batch 1 in the reference engine, and shapes that every served engine loads.
SMALL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)


@dataclass(frozen=True)
class GrowRecipe:
    grow: dict = field(default_factory=lambda: dict(LARGE))
    small: dict = field(default_factory=lambda: dict(SMALL))
    steps: int = 300
    small_steps: int = 400     # the base pair's small-draft schedule (lr 3e-3, distil 0.5)
    lr: float = 1e-3           # a third of the small target's: it starts trained
    warmup: int = 20
    seed: int = 0

    def training(self, base: Recipe) -> Recipe:
        """The base's training recipe (windows, batch, exit loss) with this one's schedule."""
        return replace(base, lr=self.lr, warmup=min(self.warmup, self.steps), seed=self.seed)


def _base_recipe(manifest: dict) -> Recipe:
    r = dict(manifest["recipe"])
    r.pop("vocab_size", None)
    return Recipe(**{**r, "target": Config(**r["target"]), "small": Config(**r["small"])})


def grow(base_dir: Path, out: Path, recipe: GrowRecipe, log=print) -> dict:
    started = time.time()
    base = load_dir(base_dir)
    base_recipe = _base_recipe(base.manifest)
    training = recipe.training(base_recipe)
    files = corpus.corpus_files()
    train_files, held_files = corpus.split(files)
    tokenizer = base.tokenizer
    train_ids = torch.tensor(corpus.encode_files(tokenizer, [corpus.read(f) for f in train_files]))
    held_ids = torch.tensor(corpus.encode_files(tokenizer, [corpus.read(f) for f in held_files]))
    log(f"corpus: {len(train_ids)} training tokens, {len(held_ids)} held out "
        f"({time.time() - started:.0f} s)")

    config = replace(base.target.config, **recipe.grow)
    target = widen(base.target, config, seed=recipe.seed)
    log(f"grown target: {sum(p.numel() for p in target.parameters())} parameters "
        f"(from {sum(p.numel() for p in base.target.parameters())})")
    t0 = time.time()
    losses = train(target, train_ids, training, recipe.steps,
                   {config.num_hidden_layers: 1.0, base.exit_layers: base_recipe.exit_weight},
                   log=log)
    train_s = round(time.time() - t0, 1)
    target = target.half().float()   # what is stored is what is measured

    # distilled from the stored (rounded) target, with the base pair's small-draft schedule
    small_config = replace(base.small.config, **recipe.small)
    small = init_model(small_config, recipe.seed + 1)
    log(f"small draft: {sum(p.numel() for p in small.parameters())} parameters")
    t0 = time.time()
    small_training = replace(base_recipe, warmup=min(base_recipe.warmup, recipe.small_steps),
                             seed=recipe.seed)
    train(small, train_ids, small_training, recipe.small_steps,
          {small_config.num_hidden_layers: 1.0},
          teacher=_teacher(target, config.num_hidden_layers), log=log)
    small_s = round(time.time() - t0, 1)

    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(copy.deepcopy(target).half(), out / "target")
    save_pretrained(small, out / "small")
    for name in ("tokenizer.json", "heldout.json"):
        shutil.copy(base_dir / name, out / name)
    (out / "manifest.json").write_text(json.dumps({"early_exit_layers": base.exit_layers}))
    pair = load_dir(out)
    if any(not torch.equal(a, b) for a, b in zip(pair.target.state_dict().values(),
                                                   target.state_dict().values())):
        raise RuntimeError("the stored float16 target does not load back as the measured one")
    if any(not torch.equal(a, b) for a, b in zip(pair.small.state_dict().values(),
                                                   small.state_dict().values())):
        raise RuntimeError("the stored small draft does not load back as the measured one")
    held = {"target": held_out_loss(target, held_ids, training),
            "early_exit": held_out_loss(target, held_ids, training, base.exit_layers),
            "small": held_out_loss(pair.small, held_ids, training),
            "base_target": held_out_loss(base.target, held_ids, training),
            "base_small": held_out_loss(base.small, held_ids, training)}
    log("held-out loss (nats/token): " + ", ".join(f"{k} {v:.3f}" for k, v in held.items()))

    from reference import acceptance
    measured = acceptance.measure_all(pair, pair.prompts()[:8], max_new_tokens=64, k=4)
    manifest = {
        "what": "the trained target grown to a weight-bound size (python -m reference.grow), "
                "a small draft distilled from it, the base pair's tokenizer and held-out prompts",
        "base": {"dir": base_dir.name, "manifest_sha256": sha256(base_dir / "manifest.json")},
        "recipe": _jsonable(asdict(recipe)), "training": _jsonable(asdict(training)),
        "parameters": sum(p.numel() for p in target.parameters()),
        "small_parameters": sum(p.numel() for p in small.parameters()),
        "small_config": _jsonable(asdict(small_config)),
        "storage": "float16 (the model was rounded to float16 before it was measured)",
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "held_out_loss": {k: round(v, 4) for k, v in held.items()},
        "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "acceptance": measured,
        "timings": {"train_s": train_s, "small_s": small_s, "total_s": round(time.time() - started, 1)},
        "reproduce": "make models-large (retraining reproduces quality within the margins, "
                     "not bits)",
        "margins": {"held_out_loss": 0.1, "acceptance": 0.1},
        "early_exit_layers": base.exit_layers,
        "files": {},
    }
    write_manifest(out, manifest)
    log(f"wrote {out} in {manifest['timings']['total_s']:.0f} s")
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reference.grow")
    parser.add_argument("--base", type=Path, default=Path(__file__).parent / "trained")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "trained-large")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps of both the target and the small draft (a smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    check_steps_and_threads(parser, args)
    recipe = (GrowRecipe() if args.steps is None
              else GrowRecipe(steps=args.steps, small_steps=args.steps))
    grow(args.base, args.out, recipe, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
