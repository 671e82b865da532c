"""Tree verification in the fast engine: greedy tree == chain == target greedy for several
shapes; exact sampling (the vectorized recursive rejection, statistically), stops and budgets."""

import pytest
import torch
from scipy import stats

import fast
from fast.engine import FastEngine
from fast.testing import target_greedy
from fast.sampling import draw
from fast.tree import TreeShape, generate_tree, sampled_path
from reference.model import EarlyExit, random_model


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=41, dtype=torch.float64)


def test_chapter_tree_shape():
    shape = TreeShape((2, 2, 2), "cpu")
    assert shape.size == 15                      # root + 2 + 4 + 8 = the chapter's 14 nodes
    assert shape.levels == [(1, 3), (3, 7), (7, 15)]
    assert shape.parent[7:15].tolist() == [3, 3, 4, 4, 5, 5, 6, 6]
    assert shape.path[14].tolist() == [0, 2, 6, 14]
    assert shape.ancestors[14].nonzero()[:, 0].tolist() == [0, 2, 6, 14]


@pytest.mark.parametrize("tree", [(2, 2, 2), (3,), (1, 1, 1, 1), (4, 2), (2, 3, 1, 2)])
def test_tree_equals_chain_equals_target_greedy(target, tree):
    prompt = [11, 200, 5, 77, 3]
    expected = target_greedy(target, prompt, 30)
    draft = EarlyExit(target, 2)
    out_tree, stats = fast.tree_generate(target, draft, prompt, 30, tree=tree)
    out_chain, _ = fast.speculative_generate(target, draft, prompt, 30, k=len(tree))
    assert out_tree == out_chain == expected
    assert stats["rounds"] * (len(tree) + 1) >= 30 and stats["host_syncs"] == stats["rounds"]


def test_perfect_draft_takes_a_full_path_every_round(target):
    out, stats = fast.tree_generate(target, target, [1, 2, 3], 20, tree=(2, 2, 2))
    assert out == target_greedy(target, [1, 2, 3], 20)
    assert stats["rounds"] == 5 and stats["acceptance_rate"] == 1.0


def test_tree_stops_mid_path_and_respects_the_budget(target):
    prompt = [9, 8, 7]
    expected = target_greedy(target, prompt, 25)
    stop = expected[4]
    out, _ = fast.tree_generate(target, EarlyExit(target, 3), prompt, 25, stop_ids=[stop])
    assert out == expected[:expected.index(stop) + 1]
    out, _ = fast.tree_generate(target, EarlyExit(target, 3), prompt, 7)
    assert out == expected[:7]


def test_batched_tree_rows_equal_solo_greedy(target):
    prompts = [[4], [5, 6, 7, 8, 9, 10], [100, 3]]
    engine = FastEngine(target, EarlyExit(target, 2), max_batch=3, max_cache_len=64)
    outputs, _ = generate_tree(engine, prompts, [12, 20, 5], (2, 2))
    assert outputs == [target_greedy(target, p, n) for p, n in zip(prompts, [12, 20, 5])]


# --- exact sampling over the tree --------------------------------------------------------

def _chi_square_ok(tokens, p, alpha=1e-6):
    """Counts of tokens [n] against the law p [V] (cells with p > 0), Pearson chi-square."""
    counts = torch.bincount(tokens, minlength=p.numel()).double()
    assert counts[p == 0].sum() == 0, "a token with probability 0 was committed"
    keep = p > 0
    return stats.chisquare(counts[keep].numpy(), (counts.sum() * p[keep]).numpy()).pvalue > alpha


def _uniforms(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_sampled_path_commits_p_at_one_node():
    """Three i.i.d. siblings, recursive rejection: the first committed token ~ p (n = 20000 rows
    at alpha 1e-6 detects total variation 0.05 with power > 0.999)."""
    B, shape = 20000, TreeShape((3,), "cpu")
    p0 = torch.tensor([0.35, 0.015, 0.207, 0.428], dtype=torch.float64)
    q0 = torch.tensor([0.222, 0.753, 0.003, 0.022], dtype=torch.float64)
    kids = draw(q0.expand(B * 3, 4), _uniforms(B * 3, 1)).view(B, 3)
    ids = torch.cat([torch.zeros(B, 1, dtype=torch.long), kids], 1)             # [B, 4]
    best, correction = sampled_path(shape, ids, p0.expand(B, 4, 4), q0.expand(B, 1, 4),
                                    _uniforms((B, 1, 3), 2), _uniforms(B, 3))
    first = torch.where(best > 0, ids.gather(1, best[:, None])[:, 0], correction)
    assert _chi_square_ok(first, p0)


def test_sampled_path_follows_the_target_down_the_tree():
    """A (2, 2) tree whose p and q at a node depend on the node's token: the first token ~ p0,
    and after an accepted first token x the next committed token ~ P[x] (from the accepted
    grandchild or the node's residual draw), and the same after a leaf (the bonus)."""
    B, V, shape = 30000, 3, TreeShape((2, 2), "cpu")
    g = torch.Generator().manual_seed(5)
    P = torch.softmax(torch.randn(V, V, generator=g, dtype=torch.float64) * 1.5, -1)  # [V, V]
    Q = torch.softmax(torch.randn(V, V, generator=g, dtype=torch.float64) * 1.5, -1)
    p0, q0 = P[0], Q[0]
    level1 = draw(q0.expand(B * 2, V), _uniforms(B * 2, 6)).view(B, 2)             # nodes 1, 2
    level2 = draw(Q[level1].repeat_interleave(2, 1).reshape(-1, V), _uniforms(B * 4, 7)).view(B, 4)
    ids = torch.cat([torch.zeros(B, 1, dtype=torch.long), level1, level2], 1)      # [B, 7]
    p = torch.where((torch.arange(7) == 0)[None, :, None], p0, P[ids])             # [B, 7, V]
    q = torch.where((torch.arange(3) == 0)[None, :, None], q0, Q[ids[:, :3]])      # [B, 3, V]
    best, correction = sampled_path(shape, ids, p, q, _uniforms((B, 2, 2), 8), _uniforms(B, 9))
    block = torch.cat([ids.gather(1, shape.path[best][:, 1:]), correction[:, None]], 1)
    depth = shape.depth[best]
    committed = torch.where(torch.arange(3)[None] < depth[:, None], block, correction[:, None])
    assert _chi_square_ok(committed[:, 0], p0)
    for x in range(V):
        after = committed[(depth >= 1) & (committed[:, 0] == x), 1]
        assert len(after) > 500 and _chi_square_ok(after, P[x])
    leaf = depth == 2
    for x in range(V):
        bonus = committed[leaf & (committed[:, 1] == x), 2]
        if len(bonus) > 500:
            assert _chi_square_ok(bonus, P[x])


def test_perfect_draft_accepts_every_path_under_sampling(target):
    g = torch.Generator().manual_seed(0)
    out, stats_ = fast.tree_generate(target, target, [1, 2, 3], 20, tree=(2, 2, 2),
                                     temperature=0.9, generator=g)
    assert len(out) == 20 and stats_["acceptance_rate"] == 1.0 and stats_["rounds"] == 5


def test_sampled_batched_tree_rows_stop_and_keep_budgets(target):
    prompts = [[4], [5, 6, 7, 8, 9, 10], [100, 3]]
    engine = FastEngine(target, EarlyExit(target, 2), max_batch=3, max_cache_len=64)
    g = torch.Generator().manual_seed(3)
    outputs, _ = engine.generate_tree(prompts, [12, 20, 5], (2, 2), temperature=1.1,
                                      generator=g, top_k=40, top_p=0.95)
    assert [len(o) for o in outputs] == [12, 20, 5]
    stop = outputs[1][3]
    again, _ = engine.generate_tree(prompts, [12, 20, 5], (2, 2), (stop,), temperature=1.1,
                                    generator=torch.Generator().manual_seed(3), top_k=40, top_p=0.95)
    for row in again:
        assert len(row) <= 20 and (stop not in row or row.index(stop) == len(row) - 1)


def _sampled_tree_runs(engines, prompts, budgets, device="cpu"):
    return [engine.generate_tree(prompts, budgets, (2, 2), temperature=1.0, top_p=0.9,
                                 generator=torch.Generator(device=device).manual_seed(2))[0]
            for engine in engines]


def test_sampled_tree_graph_contract_emulated_on_a_cpu(target):
    """Graph mode's contract (static buffers, captured steps replayed, whole-cache spans,
    batch buckets with dead rows) emulated on the CPU: per-row random streams make the sampled
    tree draw the same tokens as eager, and one host sync per round."""
    prompts, budgets = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]], [14, 1, 9, 0]
    replayed = FastEngine(target, EarlyExit(target, 2), max_batch=4, max_cache_len=48)
    replayed.steps.use_graphs = replayed.steps.emulate = True
    eager = FastEngine(target, EarlyExit(target, 2), max_batch=4, max_cache_len=48,
                       cuda_graphs=False)
    runs = _sampled_tree_runs((replayed, eager), prompts, budgets)
    assert runs[0] == runs[1] and [len(r) for r in runs[0]] == budgets
    assert replayed.steps.replays > replayed.steps.captures > 0


@pytest.mark.gpu
def test_sampled_tree_graph_replay_equals_eager_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: graph capture and replay exist only on a CUDA device")
    target = random_model("tiny", seed=41, dtype=torch.float64, device="cuda")
    prompts, budgets = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]], [14, 1, 9, 0]
    replayed = FastEngine(target, EarlyExit(target, 2), max_batch=4, max_cache_len=64,
                          cuda_graphs=True)
    eager = FastEngine(target, EarlyExit(target, 2), max_batch=4, max_cache_len=64,
                       cuda_graphs=False)
    for _ in range(2):  # the second call replays what the first captured
        runs = _sampled_tree_runs((replayed, eager), prompts, budgets, "cuda")
        assert runs[0] == runs[1] and [len(r) for r in runs[0]] == budgets
    assert replayed.steps.replays > replayed.steps.captures > 0
    out, stats = fast.tree_generate(target, target, [1, 2, 3], 20, tree=(2, 2, 2),
                                    temperature=0.9, generator=torch.Generator("cuda").manual_seed(0),
                                    cuda_graphs=True)
    assert len(out) == 20 and stats["acceptance_rate"] == 1.0 and stats["host_syncs"] == stats["rounds"]
