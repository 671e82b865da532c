"""Training a DFlash block drafter on the committed trained target, by distillation (make
models-heads, after the EAGLE-3, MTP and Medusa heads).

    python -m reference.train_dflash --models reference/trained --threads 1

The target is frozen. Over random windows of its training corpus, one target forward gives the
features the drafter reads and the target's next-token law at every position. A round whose
newest token t_n sits at position n drafts from the block [t_n, m, m, m, m] at positions
n .. n + 4, its context the features f_0 .. f_{n-1} (reference/heads/dflash.py); mask i learns
the target's law of t_{n+i} after the true prefix, the target's row n + i - 1:
KL(p_target || q) at temperature 1. That is the law the verifier compares proposal i with
whenever proposals 1 .. i - 1 were accepted, the only time proposal i is judged.

No training-time test is needed: a DFlash round is one forward that never reads its own
proposals, so the block trained here is the block drafted in a round. Every anchor n of a window
(1 .. T - 3: at least one verified feature, every mask's law inside the window) is trained at
once: the window's blocks sit side by side and an attention mask gives each block's queries
exactly what a round at that anchor sees, the context keys of positions < n and its own block
(tests/test_trained_dflash.py checks it against the head's round, anchor by anchor). Mask i's
loss weighs 0.8 ** (i - 1), as the EAGLE-3 head's passes do: a later mask is judged only when
the earlier ones were accepted.

Choices, so that both engines' exports carry the drafter as trained:
- the features: the outputs of target layers 0, 2 and 4 (low, middle, high), the states the
  EAGLE-3 head reads (the inputs of layers 1, 3, 5). Not layer 5, the last: llama.cpp records
  a Qwen3 layer's input only for layers below the depth, so a DFlash reading the last layer's
  output aborts llama-server (tests/findings/llamacpp_dflash_last_layer/);
- its own lm_head, starting as the target's: the target ties its lm_head to its embedding, and
  both engines load a DFlash checkpoint's lm_head as the draft's own (properties/export/dflash.py),
  as the served `dflash` methods already run;
- two decoder layers, a block of 5 (the newest and 4 masks: the engines' k = 4), the mask
  token the vocabulary's last id, as the served DFlash head.

The drafter is written to <models>/dflash/ (float16) and the manifest's "heads" entry gains a
"dflash" key (recipe, time, held-out KL per mask, acceptance beside the small draft's and the
other heads'), with the new files' hashes. The target, the small draft and the other heads are
not touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from reference.heads.dflash import DFlashHead
from reference.hidden import HiddenStates
from reference.distill import build as distill_build
from reference.distill import cli, distill, small_init, window_forward

# the outputs of target layers 0, 2, 4 of the 6-layer target: never the last (the docstring)
HIDDEN = HiddenStates((0, 2, 4), "output")


@dataclass(frozen=True)
class DFlashRecipe:
    seed: int = 0
    steps: int = 700
    block_size: int = 5           # the newest token and k = 4 masks
    num_layers: int = 2
    batch: int = 8
    seq_len: int = 96
    mask_weight: float = 0.8      # mask i's loss weighs mask_weight ** (i - 1)
    lr: float = 3e-3
    warmup: int = 30
    eval_windows: int = 64        # held-out KL over this many windows

    def quick(self, steps: int) -> "DFlashRecipe":
        return replace(self, steps=steps, warmup=min(self.warmup, steps))


def block_mask(anchors: torch.Tensor, context: int, block: int) -> torch.Tensor:
    """[A * block, context + A * block] bool: what each query of the blocks anchored at
    `anchors` (block a's newest token at position anchors[a]) may attend to -- the context keys
    of positions < its anchor and every key of its own block, as in a round at that anchor."""
    rows = torch.arange(len(anchors)).repeat_interleave(block)              # block of each query
    seen = torch.arange(context)[None, :] < anchors[rows][:, None]          # [A*block, context]
    own = rows[:, None] == rows[None, :]                                    # [A*block, A*block]
    return torch.cat([seen, own], dim=1)


def block_logits(head: DFlashHead, features, ids, anchors) -> torch.Tensor:
    """The head's logits for every block of a window at once: features [B, T + 1, width] (the
    target's, over ids [B, T + 1]), anchors [A] (positions n of the blocks' newest tokens) ->
    [B, A, block_size - 1, V], [:, a, i - 1] the law of t_{n_a + i} that a round at n_a gives."""
    B, L = ids.shape
    S = head.block_size
    A = len(anchors)
    context = head.hidden_norm(head.fc(features))                           # [B, L, H]
    tokens = torch.full((B, A, S), head.mask_token_id, dtype=torch.long)
    tokens[:, :, 0] = ids[:, anchors]
    x = head.target.model.embed_tokens(tokens.view(B, A * S))               # [B, A*S, H]
    block_positions = (anchors[:, None] + torch.arange(S)).reshape(-1).expand(B, A * S)
    context_positions = torch.arange(L).expand(B, L)
    mask = block_mask(anchors, L, S)
    for layer in head.layers:
        x = layer(x, context, block_positions, context_positions, mask)
    states = head.norm(x).view(B, A, S, -1)[:, :, head.first_row:]
    return head.readout()(states)


def dflash_losses(head: DFlashHead, target, ids, anchors=None) -> list:
    """Per mask i, KL(p_target || q) over a batch of windows ids [B, T + 1], averaged over the
    anchors (default every n in 1 .. T + 2 - block_size)."""
    L, k = ids.shape[1], head.block_size - 1
    if anchors is None:
        anchors = torch.arange(1, L - k + 1)
    logits, features = window_forward(target, ids, head.hidden)   # logits[:, r]: law of t_{r+1}
    p_log = F.log_softmax(logits, -1)
    q_log = F.log_softmax(block_logits(head, features, ids, anchors), -1)
    losses = []
    for i in range(1, k + 1):
        # mask i at anchor n: the law of t_{n+i}, the target's row n + i - 1
        p = p_log[:, anchors + i - 1]                                         # [B, A, V]
        kl = F.kl_div(q_log[:, :, i - 1].to(p.dtype), p, log_target=True, reduction="none")
        losses.append(kl.sum(-1).mean())
    return losses


def init_head(target, recipe: DFlashRecipe, hidden: HiddenStates = HIDDEN) -> DFlashHead:
    """A DFlash drafter for `target` reading `hidden`: its final norm and own lm_head starting
    as the target's (its output imitates a late hidden state, as the EAGLE-3 head's), the rest
    small and seeded."""
    head = DFlashHead(target, hidden, block_size=recipe.block_size,
                      num_layers=recipe.num_layers, own_lm_head=True).float()
    small_init(head, recipe.seed)     # its own weights: the target is held, not registered
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.model.norm.weight)
    return head


def train_dflash(target, train_ids, recipe: DFlashRecipe, log=print,
                 hidden: HiddenStates = HIDDEN) -> tuple:
    torch.manual_seed(recipe.seed)
    target.requires_grad_(False)      # frozen: no gradient reaches the borrowed embedding
    head = init_head(target, recipe, hidden)
    weights = [recipe.mask_weight ** i for i in range(recipe.block_size - 1)]
    return distill(head, list(head.parameters()), lambda ids: dflash_losses(head, target, ids),
                   train_ids, recipe, weights, log, label="mask")


def build(models: Path, recipe: DFlashRecipe, log=print, prompts: int = 8) -> dict:
    """Train the drafter on the pair in `models`, save it to models/dflash, measure, and add the
    "dflash" key to the manifest's "heads" entry."""
    return distill_build(models, "dflash", "a DFlash block drafter distilled from the target's "
                         "layer outputs (python -m reference.train_dflash)", recipe, train_dflash,
                         dflash_losses, recipe.block_size - 1, init=init_head,
                         compare=("eagle3", "mtp", "medusa"), chunk=8, noun="drafter",
                         label="mask", log=log, prompts=prompts)


def main(argv=None):
    cli("python -m reference.train_dflash", DFlashRecipe(), build, argv)


if __name__ == "__main__":
    sys.exit(main())
