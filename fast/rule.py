"""The chapter's rule-level API, answered by the engine's vectorized sampler at B = 1, k = 1.

Routing the one-token rule through `rejection_sample` means the kit's rule-level statistics
(committed token ~ p, acceptance probability sum(min(p, q)), residual on rejection) test the
very code the batched engine runs.
"""

import torch

from reference.sampling import check_distribution

from fast.sampling import uniforms
from fast.verify import rejection_sample


def accept_or_correct(p, q, token, generator=None):
    """Verify draft token `token` drawn from q against the target's p -> (token, accepted).

    Accepts with probability min(1, p[token] / q[token]); on rejection draws from the normalized
    residual max(p - q, 0) (from p if that is empty). The committed token is distributed as p.
    """
    check_distribution(p, "p")
    check_distribution(q, "q")
    if p.dim() != 1 or q.shape != p.shape:
        raise ValueError(f"p and q must be 1-D distributions over the same vocabulary, got p of "
                         f"shape {tuple(p.shape)} and q of shape {tuple(q.shape)}")
    vocab = p.shape[0]
    if torch.is_tensor(token):
        if token.numel() != 1 or token.is_floating_point():
            raise ValueError(f"token must be one integer id, got tensor {token!r}")
        token = int(token.reshape(()))
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
        raise ValueError(f"token must be an int in [0, {vocab}), got {token!r}")
    if q[token] <= 0:
        raise ValueError(f"token {token} has probability 0 under q, so it cannot have been drawn from q")
    p64 = p.detach().to(torch.float64)
    q64 = q.detach().to(torch.float64).to(p64.device)
    block_p = torch.stack([p64, p64])[None]                  # [1, 2, V]; position 1 (bonus) unused
    proposals = torch.tensor([[token]], device=p64.device)   # [1, 1]
    u = uniforms((1, 2), generator, p64.device)              # acceptance and draw uniforms
    accepted, block = rejection_sample(block_p, q64[None, None], proposals, u[:, :1], u[:, 1])
    ok = bool(accepted[0] == 1)
    return (token if ok else int(block[0, 0])), ok
