"""The Medusa heads trained on the committed trained target (reference/train_medusa.py,
reference/trained/medusa, make models-heads) and their vLLM method `medusa-trained`."""

import json

import pytest
import torch

from fast.testing import one_thread
from reference.heads.replay import round_logits
from reference.pretrained import TRAINED_DIR
from reference.train_medusa import MedusaRecipe, init_heads, medusa_losses, train_medusa
from tests.heads_by_hand import committed_entry, reproduces_recorded_acceptance, small_target

HEAD_DIR = TRAINED_DIR / "medusa"
needs_heads = pytest.mark.skipif(not (HEAD_DIR / "model.safetensors").is_file(),
                                 reason="no trained Medusa heads (make models-heads)")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_head_i_is_judged_against_the_targets_law_i_places_later():
    """medusa_losses by hand: head i at position j against the target's row j + i (its law of
    t_{j+1+i}), the same positions for every head; a head that copies that row scores 0."""
    target = small_target(seed=3).float()
    recipe = MedusaRecipe(heads=3)
    heads = init_heads(target, recipe)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    with torch.no_grad():
        logits, features = target.forward_hidden(ids, target.new_cache(1, 10), heads.hidden)
        p = torch.log_softmax(logits[0], -1)
        q = torch.log_softmax(heads(features)[0], -1)        # [T, K, V]
    n = ids.shape[1] - 3
    with torch.no_grad():
        losses = medusa_losses(heads, target, ids)
    for i, loss in enumerate(losses, start=1):
        by_hand = sum(float((p[j + i].exp() * (p[j + i] - q[j, i - 1])).sum())
                      for j in range(n)) / n
        assert float(loss) == pytest.approx(by_hand, rel=1e-5)
    # at the start every head is the target's own lm_head: head i guesses t_{j+1} for t_{j+1+i}
    torch.testing.assert_close(q[:, 0], p, rtol=0, atol=1e-5)


def test_a_short_training_run_lowers_the_kl():
    recipe = MedusaRecipe(steps=40, heads=2, batch=4, seq_len=24, warmup=5, lr=1e-2)
    ids = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(0))
    heads, history = train_medusa(small_target(seed=5).float(), ids, recipe, log=None)
    first, last = history[0], [sum(h[i] for h in history[-5:]) / 5 for i in range(2)]
    assert all(l < 0.8 * f for f, l in zip(first, last)), (first, last)
    assert not any(p.requires_grad for p in heads.parameters())


# --- the committed heads ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    from reference.pretrained import load
    pair = load()
    return pair, pair.head("medusa")


@needs_heads
def test_the_committed_heads_are_in_the_manifest():
    entry = committed_entry("medusa")
    # distilled: every head's held-out KL well below the untrained start's
    assert all(k < 0.8 * u for k, u in zip(entry["held_out_kl"], entry["held_out_kl_untrained"]))


@needs_heads
def test_the_committed_heads_beat_their_start_on_held_out_text(trained):
    """Measured here, not read from the manifest: on 4 held-out windows of the corpus's
    held-out files, every committed head's KL to the target is below the untrained heads'."""
    from reference import corpus
    pair, heads = trained
    texts = [corpus.read(f) for f in corpus.split(corpus.corpus_files())[1][:20]]
    ids = torch.tensor(corpus.encode_files(pair.tokenizer, texts))
    windows = ids[:4 * 65].reshape(4, 65)
    start = init_heads(pair.target, MedusaRecipe())
    with torch.no_grad():
        mine = medusa_losses(heads, pair.target, windows)
        before = medusa_losses(start, pair.target, windows)
    assert all(float(a) < 0.8 * float(b) for a, b in zip(mine, before)), (mine, before)


@needs_heads
def test_the_committed_heads_reproduce_the_manifests_greedy_acceptance(trained):
    reproduces_recorded_acceptance(*trained, "medusa")


@needs_heads
def test_medusa_trained_exports_in_vllms_format_and_is_listed(tmp_path, capsys):
    """The method's export is vLLM's MedusaModel folder holding the committed heads' numbers
    (read back as the engine loads them, its round logits equal the float64 trained heads'),
    and `python -m properties.serve methods` lists it on the trained pair."""
    from properties.engines.vllm import METHODS
    from properties.export import heads as export
    from properties.export.trained import pair_of
    from properties.serve import __main__ as cli
    drafter = METHODS["medusa-trained"].drafter
    path = export.export(tmp_path, drafter, "trained")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["num_heads"] == 4
    target = pair_of("trained", torch.float64).target
    mine, back = export.trained_head(drafter, "trained"), export.load_vllm(path, target)
    assert back.hidden == mine.hidden == drafter.hidden
    seq = list(pair_of("trained").prompts()[0][:12])
    _, features = target.forward_hidden(torch.tensor([seq]), target.new_cache(1, 12),
                                        mine.hidden)
    torch.testing.assert_close(round_logits(back, features[0], seq, 8, 4),
                               round_logits(mine, features[0], seq, 8, 4), rtol=0, atol=0)
    assert cli.main(["methods", "vllm"]) == 0
    assert "vllm:medusa-trained:trained" in capsys.readouterr().out.split()
