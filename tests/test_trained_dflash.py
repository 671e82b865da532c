"""The DFlash block drafter trained on the committed trained target (reference/train_dflash.py,
reference/trained/dflash, make models-heads) and its methods `dflash-trained` on llama.cpp and
vLLM."""

import json

import pytest
import torch

from fast.testing import one_thread
from reference.heads.dflash import DFlashHead
from reference.heads.random import randomize
from reference.heads.replay import round_logits
from reference.hidden import HiddenStates
from reference.pretrained import TRAINED_DIR
from reference.train_dflash import (DFlashRecipe, block_logits, dflash_losses, init_head,
                                    train_dflash)
from tests.heads_by_hand import committed_entry, reproduces_recorded_acceptance, small_target

HEAD_DIR = TRAINED_DIR / "dflash"
needs_head = pytest.mark.skipif(not (HEAD_DIR / "model.safetensors").is_file(),
                                reason="no trained DFlash drafter (make models-heads)")
# the 4-layer small target's non-last layers, low and high
SMALL_HIDDEN = HiddenStates((0, 2), "output")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_every_block_of_a_window_is_the_round_at_its_anchor():
    """block_logits trains every anchor of a window in one pass: each block, under its attention
    mask, gives the logits the head's own round at that anchor gives (the verified features of
    positions < n as context, [t_n, masks] at n ..), in float64 with random weights."""
    target = small_target(seed=3)
    head = randomize(DFlashHead(target, SMALL_HIDDEN, block_size=4, num_layers=2,
                                own_lm_head=True), seed=1)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 31, 2]])
    with torch.no_grad():
        _, features = target.forward_hidden(ids, target.new_cache(1, 12), head.hidden)
        anchors = torch.arange(1, 12 - 3 + 1)
        blocks = block_logits(head, features, ids, anchors)
        for a, n in enumerate(anchors.tolist()):
            torch.testing.assert_close(blocks[:, a], head(features[:, :n], ids[:, n]),
                                       rtol=0, atol=1e-10)


def test_mask_i_is_judged_against_the_targets_law_of_t_n_plus_i():
    """dflash_losses by hand: mask i at anchor n against the target's row n + i - 1."""
    target = small_target(seed=3)
    head = randomize(DFlashHead(target, SMALL_HIDDEN, block_size=4, own_lm_head=True), seed=2)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    with torch.no_grad():
        logits, features = target.forward_hidden(ids, target.new_cache(1, 10), head.hidden)
        p = torch.log_softmax(logits[0], -1)
        losses = dflash_losses(head, target, ids)
    anchors = range(1, 10 - 3 + 1)
    for i, loss in enumerate(losses, start=1):
        by_hand = 0.0
        for n in anchors:
            q = torch.log_softmax(head(features[:, :n], ids[:, n])[0, i - 1], -1)
            by_hand += float((p[n + i - 1].exp() * (p[n + i - 1] - q)).sum())
        assert float(loss) == pytest.approx(by_hand / len(anchors), rel=1e-9)


def test_a_short_training_run_lowers_the_kl():
    recipe = DFlashRecipe(steps=30, block_size=3, num_layers=1, batch=4, seq_len=20, warmup=5,
                          lr=1e-2)
    ids = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(0))
    head, history = train_dflash(small_target(seed=5).float(), ids, recipe, log=None,
                                 hidden=SMALL_HIDDEN)
    first, last = history[0], [sum(h[i] for h in history[-5:]) / 5 for i in range(2)]
    assert all(l < 0.8 * f for f, l in zip(first, last)), (first, last)
    assert not any(p.requires_grad for p in head.parameters())


# --- the committed drafter -------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    from reference.pretrained import load
    pair = load()
    return pair, pair.head("dflash")


@needs_head
def test_the_committed_drafter_is_in_the_manifest():
    entry = committed_entry("dflash")
    # distilled: every mask's held-out KL well below the untrained start's
    assert all(k < 0.5 * u for k, u in zip(entry["held_out_kl"], entry["held_out_kl_untrained"]))
    # never the last layer (llama.cpp aborts: tests/findings/llamacpp_dflash_last_layer/)
    assert max(entry["hidden"]["layers"]) < 5


@needs_head
def test_the_committed_drafter_beats_its_start_on_held_out_text(trained):
    """Measured here: on 2 held-out windows of the corpus's held-out files, every mask's KL to
    the target is below the untrained drafter's."""
    from reference import corpus
    pair, head = trained
    texts = [corpus.read(f) for f in corpus.split(corpus.corpus_files())[1][:20]]
    ids = torch.tensor(corpus.encode_files(pair.tokenizer, texts))
    windows = ids[:2 * 49].reshape(2, 49)
    start = init_head(pair.target, DFlashRecipe())
    with torch.no_grad():
        mine, before = dflash_losses(head, pair.target, windows), \
            dflash_losses(start, pair.target, windows)
    assert all(float(a) < 0.5 * float(b) for a, b in zip(mine, before)), (mine, before)


@needs_head
def test_the_committed_drafter_reproduces_the_manifests_greedy_acceptance(trained):
    reproduces_recorded_acceptance(*trained, "dflash")


@needs_head
@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_dflash_trained_exports_both_engines_format_and_is_listed(engine, tmp_path, capsys):
    """Each engine's method exports the committed drafter as DFlashDraftModel (layers 0, 2, 4,
    its own lm_head, a block of 5); read back as the engine loads it, its round logits equal
    the float64 trained drafter's; `python -m properties.serve methods` lists it on the trained
    pair."""
    from properties import engines
    from properties.export import heads as export
    from properties.export.trained import pair_of
    from properties.serve import __main__ as cli
    drafter = engines.get(engine).methods["dflash-trained"].drafter
    path = export.export(tmp_path, drafter, "trained")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"target_layer_ids": [0, 2, 4], "mask_token_id": 2047,
                                       "block_size": 5}
    target = pair_of("trained", torch.float64).target
    mine, back = export.trained_head(drafter, "trained"), export.load_vllm(path, target)
    assert back.hidden == mine.hidden == drafter.hidden and back.own_lm_head
    seq = list(pair_of("trained").prompts()[0][:16])
    _, features = target.forward_hidden(torch.tensor([seq]), target.new_cache(1, 16),
                                        mine.hidden)
    for n in (1, 6, 12):
        torch.testing.assert_close(round_logits(back, features[0], seq, n, 4),
                                   round_logits(mine, features[0], seq, n, 4), rtol=0, atol=0)
    assert cli.main(["methods", engine]) == 0
    assert f"{engine}:dflash-trained:trained" in capsys.readouterr().out.split()
