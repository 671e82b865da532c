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

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from reference.distill import build as distill_build
from reference.distill import cli, distill, small_init, window_forward
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


def pass_kl(logits, passes_logits: list) -> list:
    """Per pass of a training-time test, KL(p_target || q) over a batch of windows: the target's
    logits [B, T + 1, V] over the windows, each pass's [B, T, V] (row i: the law of t_{i+2}),
    averaged over the positions every pass reaches (pass t needs i >= t - 1)."""
    T = logits.shape[1] - 1
    # pair i (feature f_i, token t_{i+1}) predicts the target's law at position i + 1
    p_log = F.log_softmax(logits[:, 1:T + 1], -1)                        # [B, T, V]
    first = len(passes_logits) - 1
    losses = []
    for logits_t in passes_logits:
        q_log = F.log_softmax(logits_t, -1).to(p_log.dtype)
        kl = F.kl_div(q_log[:, first:], p_log[:, first:], log_target=True, reduction="none")
        losses.append(kl.sum(-1).mean())
    return losses


def head_losses(head: Eagle3Head, target, ids, recipe: HeadRecipe) -> list:
    """Per pass, KL(p_target || q_head) over a batch of windows ids [B, T + 1] (pass_kl)."""
    logits, features = window_forward(target, ids, head.hidden)
    return pass_kl(logits, pass_logits(head, features, ids, recipe.passes))


def init_head(target, seed: int) -> Eagle3Head:
    """An EAGLE-3 head for target: its embedding a frozen copy of the target's, its final norm
    and lm_head starting as the target's (the head's output imitates a late hidden state),
    the rest small and seeded."""
    head = Eagle3Head.from_target(target).float()
    small_init(head, seed, keep=("embed_tokens.weight",))
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.model.norm.weight)
    head.embed_tokens.weight.requires_grad_(False)
    return head


def train_head(target, train_ids, recipe: HeadRecipe, log=print) -> tuple[Eagle3Head, list]:
    head = init_head(target, recipe.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    weights = [recipe.pass_weight ** t for t in range(recipe.passes)]
    return distill(head, params, lambda ids: head_losses(head, target, ids, recipe), train_ids,
                   recipe, weights, log)


def build(models: Path, recipe: HeadRecipe, log=print, prompts: int = 8) -> dict:
    """Train the head on the pair in `models`, save it to models/eagle3, measure, and add the
    "eagle3" key to the manifest's "heads" entry."""
    return distill_build(models, "eagle3", "an EAGLE-3 head distilled from the target's hidden "
                         "states (python -m reference.train_heads)", recipe, train_head,
                         lambda head, target, ids: head_losses(head, target, ids, recipe),
                         recipe.passes, log=log, prompts=prompts)


def main(argv=None):
    cli("python -m reference.train_heads", HeadRecipe(), build, argv)


if __name__ == "__main__":
    sys.exit(main())
