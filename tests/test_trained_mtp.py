"""The MTP layer trained on the committed trained target (reference/train_mtp.py,
reference/trained/mtp, make models-heads) and llama.cpp's method `mtp-trained`."""

import pytest
import torch

from fast.testing import one_thread
from reference.heads.base import with_lead
from reference.heads.checkpoint import load_head
from reference.heads.mtp import MTPLayer
from reference.hidden import last_layer
from reference.pretrained import TRAINED_DIR
from reference.distill import window_forward
from reference.train_heads import HeadRecipe
from reference.train_mtp import CONVENTION, init_layer, pass_logits, train_layer
from tests.heads_by_hand import committed_entry, reproduces_recorded_acceptance, small_target

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


# --- the committed layer ---------------------------------------------------------------------

@needs_layer
def test_the_committed_layer_is_in_the_manifest():
    entry = committed_entry("mtp")
    assert entry["convention"] == CONVENTION | {"mask0": False}


@needs_layer
def test_the_committed_layer_reproduces_the_manifests_greedy_acceptance():
    """Through the reference MTP proposer (reference.speculative with the layer as the draft)."""
    from reference.pretrained import load
    pair = load()
    reproduces_recorded_acceptance(pair, pair.head("mtp"), "mtp")


@needs_layer
@pytest.mark.parametrize("engine, convention", [("llamacpp", ("normed", True, False)),
                                                ("vllm", ("output", False, True))])
def test_mtp_trained_exports_the_committed_layer(tmp_path, engine, convention):
    """Each engine's method exports the trained target with the committed layer as GLM-4.5 in
    its layout, read back (as the engine loads it) into the layer the trained check replays,
    in the engine's convention (recycle, lead, mask0): equal round logits. llama.cpp's is the
    one it was trained in."""
    from importlib import import_module

    from properties.export import heads as export
    from properties.export.trained import pair_of
    from reference.heads.replay import round_logits
    drafter = import_module(f"properties.engines.{engine}").METHODS["mtp-trained"].drafter
    path = export.export(tmp_path, drafter, "trained")
    target = pair_of("trained", torch.float64).target
    mine, back = export.trained_head(drafter, "trained"), export.load_vllm(path, target)
    assert back.hidden == mine.hidden == drafter.hidden
    assert (back.recycle, back.lead, back.mask0) == (mine.recycle, mine.lead, mine.mask0) == \
        convention
    for name, t in load_head(LAYER_DIR, target).state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    seq = list(pair_of("trained").prompts()[0][:12])
    _, features = target.forward_hidden(torch.tensor([seq]), target.new_cache(1, 12),
                                        mine.hidden)
    torch.testing.assert_close(round_logits(back, features[0], seq, 8, 4),
                               round_logits(mine, features[0], seq, 8, 4), rtol=0, atol=0)
