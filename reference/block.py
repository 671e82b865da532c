"""Block verification: the round's proposals judged as one block, not token by token.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block verification accelerates
speculative decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2. Written here from the
paper's mathematics; the notation is the paper's where it has one.

A round after the committed sequence c has proposals x_1 .. x_n, x_i drawn from the draft's law
q_i = q(. | c, x_<i), and the target's laws p_i = p(. | c, x_<i), i = 1 .. n + 1 (row i - 1 of
the verify forward). Define the block's running weight and residual

    w_0 = 1,   w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))                      (i = 1 .. n)
    r_i(y) = max(w_i p_{i+1}(y) - q_{i+1}(y), 0),   rho_i = sum_y r_i(y)       (i = 0 .. n-1)

(w_i is the target-to-draft likelihood ratio of the block x_<=i, capped at 1 along the way.)
Draw independent uniforms u_1 .. u_n, let

    h_i = rho_i / (rho_i + 1 - w_i)   (i < n; 1 where the denominator is 0),   h_n = w_n,

accept tau = the largest i with u_i < h_i (0 if none): commit x_1 .. x_tau, then one token of
the target's own, y ~ r_tau / rho_tau if tau < n, y ~ p_{n+1} if tau = n.

Why the output is the target's own (the proof obligations the code below keeps):

(1) P(tau >= i | x_<=i) = w_i. At i = n it is h_n = w_n. Going down, since x_{i+1} ~ q_{i+1},
    E[w_{i+1} | x_<=i] = sum_y min(q_{i+1}(y), w_i p_{i+1}(y)) = w_i - rho_i, so
    P(tau >= i | x_<=i) = 1 - (1 - h_i)(1 - E[w_{i+1} | x_<=i]) = 1 - (1 - h_i)(1 - w_i + rho_i)
    = w_i, exactly by the choice of h_i. (This is why tau is the *largest* passing index: the
    later positions are tried first, and h_i only tops up what they left.)
(2) So P(tau = i | x_<=i) = w_i - (w_i - rho_i) = rho_i for i < n: the round stops at i as
    often as the residual r_i has mass, and y ~ r_i / rho_i there.
(3) Losslessness. With Q(x_<=i) = prod q_j(x_j) and W_i = Q(x_<=i) w_i, the mass a round puts
    on "x_<=i committed, then y" is Q(x_<=i) r_i(y) = W_i p_{i+1}(y) - W_{i+1}(x_<=i, y) (as
    W_{i+1} = min(Q(x_<=i+1), W_i p_{i+1}(x_{i+1}))). Adding these over the ways a sequence of
    tokens can come out (stopped at i = 0, 1, .., then continued by the target) telescopes to
    W_0 p(x_<=m) = p(x_<=m), the target's joint law, for every m <= n + 1.
(4) Never worse than token-wise: P(tau >= i) = sum over x_<=i of W_i, and
    W_i >= W_{i-1} min(p_i(x_i), q_i(x_i)) (since W_{i-1} <= Q(x_<i)), the token-wise weight,
    so the accepted count dominates token-wise verification's at every position (the paper's
    theorem; properties/acceptance_sampled.py computes both laws exactly). With n = 1, or
    one-hot q (argmax drafts, prompt lookup), or q = p, the two laws are equal.

Greedy (temperature 0) p is one-hot at the argmax and drafts are argmaxes: w_i is 1 while the
proposals match the target's argmax and 0 after, and the rule commits the matching prefix and
the target's argmax, exactly as token-wise greedy verification does.
"""

import torch

from reference.sampling import check_distribution, greedy_token


def block_accept(p, q, proposals, generator=None):
    """Block verification of one round at the level of distributions (the block rule's "rule"
    API, as accept_or_correct is the token-wise one). -> (new tokens, accepted).

    p [n + 1, V]: the target's law after the committed sequence and i proposals, row i.
    q [n, V]: the law proposals[i] was drawn from (independently of the verdict), row i.
    The new tokens are the accepted proposals and one token of the target's own.
    """
    p, q, proposals = _checked(p, q, proposals)
    n = len(proposals)
    # w[i]: the block's capped likelihood ratio after i proposals (the docstring's w_i).
    w = [1.0]
    for i, x in enumerate(proposals):
        w.append(min(1.0, w[-1] * float(p[i, x]) / float(q[i, x])))
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=p.device)
    tau = 0
    for i in range(1, n + 1):
        if i == n:
            h = w[n]
        else:
            rho = float(_residual(w[i], p[i], q[i]).sum())
            denominator = rho + 1.0 - w[i]
            # 0 only where w_i = 1 and rho_i = 0 (p_{i+1} = q_{i+1}): nothing to stop into,
            # and (1) holds with h = 1
            h = rho / denominator if denominator > 0 else 1.0
        if u[i - 1] < h:      # P(u < h) = h for u uniform on [0, 1)
            tau = i           # the largest passing index wins: obligation (1)
    if tau == n:
        y = int(torch.multinomial(p[n], 1, generator=generator))
    else:
        residual = _residual(w[tau], p[tau], q[tau])
        # obligation (2): tau = i < n has probability rho_i, so a zero residual here can only
        # come from rounding where p_{i+1} = q_{i+1}; then p is the answer
        if residual.sum() <= 0:
            residual = p[tau]
        y = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return proposals[:tau] + [y], tau


def verify_block(target_logits, proposals, q, sampler):
    """reference.speculative.verify under block verification: (new tokens, accepted).

    target_logits [len(proposals) + 1, V]: row i follows the committed sequence and the first
    i proposals; q[i] is the law proposals[i] was drawn from (the proposer's promise).
    """
    if sampler.greedy:
        # one-hot p and argmax drafts: block verification is the matching prefix (docstring)
        new_tokens = []
        for i, proposal in enumerate(proposals):
            new_tokens.append(int(greedy_token(target_logits[i])))
            if new_tokens[-1] != proposal:
                return new_tokens, i
        return new_tokens + [int(greedy_token(target_logits[len(proposals)]))], len(proposals)
    p = torch.stack([sampler.probs(target_logits[i]) for i in range(len(proposals) + 1)])
    q = (torch.stack([d.double() for d in q]) if len(q) else
         torch.zeros(0, p.shape[-1], dtype=torch.float64, device=p.device))
    return block_accept(p, q, proposals, sampler.generator)


def _residual(w_i, p_next, q_next):
    """r_i = max(w_i p_{i+1} - q_{i+1}, 0): where the target, weighted by how far the block
    has got, still wants more than the draft proposes."""
    return (w_i * p_next - q_next).clamp_min(0)


def _checked(p, q, proposals):
    """p [n + 1, V] and q [n, V] as float64 laws, proposals a list of n token ids drawn from q;
    anything else is refused, naming the argument and the value."""
    check_distribution(p, "p")
    check_distribution(q, "q")
    try:
        proposals = [int(x) for x in proposals]
    except (TypeError, ValueError):
        raise ValueError(f"proposals must be a sequence of token ids, got {proposals!r}") from None
    n = len(proposals)
    if p.dim() != 2 or q.dim() != 2 or p.shape != (n + 1, q.shape[1]) or q.shape[0] != n:
        raise ValueError(f"for {n} proposals p must be [{n + 1}, V] and q [{n}, V] over one "
                         f"vocabulary, got p {tuple(p.shape)} and q {tuple(q.shape)}")
    V = p.shape[1]
    for i, x in enumerate(proposals):
        if not 0 <= x < V:
            raise ValueError(f"proposals[{i}] = {x} is outside the vocabulary [0, {V})")
        if q[i, x] <= 0:
            raise ValueError(f"proposals[{i}] = {x} has probability 0 under q[{i}], so it cannot "
                             f"have been drawn from q")
    return p.double(), q.double(), proposals
