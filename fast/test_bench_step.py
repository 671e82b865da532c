"""(c) A verify step of k+1 tokens vs a decode step of 1 token, batch 1, k = 1..8.

Verification is almost free at batch 1 when a step is bound by reading the weights (and, on a
CPU with a tiny model, by per-kernel overhead): feeding k+1 tokens instead of one should cost
little more. Each step is the fast engine's target forward over a 128-token context in its
static cache. Targets: CPU `tiny` <= 1.5 at k = 4; on an H200, Qwen3-1.7B's shape in bf16
<= 1.1 (graphs on; skipped without CUDA).
"""

import pytest
import torch

from fast.graphs import StepRunner
from fast.runner import ModelRunner
from fast.weights import model_weights
from reference.model import random_model

CONTEXT = 128
KS = list(range(1, 9))


def make_runner(model, graphs: bool):
    weights = model_weights(model)
    runner = ModelRunner(weights, 1, CONTEXT + 16, StepRunner(graphs, weights.device))
    device = weights.device
    prefix = torch.randint(0, weights.shape.vocab_size, (1, CONTEXT),
                           generator=torch.Generator().manual_seed(0)).to(device)
    runner.prefill(prefix, torch.tensor([CONTEXT], device=device))
    return runner


def step_fn(runner, tokens: int):
    """One target step feeding `tokens` tokens after the context (idempotent: same slots)."""
    device = runner.device
    ids = torch.randint(0, runner.weights.shape.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(tokens)).to(device)
    start = torch.full((1,), CONTEXT, device=device)

    def step():
        logits = runner.chain(ids, start, CONTEXT + tokens)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return logits

    return step


@pytest.fixture(scope="module")
def cpu_runner():
    return make_runner(random_model("tiny", seed=0, dtype=torch.float32), graphs=False)


def time_step(benchmark, runner, tokens):
    if benchmark.disabled:
        return benchmark(step_fn(runner, tokens))
    return benchmark.pedantic(step_fn(runner, tokens), rounds=60, iterations=10, warmup_rounds=5)


@torch.no_grad()
def test_c_decode_step(benchmark, figures, cpu_runner):
    benchmark.group = "(c) tiny CPU: target step, batch 1"
    time_step(benchmark, cpu_runner, 1)
    figures.put("c/decode", figures.seconds(benchmark))


@pytest.mark.parametrize("k", KS)
@torch.no_grad()
def test_c_verify_step(benchmark, figures, cpu_runner, k):
    benchmark.group = "(c) tiny CPU: target step, batch 1"
    time_step(benchmark, cpu_runner, k + 1)
    seconds, decode = figures.seconds(benchmark), figures.get("c/decode")
    if seconds is not None and decode is not None:
        ratio = seconds / decode
        figures.ratio(benchmark, f"(c) tiny CPU: verify k+1={k + 1} / decode 1, time", ratio,
                      "<= 1.5" if k == 4 else None, ratio <= 1.5 if k == 4 else None)


@pytest.fixture(scope="module")
def gpu_runner():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: the Qwen3-1.7B-shape bf16 step is timed on a GPU (H200 target)")
    model = random_model("qwen3-1.7b", seed=0, dtype=torch.bfloat16, device="cuda")
    return make_runner(model, graphs=True)


@torch.no_grad()
@pytest.mark.gpu
def test_c_gpu_decode_step(benchmark, figures, gpu_runner):
    benchmark.group = "(c) Qwen3-1.7B bf16 GPU: target step, batch 1"
    time_step(benchmark, gpu_runner, 1)
    figures.put("c/gpu/decode", figures.seconds(benchmark))


@pytest.mark.parametrize("k", KS)
@pytest.mark.gpu
@torch.no_grad()
def test_c_gpu_verify_step(benchmark, figures, gpu_runner, k):
    benchmark.group = "(c) Qwen3-1.7B bf16 GPU: target step, batch 1"
    time_step(benchmark, gpu_runner, k + 1)
    seconds, decode = figures.seconds(benchmark), figures.get("c/gpu/decode")
    if seconds is not None and decode is not None:
        ratio = seconds / decode
        figures.ratio(benchmark, f"(c) Qwen3-1.7B bf16 GPU: verify {k + 1} / decode 1, time",
                      ratio, "<= 1.1" if k == 4 else None, ratio <= 1.1 if k == 4 else None)
