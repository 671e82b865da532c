"""Dynamic trees grown by the fast engine's EAGLE-3 head and MTP layer (fast/head.py's tree_root,
tree_level, tree_keep, fast/mtp.py's slots and step; fast/dynamic.py): every round's tree is the
reference's (reference/heads/tree.py)
node for node, greedy output is the target's in ragged batches with the fused step and without,
and drafters that do not grow trees are refused by name. The sampled law: the kit's tree family
with --impl=fast-head (its dynamic examples are drawn by the head)."""

import pytest
import torch

import fast
import fast.dynamic
import reference.dynamic_tree
import reference.speculative as speculative
from fast import fused
from fast.head import HeadDrafter
from fast.mtp import MTPDrafter
from fast.testing import target_greedy
from reference.dynamic_tree import DynamicTree
from reference.heads.mtp import MTPLayer
from reference.heads.random import random_head
from reference.hidden import HiddenStates
from reference.model import random_model

PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 40, 7, 40, 40, 7], [63, 0, 31, 32, 8, 8, 8, 20, 11], [9, 3],
           [17]]
HEADS = {
    "eagle3": {},
    "eagle3-ends": dict(hidden=HiddenStates((0, 6), "input")),
    "eagle3-normed": dict(hidden=HiddenStates((1, 3), "output", normed=True)),
    "eagle3-d2t": dict(draft_vocab=list(range(255, 0, -3)) + [2, 4]),
    # MTP layers (fast/mtp.py): vLLM's layout, and llama.cpp's with its lead pair
    "mtp": dict(kind="mtp"),
    "mtp-llamacpp": dict(kind="mtp", hidden=HiddenStates((5,), normed=True), recycle="normed",
                         lead=True),
}
SPECS = [DynamicTree(4, 2, 8), DynamicTree(3, 3, 9), DynamicTree(4, 1, 4)]


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=21, dtype=torch.float64)


@pytest.fixture(scope="module")
def heads(target):
    out = {}
    for i, (name, options) in enumerate(HEADS.items()):
        options = dict(options)
        out[name] = random_head(options.pop("kind", "eagle3"), target, seed=40 + i, **options)
    return out


def drafter(head):
    return MTPDrafter(head) if isinstance(head, MTPLayer) else HeadDrafter(head)


def _reference_trees(monkeypatch, target, head, prompt, spec):
    """The node tokens of every round's tree the reference verifies, and its output."""
    trees = []
    verify = reference.dynamic_tree.HeadTree.verify

    def spy(self, ids, positions, mask):
        trees.append(ids[0].tolist())
        return verify(self, ids, positions, mask)

    with monkeypatch.context() as patch:
        patch.setattr(reference.dynamic_tree.HeadTree, "verify", spy)
        out, _ = speculative.speculative_generate(target, head, prompt, 12, tree=spec)
    return trees, out


def _fast_trees(monkeypatch, target, head, prompts, spec):
    """The node tokens [B, N] of every round's tree the fast engine verifies, and its outputs."""
    trees = []
    rows_tree = fast.dynamic.rows_tree

    def spy(runner, ids, *args, **kwargs):
        trees.append(ids.tolist())      # a head's levels are its own steps: every call verifies
        return rows_tree(runner, ids, *args, **kwargs)

    engine = fast.FastEngine(target, drafter(head), max_batch=len(prompts), max_cache_len=64)
    with monkeypatch.context() as patch:
        patch.setattr(fast.dynamic, "rows_tree", spy)
        outputs, _ = engine.generate_tree(prompts, 12, tree=spec)
    return trees, outputs


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("spec", SPECS[:2])
def test_every_round_grows_the_references_tree(monkeypatch, target, heads, name, spec):
    """One prompt at a time (rounds line up): the same node tokens in the same order, round by
    round, on prompts of two or more tokens (a one-token prompt's first round has no verified
    feature: the reference verifies the root alone, the engine a tree certain of `last`)."""
    for prompt in PROMPTS[:4]:
        expected, out = _reference_trees(monkeypatch, target, heads[name], prompt, spec)
        got, outputs = _fast_trees(monkeypatch, target, heads[name], [prompt], spec)
        assert [rows[0] for rows in got] == expected, (name, prompt)
        assert outputs[0] == out


@pytest.mark.parametrize("native", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("spec", SPECS)
def test_greedy_is_the_targets_in_ragged_batches(target, heads, spec, native):
    expected = [target_greedy(target, p, 12) for p in PROMPTS]
    with fused.enabled(native):
        for name in ("eagle3", "eagle3-d2t", "mtp-llamacpp"):
            engine = fast.FastEngine(target, drafter(heads[name]), max_batch=len(PROMPTS),
                                     max_cache_len=64)
            outputs, stats = engine.generate_tree(PROMPTS, 12, tree=spec)
            assert outputs == expected, name
            assert stats["rounds"] <= 12


@pytest.mark.parametrize("name", ["eagle3", "mtp", "mtp-llamacpp"])
def test_one_token_prompts_alone(target, heads, name):
    """Every row's first round without a verified feature (no block fed at all that round)."""
    prompts = [[17], [3], [250]]
    engine = fast.FastEngine(target, drafter(heads[name]), max_batch=3, max_cache_len=64)
    outputs, _ = engine.generate_tree(prompts, 9, tree=SPECS[0])
    assert outputs == [target_greedy(target, p, 9) for p in prompts]


@pytest.mark.parametrize("name", ["eagle3-normed", "mtp-llamacpp"])
def test_fused_and_eager_grow_the_same_trees(monkeypatch, target, heads, name):
    with fused.enabled(True):
        native, _ = _fast_trees(monkeypatch, target, heads[name], PROMPTS, SPECS[0])
    with fused.enabled(False):
        eager, _ = _fast_trees(monkeypatch, target, heads[name], PROMPTS, SPECS[0])
    assert native == eager


def test_sampled_rows_stop_at_their_budgets(target, heads):
    """Sampling through the head's trees: every row gets its budget (no stop ids), tokens in
    the vocabulary. The law itself is the kit's (module docstring)."""
    engine = fast.FastEngine(target, drafter(heads["mtp-llamacpp"]), max_batch=len(PROMPTS),
                             max_cache_len=64)
    generator = torch.Generator().manual_seed(5)
    outputs, _ = engine.generate_tree(PROMPTS, [3, 12, 7, 12, 5], tree=SPECS[0], temperature=1.0,
                                      generator=generator)
    assert [len(o) for o in outputs] == [3, 12, 7, 12, 5]
    assert all(0 <= t < target.config.vocab_size for o in outputs for t in o)


def test_fixed_shapes_and_other_drafters_are_refused_by_name(target, heads):
    head = HeadDrafter(heads["eagle3"])
    with pytest.raises(ValueError, match="tree=\\(2, 2\\)"):
        fast.tree_generate(target, head, PROMPTS[0], 4, tree=(2, 2))
    with pytest.raises(ValueError, match="PromptLookup drafter"):
        fast.FastEngine(target, fast.PromptLookup(), max_batch=1, max_cache_len=64).generate_tree(
            [PROMPTS[0]], 4, tree=SPECS[0])


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_on_a_gpu_head_chains_and_trees_give_the_targets_greedy_output(graphs):
    """The head's steps run as torch operations on a CUDA device (the fused step is the CPU's),
    the target's verifies captured as graphs or not: chain and dynamic tree both give the
    target's greedy output (computed on the CPU, float64)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: the head's GPU path (run by make gpu-check where one is lent)")
    cpu = random_model("tiny", seed=21, dtype=torch.float64)
    target = random_model("tiny", seed=21, dtype=torch.float64, device="cuda")
    head = random_head("eagle3", target, seed=40)
    expected = [target_greedy(cpu, p, 12) for p in PROMPTS]
    engine = fast.FastEngine(target, HeadDrafter(head), max_batch=len(PROMPTS), max_cache_len=64,
                             cuda_graphs=graphs)
    chain, _ = engine.generate(PROMPTS, 12, k=4)
    tree, _ = engine.generate_tree(PROMPTS, 12, tree=SPECS[0])
    assert chain == expected and tree == expected
