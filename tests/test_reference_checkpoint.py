"""HF-format checkpoints round-trip and load in transformers with the same logits."""

import pytest
import torch

from reference.checkpoint import load_pretrained, save_pretrained
from reference.model import preset, random_model

pytest.importorskip("safetensors", reason="checkpoints need the optional 'hf' extra (safetensors)")


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip(tmp_path, tied):
    model = random_model(preset("tiny", tie_word_embeddings=tied), seed=2, dtype=torch.float64)
    loaded = load_pretrained(save_pretrained(model, tmp_path))
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(ids, loaded.new_cache(1, 5)), model(ids, model.new_cache(1, 5)),
                               rtol=0, atol=0)


def test_load_rejects_other_model_types(tmp_path):
    save_pretrained(random_model(preset("tiny", num_hidden_layers=1)), tmp_path)
    text = (tmp_path / "config.json").read_text().replace('"qwen3"', '"llama"')
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match="model_type='llama'"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_loads_the_checkpoint_with_the_same_logits(tmp_path, tied):
    transformers = pytest.importorskip("transformers", reason="needs the optional 'hf' extra")
    model = random_model(preset("tiny", tie_word_embeddings=tied), seed=3, dtype=torch.float32)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(save_pretrained(model, tmp_path),
                                                       dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    ours = model(ids, model.new_cache(2, 12))
    with torch.no_grad():
        theirs = hf(ids).logits
    # float32 rounding: a few ulps of the largest logit, accumulated over 6 layers.
    scale = ours.abs().max()
    torch.testing.assert_close(theirs, ours, rtol=0, atol=float(scale) * 1e-5)
