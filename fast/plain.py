"""Plain (non-speculative) batched decoding with the fast engine's own kernels and cache: the
baseline that speculative decoding is timed against (fast/test_bench_trained.py). One target
call per generated token, nothing else: the same forward, the same static cache, the same
sampler as the speculative engine, so a speed-up measured against it is speculation's alone.
"""

import torch

from fast import checks
from fast.engine import graphs_wanted
from fast.sampling import device_generator
from fast.graphs import StepRunner
from fast.runner import ModelRunner, padded_prompts
from fast.sampling import Sampler
from fast.weights import model_weights


@torch.no_grad()
def plain_generate(target, prompts, max_new_tokens: int, temperature: float = 0.0,
                   generator=None, *, top_k: int = 0, top_p: float = 1.0, cuda_graphs=None):
    """Every row continued by max_new_tokens tokens of the target alone (greedy argmax, or an
    exact draw from the filtered law); no stop ids. Returns the outputs, a list of lists."""
    checks.check_cuda_graphs(cuda_graphs)
    checks.check_sampling(temperature, top_k, top_p)
    checks.check_generator(generator)
    weights = model_weights(target, "target")
    prompts = checks.check_prompts(prompts, weights.shape.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    device, B = weights.device, len(prompts)
    longest = max(len(p) for p in prompts)
    capacity = longest + max_new_tokens
    runner = ModelRunner(weights, B, capacity, StepRunner(graphs_wanted(cuda_graphs, device), device))
    padded, lengths = padded_prompts(prompts, device)                         # [B, P-1], [B]
    runner.prefill(padded, lengths)
    last = torch.tensor([p[-1] for p in prompts], device=device)              # [B]
    sampler = Sampler(temperature, top_k, top_p, device_generator(generator, device), device, B)
    rows = torch.arange(B, device=device)
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)     # [B, max_new]
    for step in range(max_new_tokens):
        logits = runner.chain(last[:, None], lengths, longest + step + 1, logits_at="last")
        last, _ = sampler.pick(logits, rows)
        out[:, step] = last
        lengths = lengths + 1
    return out.tolist()
