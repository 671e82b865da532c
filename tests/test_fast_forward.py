"""The fast forward over the static batched cache gives the reference model's logits, fused or
eager."""

import pytest
import torch

from fast import fused
from fast.forward import forward, window_mask
from fast.testing import chain, fast_cache
from fast.tree import TreeShape
from fast.weights import model_weights
from reference.model import EarlyExit, random_model


@pytest.fixture(autouse=True, params=["fused", "eager"])
def step_path(request):
    """Every test here runs on both paths of a step: one fused native call (fast/fused.cpp,
    where the CPU kernels build) and the eager loop of torch operations."""
    if request.param == "fused":
        from fast import native
        reason = native.unsupported()
        if reason is not None:
            pytest.skip(f"the fused step cannot run here: {reason}")
    with fused.enabled(request.param == "fused"):
        yield request.param


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=11, dtype=torch.float64)


def reference_logits(model, prefix, block):
    """The reference model's logits for `block` fed after `prefix`, in its own cache."""
    cache = model.new_cache(1, len(prefix) + len(block))
    if prefix:
        model(torch.tensor([prefix]), cache)
    return model(torch.tensor([block]), cache)[0]


@pytest.mark.parametrize("draft_layers", [None, 2])
def test_ragged_rows_match_the_reference_in_float64(model, draft_layers):
    net = model if draft_layers is None else EarlyExit(model, draft_layers)
    weights = model_weights(net)
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 6, 11)]
    blocks = torch.randint(0, 256, (3, 4), generator=g)
    cache = fast_cache(weights, 3)
    longest = max(map(len, prefixes))
    padded = torch.zeros(3, longest, dtype=torch.long)
    for i, p in enumerate(prefixes):
        padded[i, :len(p)] = torch.tensor(p)
    chain(weights, cache, padded, torch.zeros(3, dtype=torch.long), longest, None)   # prefill
    start = torch.tensor([len(p) for p in prefixes])                                 # ragged rollback
    logits = chain(weights, cache, blocks, start, 40)                                # [3, 4, V]
    for i, prefix in enumerate(prefixes):
        expected = reference_logits(net, prefix, blocks[i].tolist())
        assert (logits[i] - expected).abs().max() < 1e-9


def test_tree_mask_gives_each_node_its_branchs_logits(model):
    """A node verified inside a tree gets the logits of its own path fed as a chain."""
    weights = model_weights(model)
    shape = TreeShape((2, 2), "cpu")
    prefix = [5, 17, 99, 3]
    g = torch.Generator().manual_seed(1)
    nodes = torch.randint(0, 256, (1, shape.size), generator=g)
    cache = fast_cache(weights, 1)
    chain(weights, cache, torch.tensor([prefix[:-1]]), torch.zeros(1, dtype=torch.long), 3, None)
    nodes[0, 0] = prefix[-1]                                   # the root is `last`
    base = torch.tensor([len(prefix) - 1])
    slots = base[:, None] + torch.arange(shape.size)
    positions = base[:, None] + shape.depth
    mask = window_mask(base, shape.ancestors, 40)
    logits = forward(weights, cache, nodes, slots, positions, mask, 40)[0]
    for node in range(shape.size):
        path = [int(nodes[0, j]) for j in range(shape.size) if shape.ancestors[node, j]]
        expected = reference_logits(model, prefix[:-1], path)[-1]
        assert (logits[node] - expected).abs().max() < 1e-9


def test_logits_at_last_and_index(model):
    weights = model_weights(model)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    zero = torch.zeros(2, dtype=torch.long)
    full = chain(weights, fast_cache(weights, 2), ids, zero, 3)
    last = chain(weights, fast_cache(weights, 2), ids, zero, 3, "last")
    picked = chain(weights, fast_cache(weights, 2), ids, zero, 3, torch.tensor([[0], [2]]))
    assert torch.allclose(last, full[:, -1], atol=1e-12)
    assert torch.allclose(picked[:, 0], torch.stack([full[0, 0], full[1, 2]]), atol=1e-12)
