"""Training Medusa heads on the committed trained target, by distillation (make models-heads,
after the EAGLE-3 head).

    python -m reference.train_medusa --models reference/trained --threads 1

The target is frozen. Over random windows of its training corpus, one target forward gives its
feature f_j (the last layer's output after the final norm: what vLLM hands Medusa) and its
next-token law at every position j. Head i (i = 1 .. 4) reads f_j alone and learns the target's
law of t_{j+1+i}, the token i + 1 places after t_j, which is the target's output at position
j + i: the loss is KL(p_target || q_head) at temperature 1, as the EAGLE-3 head's. The law is
the target's after the text's own tokens, which is what the verifier compares proposal i with
whenever proposals 1 .. i - 1 were accepted (the only time proposal i is judged).

Medusa's heads are not chained, so there is no training-time test: each head is trained once,
at every position. They start as Medusa's do: each residual block the identity (zero weights),
each lm_head a copy of the target's, so head i starts out guessing t_{j+1} for t_{j+1+i}.

The heads are written to <models>/medusa/ (float16) and the manifest's "heads" entry gains a
"medusa" key (recipe, time, held-out KL per head, acceptance beside the small draft's and the
EAGLE-3 head's), with the new files' hashes. The target, the small draft and the other heads are
not touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from reference.heads.medusa import MedusaHeads
from reference.distill import build as distill_build
from reference.distill import cli, distill, window_forward


@dataclass(frozen=True)
class MedusaRecipe:
    seed: int = 0
    steps: int = 1000
    heads: int = 4                # one per drafted position: the engines' k
    batch: int = 16
    seq_len: int = 96
    lr: float = 3e-3
    warmup: int = 30
    eval_windows: int = 64        # held-out KL over this many windows

    def quick(self, steps: int) -> "MedusaRecipe":
        return replace(self, steps=steps, warmup=min(self.warmup, steps))


def medusa_losses(heads: MedusaHeads, target, ids) -> list:
    """Per head, KL(p_target || q_head) over a batch of windows ids [B, T + 1], averaged over
    the positions j every head is judged at (j + K <= T: the token K + 1 places ahead is in the
    window)."""
    K = heads.num_heads
    logits, features = window_forward(target, ids, heads.hidden)   # logits[:, j]: law of t_{j+1}
    p_log = F.log_softmax(logits, -1)
    n = ids.shape[1] - K                                            # positions judged
    q = heads(features[:, :n])                                      # [B, n, K, V]
    losses = []
    for i in range(1, K + 1):
        # head i at j: the law of t_{j+1+i}, the target's row j + i
        q_log = F.log_softmax(q[:, :, i - 1], -1).to(p_log.dtype)
        kl = F.kl_div(q_log, p_log[:, i:i + n], log_target=True, reduction="none")
        losses.append(kl.sum(-1).mean())
    return losses


def init_heads(target, recipe: MedusaRecipe) -> MedusaHeads:
    """Medusa heads for `target` as Medusa initialises them: every block the identity (zero
    weight and bias: x + silu(0) = x) and every lm_head the target's, so training starts from
    the target's own next-token law at every head."""
    heads = MedusaHeads(target.config, recipe.heads).float()
    with torch.no_grad():
        for block, lm_head in zip(heads.blocks, heads.lm_heads):
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
            lm_head.weight.copy_(target.lm_head.weight)
    return heads


def train_medusa(target, train_ids, recipe: MedusaRecipe, log=print) -> tuple:
    torch.manual_seed(recipe.seed)
    heads = init_heads(target, recipe)
    # the heads share nothing: the plain sum trains each on its own loss
    return distill(heads, list(heads.parameters()), lambda ids: medusa_losses(heads, target, ids),
                   train_ids, recipe, [1.0] * recipe.heads, log, label="head")


def build(models: Path, recipe: MedusaRecipe, log=print, prompts: int = 8) -> dict:
    """Train the heads on the pair in `models`, save them to models/medusa, measure, and add
    the "medusa" key to the manifest's "heads" entry."""
    return distill_build(models, "medusa", "Medusa heads distilled from the target's normed last "
                         "hidden state (python -m reference.train_medusa)", recipe, train_medusa,
                         medusa_losses, recipe.heads, init=init_heads, compare=("eagle3",),
                         label="head", log=log, prompts=prompts)


def main(argv=None):
    cli("python -m reference.train_medusa", MedusaRecipe(), build, argv)


if __name__ == "__main__":
    sys.exit(main())
