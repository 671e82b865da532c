"""The MTP layer trained on the committed trained target (reference/train_mtp.py,
reference/trained/mtp, make models-heads) and llama.cpp's method `mtp-trained`."""

import pytest
import torch

from fast.testing import one_thread
from reference.heads.base import with_lead
from reference.heads.mtp import MTPLayer
from reference.hidden import last_layer
from reference.pretrained import TRAINED_DIR
from reference.train_heads import HeadRecipe, window_forward
from reference.train_mtp import CONVENTION, init_layer, pass_logits, train_layer
from tests.heads_by_hand import small_target

LAYER_DIR = TRAINED_DIR / "mtp"
needs_layer = pytest.mark.skipif(not (LAYER_DIR / "model.safetensors").is_file(),
                                 reason="no trained MTP layer (make models-heads)")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize("convention", [CONVENTION,                        # llama.cpp's
                                        {"recycle": "output", "mask0": True}])   # vLLM's
def test_every_pass_is_the_layer_chained_as_a_round(convention):
    """Pass t at pair i (the training-time test, all pairs at once) is the layer's own forward
    in a round whose verified pairs end at i - t + 1, chained on its outputs t - 1 times with
    the true tokens: each of the k proposals is trained as the engine computes it."""
    target = small_target(seed=3)                                     # float64
    layer = MTPLayer(target, last_layer(target.config.num_hidden_layers, normed=True),
                     **convention).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2]])
    lead = 1 if layer.lead else 0
    with torch.no_grad():
        _, features = window_forward(target, ids, layer.hidden)
        passes = pass_logits(layer, features, ids, 4)
        for t, rows in enumerate(passes, start=1):
            for i in range(t - 1, ids.shape[1] - 1):
                n = i - t + 2                         # the round's verified pairs: 0 .. n - 1
                cache = layer.new_cache(n + t + lead)
                logits, g = layer(ids[:, 1 - lead:n + 1],
                                  with_lead(layer, features[:, :n], -lead) if lead
                                  else features[:, :n], cache)
                for s in range(1, t):
                    logits, g = layer(ids[:, n + s:n + s + 1], g[:, -1:], cache)
                torch.testing.assert_close(rows[0, i], logits[0, -1], rtol=0, atol=1e-9)


def test_a_short_training_run_lowers_the_kl():
    recipe = HeadRecipe(steps=30, passes=2, batch=4, seq_len=24, warmup=5, lr=1e-2)
    ids = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(0))
    target = small_target(seed=5).float()
    layer, history = train_layer(target, ids, recipe, log=None)
    first, last = history[0], [sum(h[i] for h in history[-5:]) / 5 for i in range(2)]
    assert all(l < 0.8 * f for f, l in zip(first, last)), (first, last)
    assert not any(p.requires_grad for p in layer.parameters())
    assert (layer.order, layer.recycle, layer.lead, layer.mask0) == (
        "embedding-first", "normed", True, False)


def test_the_layer_starts_small_and_seeded():
    target = small_target(seed=5).float()
    a, b = init_layer(target, 0), init_layer(target, 0)
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name]), name
    assert set(a.state_dict()) == set(b.state_dict())
    assert not any(n.startswith("target.") for n in a.state_dict())   # the target is not its own
