"""(c) A verify step of k+1 tokens vs a decode step of 1 token, batch 1, k = 1..8.

Verification is almost free at batch 1 when a step is bound by reading the weights (and, on a
CPU with a tiny model, by per-kernel overhead): feeding k+1 tokens instead of one should cost
little more. Each step is the fast engine's target forward over a 128-token context in its
static cache. Targets: CPU `tiny` <= 1.5 at k = 4; on an H200, Qwen3-1.7B's shape in bf16
<= 1.1 (graphs on; skipped without CUDA). (c') beside them: an EAGLE-3 head step and a dynamic
tree's verify, each against a decode step (issue 41; the tree's verify <= 1.2 on the GPU).
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
    runner = ModelRunner(weights, 1, CONTEXT + 32, StepRunner(graphs, weights.device))
    device = weights.device
    prefix = torch.randint(0, weights.shape.vocab_size, (1, CONTEXT),
                           generator=torch.Generator().manual_seed(0)).to(device)
    runner.prefill(prefix, torch.tensor([CONTEXT], device=device))
    runner.model = model        # what a head for this target is made from (head_step_fn)
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


# (c') What a head's drafting and a dynamic tree's verify cost beside a decode step (issue 41,
# deliverable 4: the bounds of head drafting and of trees on the GPU targets). A round of head
# drafting costs a verify of k + 1 and k head steps; a tree round a verify of its 1 + budget nodes
# and a head step per level. The head is EAGLE-3's shape for the target with a draft vocabulary
# of DRAFT_VOCAB tokens (EAGLE-3's d2t: an lm_head over Qwen3's whole 151,936 would read more
# than the head's layer), random weights: only costs are measured here, not acceptance.
DRAFT_VOCAB = 32_000
TREE_NODES = 17     # DynamicTree(8, 2, 16)'s root and budget, fast/test_bench_dynamic.py's tree


def head_step_fn(runner, seed: int = 0):
    """One EAGLE-3 head step of one row after the runner's context (fast/head.py's _step)."""
    from fast.head import HeadDrafter
    from reference.heads.random import random_head
    weights, device = runner.weights, runner.device
    vocab = weights.shape.vocab_size
    head = random_head("eagle3", runner.model, seed=seed, dtype=weights.dtype,
                       draft_vocab=list(range(DRAFT_VOCAB)) if DRAFT_VOCAB < vocab else None)
    drafter = HeadDrafter(head)
    drafter.attach(weights, 1, CONTEXT + 32)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    h = torch.zeros(1, 1, weights.shape.hidden_size, dtype=weights.dtype, device=device)
    start = torch.full((1,), CONTEXT, device=device)

    def step():
        out = drafter._step(ids, h, start, CONTEXT + 1, None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return step


def tree_verify_fn(runner, nodes: int):
    """One target call over a tree of `nodes` (each node sees the root and itself: the mask's
    shape does not change a step's arithmetic) after the context, fast/dynamic.py's rows_tree."""
    from fast.dynamic import rows_tree
    device = runner.device
    ids = torch.arange(nodes, device=device)[None] % 100 + 3                  # [1, n]
    lengths = torch.full((1,), CONTEXT, device=device)
    visible = torch.eye(nodes, dtype=torch.bool, device=device)
    visible[:, 0] = True
    slots = lengths[:, None] + torch.arange(nodes, device=device)

    def step():
        out = rows_tree(runner, ids, slots, slots, lengths, visible[None], CONTEXT + nodes,
                        f"tree{nodes}")
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return step


def time_fn(benchmark, fn):
    if benchmark.disabled:
        return benchmark(fn)
    return benchmark.pedantic(fn, rounds=60, iterations=10, warmup_rounds=5)


@torch.no_grad()
def test_c_head_step(benchmark, figures, cpu_runner):
    """The CPU `tiny` counterpart of the GPU figure below (it keeps the code path tested)."""
    benchmark.group = "(c) tiny CPU: target step, batch 1"
    time_fn(benchmark, head_step_fn(cpu_runner))
    seconds, decode = figures.seconds(benchmark), figures.get("c/decode")
    if seconds is not None and decode is not None:
        figures.ratio(benchmark, "(c') tiny CPU: EAGLE-3 head step of 1 row / decode 1, time",
                      seconds / decode)


@torch.no_grad()
def test_c_tree_verify(benchmark, figures, cpu_runner):
    benchmark.group = "(c) tiny CPU: target step, batch 1"
    time_fn(benchmark, tree_verify_fn(cpu_runner, TREE_NODES))
    seconds, decode = figures.seconds(benchmark), figures.get("c/decode")
    if seconds is not None and decode is not None:
        figures.ratio(benchmark, f"(c') tiny CPU: verify of a {TREE_NODES}-node tree / decode 1, "
                      f"time", seconds / decode)


@pytest.mark.gpu
@torch.no_grad()
def test_c_gpu_head_step(benchmark, figures, gpu_runner):
    benchmark.group = "(c) Qwen3-1.7B bf16 GPU: target step, batch 1"
    time_fn(benchmark, head_step_fn(gpu_runner))
    seconds, decode = figures.seconds(benchmark), figures.get("c/gpu/decode")
    if seconds is not None and decode is not None:
        figures.ratio(benchmark, f"(c') Qwen3-1.7B bf16 GPU: EAGLE-3 head step of 1 row (draft "
                      f"vocabulary {DRAFT_VOCAB}) / decode 1, time", seconds / decode)


@pytest.mark.gpu
@torch.no_grad()
def test_c_gpu_tree_verify(benchmark, figures, gpu_runner):
    benchmark.group = "(c) Qwen3-1.7B bf16 GPU: target step, batch 1"
    time_fn(benchmark, tree_verify_fn(gpu_runner, TREE_NODES))
    seconds, decode = figures.seconds(benchmark), figures.get("c/gpu/decode")
    if seconds is not None and decode is not None:
        ratio = seconds / decode
        figures.ratio(benchmark, f"(c') Qwen3-1.7B bf16 GPU: verify of a {TREE_NODES}-node tree "
                      f"/ decode 1, time", ratio, "<= 1.2", ratio <= 1.2)
