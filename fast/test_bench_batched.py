"""(a) The fast batched engine vs looping the reference engine over the same prompts.

Greedy, k = 4, the chapter's early-exit draft (the target's first 2 of 6 layers), `tiny`
target in float32, prompts of 4..24 tokens, 32 new tokens each. Throughput is generated tokens
per second; both engines produce the same tokens (checked). Goal: >= 40x at B = 32 (issue 41;
issue 24 had raised it from 10x to 30x). Where it is missed the run prints what bounds it: the
fast call's time split into its native decoder-layer calls (the target's verifies and the
draft's steps, counted by a timer around fast.fused.decoder_layers in one extra call) and the
rest (the round's Python and torch operations), and the ratio the fast side would reach with the
rest free.
"""

import time

import pytest
import torch

import fast
from reference.model import EarlyExit, random_model

reference = pytest.importorskip("reference.speculative")

BATCHES = [1, 8, 32]
NEW_TOKENS, K = 32, 4
GOAL = 40       # issue 41, at B = 32


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny", seed=0, dtype=torch.float32)
    return target, EarlyExit(target, 2)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(4, 25, (max(BATCHES),), generator=g).tolist()
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def workload(benchmark, prompts, batch):
    """The full workload when timing; a token or two per prompt for the smoke run."""
    if benchmark.disabled:
        return prompts[:min(batch, 2)], 2
    return prompts[:batch], NEW_TOKENS


@pytest.mark.parametrize("batch", BATCHES)
def test_a_reference_loop(benchmark, figures, models, prompts, batch):
    target, draft = models
    rows, new = workload(benchmark, prompts, batch)
    benchmark.group = f"(a) tokens/s at B={batch}"

    def run():
        return [reference.speculative_generate(target, draft, p, new, k=K)[0] for p in rows]

    # The reference at B = 32 takes seconds per call: two rounds, already warm from B = 1.
    rounds, warmup = {1: (5, 1), 8: (3, 0), 32: (2, 0)}[batch]
    outputs = benchmark.pedantic(run, rounds=rounds, warmup_rounds=warmup)
    tokens = sum(map(len, outputs))
    seconds = figures.seconds(benchmark)
    if seconds is not None:
        benchmark.extra_info["tokens_per_s"] = tokens / seconds
        figures.put(f"a/reference/{batch}", tokens / seconds)
        figures.put(f"a/outputs/{batch}", outputs)


@pytest.mark.parametrize("batch", BATCHES)
def test_a_fast_batched(benchmark, figures, models, prompts, batch):
    target, draft = models
    rows, new = workload(benchmark, prompts, batch)
    benchmark.group = f"(a) tokens/s at B={batch}"
    outputs, stats = benchmark.pedantic(fast.batched_generate, args=(target, draft, rows, new),
                                        kwargs={"k": K}, rounds=5, warmup_rounds=1)
    expected = figures.get(f"a/outputs/{batch}")
    if expected is not None:
        assert outputs == expected
    seconds = figures.seconds(benchmark)
    if seconds is None:
        return
    speed = sum(map(len, outputs)) / seconds
    benchmark.extra_info.update({"tokens_per_s": speed, "rounds": stats["rounds"]})
    baseline = figures.get(f"a/reference/{batch}")
    if baseline is not None:
        ratio = speed / baseline
        met = ratio >= GOAL if batch == 32 else None
        note = "" if met in (None, True) else layer_split(target, draft, rows, new, seconds,
                                                          ratio)
        figures.ratio(benchmark, f"(a) fast batched / reference loop, tokens/s, B={batch}", ratio,
                      f">= {GOAL}" if batch == 32 else None, met, note)


def layer_split(target, draft, rows, new, seconds: float, ratio: float) -> str:
    """The bounding arithmetic where (a) misses its goal: one more call with a timer around every
    native decoder-layer call (fast/fused.py), split into the target's and the draft's by the
    number of layers each call runs."""
    from fast import fused
    spent = {"target": 0.0, "draft": 0.0}
    layers_of_target = target.config.num_hidden_layers
    inner = fused.decoder_layers

    def timed(weights, *args, **kwargs):
        start = time.perf_counter()
        out = inner(weights, *args, **kwargs)
        who = "target" if len(weights.layers) == layers_of_target else "draft"
        spent[who] += time.perf_counter() - start
        return out

    fused.decoder_layers = timed
    try:
        start = time.perf_counter()
        fast.batched_generate(target, draft, rows, new, k=K)
        total = time.perf_counter() - start
    finally:
        fused.decoder_layers = inner
    layers = spent["target"] + spent["draft"]
    rest = max(total - layers, 0.0)
    return (f"in one timed call of {total * 1e3:.1f} ms (the benchmark's minimum "
            f"{seconds * 1e3:.1f} ms): the target's decoder layers {spent['target'] * 1e3:.1f} ms, "
            f"the draft's {spent['draft'] * 1e3:.1f} ms, everything else (the rounds' Python and "
            f"torch operations, lm_heads, sampling) {rest * 1e3:.1f} ms ({rest / total:.0%}); with "
            f"everything else free the ratio would be at most {ratio * total / layers:.1f}x, with "
            f"the draft free too {ratio * total / spent['target']:.1f}x")
