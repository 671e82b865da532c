"""Verification of a block of k proposals per row, vectorized over rows and positions.

Both rules return (accepted [B], block [B, k+1]): row b commits block[b, :accepted[b] + 1],
the accepted proposals followed by one corrected or bonus token. No Python loop over rows or
positions, no host sync.

Greedy: the target's argmax after each prefix. Where the proposals agree with it, the argmax IS
the proposal, so the committed block is simply the argmax row cut after the first mismatch.

Sampling (Leviathan et al. / Chen et al.): proposal i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)), tested as u_i * q_i(x_i) < p_i(x_i) with u_i ~ U[0, 1), which needs no
division and accepts with exactly that probability. The first rejection at position a draws from
the residual max(p_a - q_a, 0), normalized. If all k are accepted the bonus token is drawn from
p_k, which is the residual max(p_k - q_k, 0) with q_k = 0: both cases are one draw. Accepted
mass min(p, q) plus residual mass max(p - q, 0) is p at every token: each committed token is
distributed exactly as the target's.
"""

import torch

from fast import native
from fast.sampling import draw


def first_rejection(accept: torch.Tensor) -> torch.Tensor:
    """accept [B, k] bool -> number of leading Trues per row [B] (the accepted count)."""
    return accept.to(torch.long).cumprod(dim=1).sum(dim=1)               # 1 until the first 0


def greedy_verify(target_logits: torch.Tensor, proposals: torch.Tensor):
    """target_logits [B, k+1, V], proposals [B, k] -> (accepted [B], block [B, k+1])."""
    choice = target_logits.argmax(-1)                                    # [B, k+1], lowest index on ties
    accepted = first_rejection(proposals == choice[:, :-1])
    return accepted, choice


def rejection_sample(p: torch.Tensor, q: torch.Tensor, proposals: torch.Tensor,
                     u_accept: torch.Tensor, u_draw: torch.Tensor):
    """Exact speculative sampling for a block.

    p [B, k+1, V]: the target's distributions after each prefix (float64).
    q [B, k, V]: the draft's distributions the proposals [B, k] were drawn from.
    u_accept [B, k], u_draw [B]: float64 uniforms in [0, 1).
    Returns (accepted [B], block [B, k+1]).

    On a CPU this is fast/rejection.cpp, the same operations in one call (bit for bit the
    same result, tests/test_fast_native.py); elsewhere, or without the kernel, the tensor
    operations of `rejection_sample_ops`.
    """
    _check_shapes(p, q, proposals, u_accept, u_draw)
    if _kernel_applies(p, q, proposals, u_accept, u_draw):
        module = native.kernel()
        if module is not None:
            answer = module.rejection_sample(p.contiguous(), q.contiguous(), proposals.contiguous(),
                                             u_accept.contiguous(), u_draw.contiguous())
            if len(answer) == 1:
                row, position, token = answer[0].tolist()
                raise ValueError(f"proposals[{row}, {position}] = {token} is not a token of a "
                                 f"vocabulary of {p.shape[-1]}")
            accepted, block = answer
            return accepted, block
    return rejection_sample_ops(p, q, proposals, u_accept, u_draw)


def _check_shapes(p, q, proposals, u_accept, u_draw) -> None:
    """ValueError naming the argument whose shape does not fit the others (no values read)."""
    if proposals.dim() != 2 or proposals.shape[1] < 1:
        raise ValueError(f"proposals must be [B, k] with k >= 1, got {tuple(proposals.shape)}")
    (B, k), V = proposals.shape, p.shape[-1]
    for name, tensor, shape in (("p", p, (B, k + 1, V)), ("q", q, (B, k, V)),
                                ("u_accept", u_accept, (B, k)), ("u_draw", u_draw, (B,))):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} for proposals {list(proposals.shape)} "
                             f"and p's vocabulary of {V}, got {list(tensor.shape)}")


def _kernel_applies(p, q, proposals, u_accept, u_draw) -> bool:
    """The CPU kernel's contract beyond the shapes, checked here so that it never has to
    refuse (anything else goes to the tensor operations)."""
    return (all(t.device.type == "cpu" for t in (p, q, proposals, u_accept, u_draw))
            and p.dtype == q.dtype == u_accept.dtype == u_draw.dtype == torch.float64
            and proposals.dtype == torch.long)


def rejection_sample_ops(p: torch.Tensor, q: torch.Tensor, proposals: torch.Tensor,
                         u_accept: torch.Tensor, u_draw: torch.Tensor):
    """rejection_sample as tensor operations, vectorized over rows and positions."""
    B, k = proposals.shape
    index = proposals[:, :, None]                                        # [B, k, 1]
    p_x = p[:, :k].gather(2, index)[:, :, 0]                             # [B, k]
    q_x = q.gather(2, index)[:, :, 0]                                    # [B, k]
    accepted = first_rejection(u_accept * q_x < p_x)                     # [B]
    rows = torch.arange(B, device=p.device)
    p_a = p[rows, accepted]                                              # [B, V]
    q_a = q[rows, accepted.clamp(max=k - 1)]                             # [B, V]
    # Rejected at a < k: the residual. All accepted: q_k = 0, so the "residual" is p_k, the bonus.
    residual = torch.where((accepted < k)[:, None], (p_a - q_a).clamp_min(0), p_a)
    # p == q to rounding leaves no residual mass (and a rejection had ~zero probability):
    # draw from p itself, as the chapter's rule does.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_a)
    correction = draw(residual, u_draw)                                  # [B]
    padded = torch.cat([proposals, correction[:, None]], 1)              # [B, k+1]
    position = torch.arange(k + 1, device=proposals.device)
    block = torch.where(position < accepted[:, None], padded, correction[:, None])
    return accepted, block
