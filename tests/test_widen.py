"""reference/widen.py: a grown model computes what the small one did (logits within float32
rounding on random inputs, with a cache, and its early exit unchanged), trains away from it,
and refuses shapes it cannot grow into; reference/grow.py end to end (extra)."""

from dataclasses import replace

import pytest
import torch

from reference.model import Config, EarlyExit
from reference.train import init_model
from reference.widen import widen

SMALL = Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               tie_word_embeddings=True)
BIG = replace(SMALL, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=6, num_key_value_heads=3)


def _logits(model, ids):
    return model(ids, model.new_cache(ids.shape[0], ids.shape[1]))


@pytest.mark.parametrize("tied", [True, False])
def test_the_grown_model_computes_the_same_logits(tied):
    small = init_model(replace(SMALL, tie_word_embeddings=tied), seed=1)
    with torch.no_grad():   # far from the initialization: large writers, uneven norm weights
        for name, p in small.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.5)
    big = widen(small, replace(BIG, tie_word_embeddings=tied), seed=2)
    assert sum(p.numel() for p in big.parameters()) > sum(p.numel() for p in small.parameters())
    ids = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = _logits(small, ids), _logits(big, ids)
        assert want.abs().max() > 1
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # token by token through the cache, and the early exit after the first layer
        cache = big.new_cache(3, 17)
        steps = torch.cat([big(ids[:, t:t + 1], cache) for t in range(17)], 1)
        torch.testing.assert_close(steps, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(_logits(EarlyExit(big, 1), ids),
                                   _logits(EarlyExit(small, 1), ids), rtol=1e-4, atol=1e-4)


def test_the_grown_model_trains_its_new_parts():
    """Readers random, writers zero: one gradient step moves the zero writers (zeros on both
    sides would have no gradient and stay zero)."""
    big = widen(init_model(SMALL, seed=1), BIG, seed=2).train()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(_logits(big, ids[:, :-1]).flatten(0, 1),
                                             ids[:, 1:].flatten())
    loss.backward()
    new_layer_writer = big.layers[2].self_attn.o_proj.weight.grad
    new_rows = big.layers[0].mlp.down_proj.weight.grad[SMALL.hidden_size:]
    assert new_layer_writer.abs().max() > 0 and new_rows.abs().max() > 0


@pytest.mark.parametrize("change, match", [
    ({"hidden_size": 16}, "hidden_size can only grow"),
    ({"head_dim": 16}, "head_dim must stay 8"),
    ({"vocab_size": 65}, "vocab_size must stay 64"),
    ({"num_attention_heads": 8}, "query heads per key-value head must stay 2"),
])
def test_shapes_it_cannot_grow_into_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        widen(init_model(SMALL, seed=1), replace(BIG, **change))


@pytest.mark.extra
def test_grow_stores_the_model_it_measured(tmp_path):
    """reference/grow.py end to end with 2 steps (about 50 s): the stored float16 target loads
    back bit for bit as the float32 model measured, greedy speculation with each draft still
    gives the grown target's greedy output, and the manifest lists every file it wrote."""
    from reference import grow, pretrained, speculative
    manifest = grow.grow(pretrained.TRAINED_DIR, tmp_path, grow.GrowRecipe(steps=2, small_steps=2),
                         log=lambda s: None)
    assert manifest["parameters"] > 10 * 1_400_000
    assert pretrained.check_manifest(tmp_path) == []
    assert pretrained.load_dir(tmp_path).small.config.head_dim == 32  # served engines load it
    pair = pretrained.load_dir(tmp_path)
    prompt = pair.prompts()[0][:16]
    plain = speculative.greedy_generate(pair.target, prompt, 24)
    for draft in pair.drafts().values():
        tokens, _ = speculative.speculative_generate(pair.target, draft, prompt, 24, k=4)
        assert tokens == plain
