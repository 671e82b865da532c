"""Ground truth and set-up shared by the fast engine's tests and benchmarks.

`target_greedy` runs the reference model's own forward and cache one token at a time, so it
shares no code with the fast path it checks.
"""

import contextlib

import torch

from fast.weights import unwrap


@torch.no_grad()
def target_greedy(model, prompt, max_new_tokens: int, stop_ids=()) -> list[int]:
    """The target's greedy continuation of prompt: at most max_new_tokens, ending at a stop id."""
    model = unwrap(model)
    if max_new_tokens == 0:
        return []
    device = next(model.parameters()).device
    cache = model.new_cache(1, len(prompt) + max_new_tokens + 1)
    logits = model(torch.tensor([list(prompt)], device=device), cache)[0, -1]
    out = []
    while True:
        token = int(logits.argmax())
        out.append(token)
        if token in stop_ids or len(out) == max_new_tokens:
            return out
        logits = model(torch.tensor([[token]], device=device), cache)[0, -1]


@contextlib.contextmanager
def one_thread():
    """One intra-op thread while the tiny models run, restored afterwards.

    The tiny preset's ops last microseconds; on a small shared machine a second OpenMP thread
    only adds contention (measured: 10x slower and worse under load), for the fast path and the
    reference alike.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fast_cache(weights, batch: int, capacity: int = 40):
    """An empty StaticCache on the CPU for `batch` rows of `weights`' shape."""
    from fast.cache import StaticCache
    s = weights.shape
    return StaticCache(s.num_layers, batch, s.num_kv_heads, s.head_dim, capacity, weights.dtype, "cpu")


def chain(weights, cache, ids, start, span, logits_at="all"):
    """fast.forward of ids [B, T] fed as a chain at slots start[b] + t (causal within the block)."""
    from fast.forward import forward, window_mask
    T = ids.shape[1]
    slots = start[:, None] + torch.arange(T)
    mask = window_mask(start, torch.ones(T, T, dtype=torch.bool).tril(), span)
    return forward(weights, cache, ids, slots, slots, mask, span, logits_at)
