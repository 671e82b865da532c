"""The fast engine's static batched cache: per-row lengths, rollback without copies, dead
entries never attended to, compaction and path moves."""

import pytest
import torch

from fast.cache import StaticCache
from fast.forward import forward, window_mask
from fast.weights import model_weights
from reference.model import random_model


def make_cache(batch=3, capacity=12, layers=2):
    return StaticCache(layers, batch, 2, 4, capacity, torch.float64, "cpu")


def test_write_lands_at_each_rows_own_slots():
    cache = make_cache()
    k = torch.arange(3 * 2 * 2 * 4, dtype=torch.float64).view(3, 2, 2, 4)   # [B, KV, T, D]
    slots = torch.tensor([[0, 1], [5, 6], [9, 10]])
    cache.write(0, 3, slots, k, -k)
    for b in range(3):
        for t in range(2):
            assert torch.equal(cache.keys[0][b, :, slots[b, t]], k[b, :, t])
            assert torch.equal(cache.values[0][b, :, slots[b, t]], -k[b, :, t])
    # nothing else was touched
    touched = torch.zeros(3, 12, dtype=torch.bool)
    touched[torch.arange(3)[:, None], slots] = True
    assert (cache.keys[0].abs().sum((1, 3))[~touched] == 0).all()


def test_rollback_sets_lengths_and_copies_nothing():
    cache = make_cache()
    cache.rollback(3, torch.tensor([4, 7, 1]))
    pointers = [t.data_ptr() for t in cache.keys + cache.values]
    snapshot = [t.clone() for t in cache.keys]
    cache.rollback(3, torch.tensor([2, 3, 0]))
    assert cache.lengths.tolist() == [2, 3, 0]
    assert [t.data_ptr() for t in cache.keys + cache.values] == pointers
    assert all(torch.equal(a, b) for a, b in zip(snapshot, cache.keys))


def test_compact_moves_live_rows_to_the_front():
    cache = make_cache(batch=4)
    for b in range(4):
        cache.keys[1][b].fill_(b)
    cache.rollback(4, torch.tensor([3, 5, 7, 9]))
    cache.compact(torch.tensor([2, 0, 1, 3]), 2)
    assert cache.keys[1][0].eq(2).all() and cache.keys[1][1].eq(0).all()
    assert cache.lengths[:2].tolist() == [7, 3]


def test_move_copies_a_path_into_place_even_when_ranges_overlap():
    cache = make_cache(batch=2)
    for s in range(12):
        cache.keys[0][:, :, s] = s
        cache.values[0][:, :, s] = -s
    cache.move(2, torch.tensor([[4, 6, 7], [3, 4, 5]]), torch.tensor([4, 2]))
    assert cache.keys[0][0, 0, 4:7, 0].tolist() == [4, 6, 7]
    assert cache.keys[0][1, 0, 2:5, 0].tolist() == [3, 4, 5]
    assert cache.values[0][1, 0, 2:5, 0].tolist() == [-3, -4, -5]


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=5, dtype=torch.float64)


def test_entries_past_a_rows_length_are_never_attended(model):
    """Garbage left past a row's length (a rejected proposal) cannot change its logits."""
    weights = model_weights(model)
    s = weights.shape
    results = []
    for garbage in (0.0, 1e3):
        cache = StaticCache(s.num_layers, 2, s.num_kv_heads, s.head_dim, 16, torch.float64, "cpu")
        ids = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
        slots = torch.arange(5).expand(2, 5)
        mask = window_mask(torch.zeros(2, dtype=torch.long), torch.ones(5, 5, dtype=torch.bool).tril(), 5)
        forward(weights, cache, ids, slots, slots, mask, 5, logits_at=None)
        lengths = torch.tensor([3, 5])     # row 0 rolls back two entries
        for store in cache.keys + cache.values:
            store[0, :, 3:].fill_(garbage)  # and its dead slots hold junk
            store[1, :, 6:].fill_(garbage)
        step = torch.tensor([[7], [8]])
        mask = window_mask(lengths, torch.ones(1, 1, dtype=torch.bool), 16)
        results.append(forward(weights, cache, step, lengths[:, None], lengths[:, None], mask, 16))
    assert torch.equal(results[0], results[1])
