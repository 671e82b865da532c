"""The committed trained pair (reference/trained/): it loads, its files are the ones the
manifest hashes, training decreases loss, its drafts make speculation pay, and the kit's cases
on it reach late draft positions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from reference import acceptance, corpus
from reference.model import Config
from reference.pretrained import TRAINED_DIR, check_manifest, load
from reference.speculative import greedy_generate, speculative_generate
from reference.train import Recipe, init_model, train


@pytest.fixture(scope="module")
def pair():
    return load()


def test_the_pair_loads_with_its_tokenizer_and_prompts(pair):
    manifest = pair.manifest
    assert pair.target.config.vocab_size == pair.small.config.vocab_size == manifest["recipe"]["target"]["vocab_size"]
    assert len(pair.target.layers) == manifest["recipe"]["target"]["num_hidden_layers"]
    assert 1 <= pair.exit_layers < len(pair.target.layers)
    prompts = pair.prompts()
    assert len(prompts) >= 8 and all(len(p) == pair.held["length"] for p in prompts)
    # the stored text is the stored ids decoded, and the tokenizer round-trips it
    first = pair.held["prompts"][0]
    assert pair.decode(first["ids"]) == first["text"]
    assert pair.tokenizer.encode(first["text"]).ids == first["ids"]


def test_the_committed_files_are_the_ones_the_manifest_hashes():
    assert check_manifest(TRAINED_DIR) == []


def test_check_manifest_names_an_edited_file(tmp_path):
    import shutil
    copy = tmp_path / "trained"
    shutil.copytree(TRAINED_DIR, copy)
    (copy / "heldout.json").write_text("{}")
    (copy / "stray.bin").write_bytes(b"x")
    assert check_manifest(copy) == ["heldout.json: sha256 differs from the manifest",
                                    "stray.bin: present but not in the manifest"]


def test_a_short_training_run_decreases_the_loss():
    # Bytes of a few standard-library files, a two-layer model: 40 steps take seconds.
    text = "".join(corpus.read(f) for f in corpus.corpus_files()[:20])
    tokens = torch.tensor(list(text.encode("utf-8"))[:200_000])
    config = Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    tie_word_embeddings=True)
    recipe = Recipe(seq_len=32, batch=8, warmup=5, lr=3e-3, target=config, small=config)
    model = init_model(config, seed=0)
    losses = train(model, tokens, recipe, 40, {2: 1.0, 1: 0.5})
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # an untrained model is near ln(256) = 5.55 nats; 40 steps learn at least the byte unigram law
    assert first > 5.0 and last < first - 1.0, losses


def test_train_rejects_zero_steps():
    model = init_model(Config(vocab_size=16, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=8), seed=0)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        train(model, torch.arange(100) % 16, Recipe(), 0, {1: 1.0})


def test_the_recipe_states_the_vocabulary_once():
    assert Recipe().vocab_size == Recipe().target.vocab_size == Recipe().small.vocab_size
    with pytest.raises(ValueError, match="small vocab_size=16, target vocab_size=2048"):
        Recipe(small=Config(vocab_size=16))


def test_the_held_out_losses_order_the_models(pair):
    loss = pair.manifest["held_out_loss"]
    # the target predicts held-out text better than its early exit and the small draft, and all
    # are far below a uniform guess over the vocabulary (ln 2048 = 7.6 nats)
    assert loss["target"] < loss["early_exit"] < 7.0 and loss["target"] < loss["small"] < 7.0


def test_speculation_with_a_trained_draft_stays_the_targets_greedy_output(pair):
    prompt = pair.prompts()[1]
    expected = greedy_generate(pair.target, prompt, 24)
    for name, draft in pair.drafts().items():
        tokens, stats = speculative_generate(pair.target, draft, prompt, 24, k=4)
        assert tokens == expected, name


def test_the_demo_prints_text_and_a_draft_that_pays():
    done = subprocess.run([sys.executable, "-m", "reference", "speculate", "--model", "trained",
                           "--k", "4"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["prompt_text"].strip()
    drafts = {line["draft"]: line for line in lines[1:]}
    assert all(line["text"] for line in drafts.values())
    assert all(line.get("identical_to_target_greedy", True) for line in drafts.values())
    # what the issue asks of the trained pair: a non-perfect draft accepting at least half its
    # proposals and at least two tokens per target call
    assert any(line["acceptance_rate"] >= 0.5 and line["tokens_per_target_call"] >= 2
               for line in drafts.values()), drafts


def test_the_demo_rejects_a_small_draft_on_random_models():
    done = subprocess.run([sys.executable, "-m", "reference", "speculate", "--draft", "small"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--draft small needs --model trained" in done.stderr


def test_kit_cases_on_the_trained_pair_reach_late_draft_positions():
    """How often the kit's trained cases reach each draft position (k = 8, greedy, the held-out
    prompts): the share of rounds whose proposals 1..i were all accepted. Measured on the float64
    models the kit uses, with the reference engine."""
    from properties.models import trained_pair
    kit = trained_pair()
    prompts = kit.prompts()[:8]
    shares = {}
    for name, draft in kit.drafts().items():
        measured = acceptance.measure(kit.target, draft, prompts, max_new_tokens=32, k=8,
                                      temperature=0.0)
        shares[name] = [r / measured["reached"][0] for r in measured["reached"]]
    print("share of rounds reaching draft position 1..8:",
          {n: [round(s, 2) for s in v] for n, v in shares.items()})
    # On random models position 4 is reached in 2-3% of rounds (issue 16); here at least one
    # trained draft reaches position 4 in a fifth of its rounds and position 8 sometimes.
    assert max(s[3] for s in shares.values()) >= 0.2, shares
    assert max(s[7] for s in shares.values()) > 0, shares


def test_export_models_trained_writes_loadable_directories(tmp_path):
    from properties.serve.__main__ import main
    from reference.checkpoint import load_pretrained
    from reference.model import EarlyExit
    from reference.cache import KVCache
    with pytest.warns(UserWarning) as warned:
        assert main(["export", str(tmp_path), "--models", "trained"]) == 0
    pair = load()
    # the small draft's heads (hidden 96 / 4 heads) are 24 wide: vLLM's CPU attention refuses
    # that size at its first request, and the export says so before anyone serves it
    small_head = pair.small.config.head_dim
    messages = [str(w.message) for w in warned]
    assert any(f"draft-small has head_dim={small_head}" in m and "vllm" in m
               for m in messages) == (small_head not in (32, 64, 80, 96, 112, 128)), messages
    assert not any(m.startswith("target ") for m in messages), messages
    ids = torch.tensor([pair.prompts()[0][:16]])

    def logits(model):
        c = model.config
        cache = KVCache(len(model.layers), 1, c.num_key_value_heads, c.head_dim, 16)
        with torch.no_grad():
            return model(ids, cache)

    exported = {name: load_pretrained(tmp_path / name) for name in
                ("target", "draft-small", "draft-early-exit")}
    assert torch.equal(logits(exported["target"]), logits(pair.target))
    assert torch.equal(logits(exported["draft-small"]), logits(pair.small))
    assert torch.allclose(logits(exported["draft-early-exit"]),
                          logits(EarlyExit(pair.target, pair.exit_layers)), atol=1e-5)
    assert (tmp_path / "target" / "tokenizer.json").read_text() == \
        (TRAINED_DIR / "tokenizer.json").read_text()
