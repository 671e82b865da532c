"""CUDA graphs: replay == eager, one host sync per round. On a CPU the flag changes nothing."""

import pytest
import torch

import fast
from fast.engine import FastEngine
from fast.testing import one_thread, target_greedy
from fast.tree import generate_tree
from reference.model import EarlyExit, random_model


def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: graph capture and replay exist only on a CUDA device")


def test_on_a_cpu_the_flag_runs_eagerly_with_the_same_result():
    with one_thread():
        target = random_model("tiny", seed=61, dtype=torch.float64)
        draft = EarlyExit(target, 2)
        prompts = [[1, 2, 3], [4], [5, 6]]
        graphs, stats = fast.batched_generate(target, draft, prompts, 9, cuda_graphs=True)
        eager, _ = fast.batched_generate(target, draft, prompts, 9, cuda_graphs=False)
    assert graphs == eager == [target_greedy(target, p, 9) for p in prompts]
    assert stats["cuda_graphs"] is False


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_graph_replay_equals_eager(dtype):
    needs_cuda()
    target = random_model("tiny", seed=62, dtype=dtype, device="cuda")
    draft = EarlyExit(target, 2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 5, 9, 2, 14, 3)]
    budgets = [30, 7, 19, 0, 25, 12]
    replayed = FastEngine(target, draft, max_batch=6, max_cache_len=64, cuda_graphs=True)
    eager = FastEngine(target, draft, max_batch=6, max_cache_len=64, cuda_graphs=False)
    assert replayed.steps.use_graphs and not eager.steps.use_graphs
    for k in (1, 4):
        out_graph, stats = replayed.generate(prompts, budgets, k=k)
        out_eager, _ = eager.generate(prompts, budgets, k=k)
        assert out_graph == out_eager
        assert stats["host_syncs"] == stats["rounds"]
    assert replayed.steps.captures > 0 and replayed.steps.replays > replayed.steps.captures
    # sampling: the same seed gives the same draws in both modes
    seeded = dict(temperature=0.9, top_k=30, generator=torch.Generator(device="cuda").manual_seed(1))
    out_graph, _ = replayed.generate(prompts, budgets, k=3, **seeded)
    seeded["generator"] = torch.Generator(device="cuda").manual_seed(1)
    out_eager, _ = eager.generate(prompts, budgets, k=3, **seeded)
    if dtype == torch.float64:
        assert out_graph == out_eager
    # tree: replay == eager == target greedy
    tree_graph, _ = generate_tree(replayed, prompts[:1], 20, (2, 2, 2))
    tree_eager, _ = generate_tree(eager, prompts[:1], 20, (2, 2, 2))
    assert tree_graph == tree_eager


@pytest.mark.gpu
def test_steady_rounds_do_not_synchronize():
    """After capture, a round's only device-to-host read is the engine's one flag read."""
    needs_cuda()
    target = random_model("tiny", seed=63, device="cuda")
    engine = FastEngine(target, EarlyExit(target, 2), max_batch=4, max_cache_len=96, cuda_graphs=True)
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8]]
    engine.generate(prompts, 40, k=4)              # captures every step shape used below
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            _, stats = engine.generate(prompts, 40, k=4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in record if "synchroniz" in str(w.message)]
    # Per round one read. Outside the loop, a dozen at most: the blocking uploads of the
    # prompts and per-row budgets at the start, the outputs and counters read back at the end.
    assert len(syncs) <= stats["rounds"] + 12


def emulated(engine: FastEngine) -> FastEngine:
    """Switch an engine to graph mode's contract on the CPU (fast.graphs.StepRunner emulate)."""
    engine.steps.use_graphs = engine.steps.emulate = True
    return engine


def test_graph_contract_emulated_on_a_cpu():
    """Static buffers, steps captured once and replayed, whole-cache attention spans, batch
    buckets: the graph path's logic, checked without CUDA against eager and target greedy."""
    with one_thread():
        target = random_model("tiny", seed=64, dtype=torch.float64)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 6, 3, 9, 2)]
        # Row 3 never runs; row 0 (a one-token prompt) finishes in round 1 and then rides along
        # as a dead row of the 4-row bucket with an empty cache, through catch-up steps.
        budgets = [1, 20, 9, 0, 12]
        expected = [target_greedy(target, p, n) for p, n in zip(prompts, budgets)]
        for draft in (target, EarlyExit(target, 2)):
            replayed = emulated(FastEngine(target, draft, max_batch=5, max_cache_len=48))
            eager = FastEngine(target, draft, max_batch=5, max_cache_len=48, cuda_graphs=False)
            for k in (2, 4):
                out, stats = replayed.generate(prompts, budgets, k=k)
                assert out == expected and stats["host_syncs"] == stats["rounds"]
            # sampling: per-row random streams make the two modes draw the same tokens
            runs = [engine.generate(prompts, budgets, k=3, temperature=1.0, top_p=0.9,
                                    generator=torch.Generator().manual_seed(2))[0]
                    for engine in (replayed, eager)]
            assert runs[0] == runs[1]
            for tree in ((2, 2, 2), (3, 1)):
                out, _ = generate_tree(replayed, prompts[:3], budgets[:3], tree)
                assert out == expected[:3]
            assert replayed.steps.replays > replayed.steps.captures > 0
