"""A round's draft laws replayed from the target's features: what reference.acceptance needs to
compute a head's exact acceptance beside the measured one."""

import torch

from reference.heads.base import lead_pairs, with_lead
from reference.heads.dflash import DFlashHead
from reference.heads.medusa import MedusaHeads


@torch.no_grad()
def round_logits(head, features, seq, n: int, count: int) -> torch.Tensor:
    """The head's logits for proposals 1 .. count of a round whose newest token is seq[n],
    when its proposals 1 .. count - 1 were seq[n + 1 ..] (the accepted ones): [count, V] on
    the target's vocabulary (-inf outside a draft vocabulary, so that any temperature's softmax
    is the q the proposer hands the verifier). features: the target's features over seq,
    [len(seq), width]; the round reads the verified ones, rows 0 .. n - 1."""
    if not 1 <= n < len(seq) or count < 0 or n + count > len(seq):
        raise ValueError(f"round_logits: n={n}, count={count} do not fit a sequence of "
                         f"{len(seq)} tokens (need 1 <= n, n + count <= {len(seq)})")
    device = features.device
    if isinstance(head, MedusaHeads):
        rows = head(features[n - 1:n][None])[0, 0, :count]                   # [count, V]
    elif isinstance(head, DFlashHead):
        # one forward over [seq[n], masks]: proposal i never reads the proposals before it
        if count > head.max_proposals:
            raise ValueError(f"round_logits: a DFlash block of {head.block_size} tokens gives "
                             f"at most {head.max_proposals} proposals, asked for {count}")
        rows = head(features[:n][None], torch.tensor([seq[n]], device=device))[0, :count]
    else:
        lead = lead_pairs(head)            # llama.cpp's MTP: t_0 and a zero state first
        cache = head.new_cache(lead + n + count)
        tokens = torch.tensor([seq[1 - lead:n + 1]], device=device)           # t_{j+1}, j < n
        logits, g = head(tokens, with_lead(head, head.start(features[:n][None]), -lead), cache)
        out = [logits[0, -1]]
        for s in range(1, count):
            logits, g = head(torch.tensor([[seq[n + s]]], device=device), g[:, -1:], cache)
            out.append(logits[0, -1])
        rows = torch.stack(out)[:count]                                       # [count, Vd]
    d2t = getattr(head, "draft_to_target", None)
    if d2t is None:
        return rows
    placed = torch.full((rows.shape[0], head.config.vocab_size), float("-inf"),
                        dtype=rows.dtype, device=device)
    placed[:, d2t] = rows
    return placed
