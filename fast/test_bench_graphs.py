"""(f) CUDA graph replay vs eager, per step and per round, `tiny` on a GPU.

A `tiny` step is a few hundred small kernels, so eagerly it is bound by launch overhead; one
graph replay launches them all at once. Timed: the draft step ([1, 1], 2 layers) and the
target's verify step ([1, 5], 6 layers), each with graphs on and off, and a whole greedy
generation (B = 1, k = 4) in both modes, whose rounds must do one host sync each.
Target: >= 3x. Skipped without CUDA.
"""

import pytest
import torch

import fast
from fast.graphs import StepRunner
from fast.runner import ModelRunner
from fast.weights import model_weights
from reference.model import EarlyExit, random_model

CONTEXT = 64


@pytest.fixture(scope="module")
def models():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: graph replay vs eager is a GPU measurement")
    target = random_model("tiny", seed=0, dtype=torch.float32, device="cuda")
    return target, EarlyExit(target, 2)


def step(model, graphs: bool, tokens: int):
    weights = model_weights(model)
    runner = ModelRunner(weights, 1, CONTEXT + 16, StepRunner(graphs, "cuda"))
    prefix = torch.randint(0, 256, (1, CONTEXT), device="cuda")
    runner.prefill(prefix, torch.tensor([CONTEXT], device="cuda"))
    ids = torch.randint(0, 256, (1, tokens), device="cuda")
    start = torch.full((1,), CONTEXT, device="cuda")

    def run():
        runner.chain(ids, start, CONTEXT + tokens)
        torch.cuda.synchronize()

    run()  # capture outside the timing
    return run


CASES = [("draft step [1, 1]", "draft", 1), ("verify step [1, 5]", "target", 5)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,which,tokens", CASES)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
@torch.no_grad()
def test_f_step(benchmark, figures, models, name, which, tokens, graphs):
    model = models[0] if which == "target" else models[1]
    benchmark.group = f"(f) {name}, tiny, GPU"
    benchmark.pedantic(step(model, graphs, tokens), rounds=100, iterations=10, warmup_rounds=10)
    seconds = figures.seconds(benchmark)
    figures.put(f"f/{name}/{graphs}", seconds)
    eager = figures.get(f"f/{name}/False")
    if graphs and seconds is not None and eager is not None:
        ratio = eager / seconds
        figures.ratio(benchmark, f"(f) eager / graph, {name}, time", ratio, ">= 3", ratio >= 3)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
def test_f_generation(benchmark, figures, models, graphs):
    target, draft = models
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8]]
    benchmark.group = "(f) greedy generation B=1 k=4, tiny, GPU"
    fast.batched_generate(target, draft, prompts, 64, cuda_graphs=graphs)   # capture, warm up
    outputs, stats = benchmark.pedantic(
        fast.batched_generate, args=(target, draft, prompts, 64), kwargs={"cuda_graphs": graphs},
        rounds=10, warmup_rounds=1)
    assert stats["host_syncs"] == stats["rounds"]
    benchmark.extra_info.update({"rounds": stats["rounds"], "host_syncs": stats["host_syncs"]})
    seconds = figures.seconds(benchmark)
    figures.put(f"f/generation/{graphs}", seconds)
    eager = figures.get("f/generation/False")
    if graphs and seconds is not None and eager is not None:
        figures.ratio(benchmark, "(f) eager / graph, whole generation, time", eager / seconds)
