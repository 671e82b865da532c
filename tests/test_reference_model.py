"""The reference model and its cache: rollback, tree masks, early exit, presets, checkpoints."""

import pytest
import torch

from reference.cache import KVCache
from reference.model import Config, EarlyExit, Qwen3, preset, random_model
from reference.tree import Tree


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=0, dtype=torch.float64)


def ids_of(*tokens):
    return torch.tensor([tokens])


def test_incremental_decoding_equals_one_prefill(target):
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    whole = target(ids, target.new_cache(2, 9))
    cache = target.new_cache(2, 9)
    pieces = [target(ids[:, :4], cache), target(ids[:, 4:5], cache), target(ids[:, 5:], cache)]
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=0, atol=1e-12)


def test_truncate_then_reappend_equals_a_fresh_prefill(target):
    """Rolled-back entries are dead: writing other tokens over them gives the logits a cache
    that never saw the rejected tokens would give."""
    cache = target.new_cache(1, 16)
    target(ids_of(5, 6, 7), cache)
    target(ids_of(100, 101, 102, 103), cache)  # rejected proposals
    cache.truncate(3)
    after_rollback = target(ids_of(8, 9), cache)
    fresh = target(ids_of(5, 6, 7, 8, 9), target.new_cache(1, 16))[:, 3:]
    torch.testing.assert_close(after_rollback, fresh, rtol=0, atol=1e-12)
    assert cache.length == 5


def test_tree_mask_gives_each_node_the_logits_of_its_own_path(target):
    tree = Tree((2, 2))
    prefix, tokens = [3, 1, 4], [1, 50, 60, 70, 71, 80, 81]  # node 0 is `last`
    cache = target.new_cache(1, 16)
    target(torch.tensor([prefix]), cache)
    every = list(range(tree.size))
    logits = target(torch.tensor([tokens]), cache, tree.positions(every, 3, "cpu"),
                    tree.mask(every, 3, "cpu"))[0]
    for node in every:
        path, i = [], node
        while i >= 0:
            path.insert(0, tokens[i])
            i = tree.parent[i]
        alone = target(torch.tensor([prefix + path]), target.new_cache(1, 16))[0, -1]
        torch.testing.assert_close(logits[node], alone, rtol=0, atol=1e-12)


def test_cache_move_keeps_the_chosen_entries_in_order():
    cache = KVCache(1, 1, 1, 1, 8, torch.float64)
    cache.write(0, torch.arange(6.0).view(1, 1, 6, 1), torch.arange(6.0).view(1, 1, 6, 1))
    cache.advance(6)
    cache.move([3, 5], 1)
    cache.truncate(3)
    assert cache.keys[0][0, 0, :3, 0].tolist() == [0.0, 3.0, 5.0]


def test_early_exit_with_every_layer_is_the_target(target):
    ids = ids_of(1, 2, 3, 4)
    full = EarlyExit(target, len(target.layers))
    torch.testing.assert_close(full(ids, full.new_cache(1, 4)), target(ids, target.new_cache(1, 4)),
                               rtol=0, atol=0)


def test_early_exit_shares_weights_and_has_its_own_shallow_cache(target):
    draft = EarlyExit(target, 2)
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert len(draft.new_cache(1, 4).keys) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_any_float_dtype(dtype):
    model = random_model(preset("tiny", num_hidden_layers=2), seed=0, dtype=dtype)
    logits = model(ids_of(1, 2, 3), model.new_cache(1, 3))
    assert logits.dtype == dtype and logits.shape == (1, 3, 256) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name, non_embedding", [("qwen3-0.6b", 0.44e9), ("qwen3-1.7b", 1.4e9)])
def test_presets_have_the_published_parameter_counts(name, non_embedding):
    # Qwen3 model cards: 0.6B has 0.44B non-embedding parameters, 1.7B has 1.4B.
    with torch.device("meta"):
        model = Qwen3(preset(name))
    counted = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    assert abs(counted - non_embedding) / non_embedding < 0.01


def test_tied_head_is_the_embedding():
    model = Qwen3(Config(tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_parameter_names_follow_the_hugging_face_layout():
    names = set(dict(Qwen3(Config(num_hidden_layers=1)).named_parameters()))
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight"} <= names
