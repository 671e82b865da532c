"""(t) Speculative vs plain decoding with the trained pair (reference/trained/), side by side.

The trained target (6 layers, 1.4M parameters) continues held-out text (prompts of 48 tokens,
64 new tokens each) plainly and with each trained draft (the small 1-layer model, the target's
early exit), k = 4, greedy and at T = 1, in the reference engine (batch 1) and in the fast
engine (batch 1 and 8; plain decoding there is fast/plain.py, the same kernels and cache).
Reported: tokens/s of each, and speculative / plain tokens/s as ratios measured in this run
(with tokens per target call beside them). Greedy outputs are checked equal to plain decoding.
Target: speculation beats plain decoding (ratio > 1) with at least one trained draft.
"""

import pytest
import torch

import fast
from fast.plain import plain_generate

reference = pytest.importorskip("reference.speculative")
pretrained = pytest.importorskip("reference.pretrained")

K, NEW_TOKENS = 4, 64
BATCHES = (1, 8)
DRAFTS = ("small", "early-exit")
TEMPERATURES = (0.0, 1.0)


@pytest.fixture(scope="module")
def pair():
    return pretrained.load(torch.float32)


def workload(benchmark, pair, batch):
    """Batch 1: four prompts one after another (acceptance varies from prompt to prompt);
    batch 8: eight prompts in one batch. The smoke run: one prompt, two tokens."""
    prompts = pair.prompts()[:4 if batch == 1 else batch]
    return (prompts[:1], 2) if benchmark.disabled else (prompts, NEW_TOKENS)


def batches(rows, batch):
    return [[p] for p in rows] if batch == 1 else [rows]


def _record(benchmark, figures, key, tokens, target_calls=None):
    seconds = figures.seconds(benchmark)
    if seconds is None:
        return None
    speed = tokens / seconds
    benchmark.extra_info["tokens_per_s"] = speed
    if target_calls:
        benchmark.extra_info["tokens_per_target_call"] = tokens / target_calls
    figures.put(key, speed)
    return speed


def _ratio(benchmark, figures, label, speed, plain_key, per_call):
    plain = figures.get(plain_key)
    if speed is None or plain is None:
        return
    figures.ratio(benchmark, label, speed / plain, "> 1", speed > plain,
                  f"{speed:.0f} vs {plain:.0f} tokens/s; {per_call:.2f} tokens per target call")


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_t_reference_plain(benchmark, figures, pair, temperature):
    rows, new = workload(benchmark, pair, 1)
    benchmark.group = f"(t) trained pair, reference, B=1, T={temperature:g}"

    def run():
        if temperature == 0:
            return [reference.greedy_generate(pair.target, p, new) for p in rows]
        g = torch.Generator().manual_seed(0)
        return [reference.sample_generate(pair.target, p, new, temperature, generator=g)
                for p in rows]

    outputs = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    figures.put(f"t/reference/plain/{temperature}/outputs", outputs)
    _record(benchmark, figures, f"t/reference/plain/{temperature}", sum(map(len, outputs)))


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("draft_name", DRAFTS)
def test_t_reference_speculative(benchmark, figures, pair, draft_name, temperature):
    rows, new = workload(benchmark, pair, 1)
    draft = pair.drafts()[draft_name]
    benchmark.group = f"(t) trained pair, reference, B=1, T={temperature:g}"

    def run():
        g = torch.Generator().manual_seed(0)
        return [reference.speculative_generate(pair.target, draft, p, new, k=K,
                                               temperature=temperature, generator=g)
                for p in rows]

    results = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    outputs = [tokens for tokens, _ in results]
    if temperature == 0:
        expected = figures.get(f"t/reference/plain/{temperature}/outputs")
        if expected is not None:
            assert outputs == expected
    tokens, calls = sum(map(len, outputs)), sum(s["rounds"] for _, s in results)
    speed = _record(benchmark, figures, f"t/reference/{draft_name}/{temperature}", tokens, calls)
    _ratio(benchmark, figures, f"(t) reference, {draft_name} draft / plain, tokens/s, B=1, "
           f"T={temperature:g}", speed, f"t/reference/plain/{temperature}", tokens / calls)


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("batch", BATCHES)
def test_t_fast_plain(benchmark, figures, pair, batch, temperature):
    rows, new = workload(benchmark, pair, batch)
    benchmark.group = f"(t) trained pair, fast, B={batch}, T={temperature:g}"

    def run():
        g = torch.Generator().manual_seed(0)
        return [row for chunk in batches(rows, batch)
                for row in plain_generate(pair.target, chunk, new, temperature, g)]

    outputs = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    if temperature == 0:
        figures.put(f"t/fast/plain/{batch}/outputs", outputs)
    _record(benchmark, figures, f"t/fast/plain/{batch}/{temperature}", sum(map(len, outputs)))


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("draft_name", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_t_fast_speculative(benchmark, figures, pair, batch, draft_name, temperature):
    rows, new = workload(benchmark, pair, batch)
    draft = pair.drafts()[draft_name]
    benchmark.group = f"(t) trained pair, fast, B={batch}, T={temperature:g}"

    def run():
        g = torch.Generator().manual_seed(0)
        return [fast.batched_generate(pair.target, draft, chunk, new, k=K,
                                      temperature=temperature, generator=g)
                for chunk in batches(rows, batch)]

    results = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    outputs = [row for chunk, _ in results for row in chunk]
    if temperature == 0:
        expected = figures.get(f"t/fast/plain/{batch}/outputs")
        if expected is not None:
            assert outputs == expected
    tokens = sum(map(len, outputs))
    per_call = tokens / sum(stats["row_rounds"] for _, stats in results)
    speed = _record(benchmark, figures, f"t/fast/{draft_name}/{batch}/{temperature}", tokens)
    benchmark.extra_info["tokens_per_target_call"] = per_call
    _ratio(benchmark, figures, f"(t) fast, {draft_name} draft / plain, tokens/s, B={batch}, "
           f"T={temperature:g}", speed, f"t/fast/plain/{batch}/{temperature}", per_call)
