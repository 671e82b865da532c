"""fast/weights.py's huge pages: the engine's copies of a layer's matrices in one 2 MB-aligned
block advised for huge pages hold the model's values exactly, change no bit of any output, follow
in-place edits of the model's weights, are not made for layers under one 2 MB page or with
FAST_HUGE_PAGES=0, and are granted huge pages by the kernel where its mode allows them."""

import mmap
import sys

import pytest
import torch

from fast import fused, weights
from fast.testing import chain, fast_cache
from reference.model import preset, random_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                                reason="huge pages are a Linux feature; elsewhere the engine never copies")

# 2 layers of the large trained target's shape: 7 MB of matrices a layer in float32
WIDE = preset("tiny", vocab_size=2048, hidden_size=384, intermediate_size=1152, num_hidden_layers=2,
              num_attention_heads=12, num_key_value_heads=6, head_dim=32, tie_word_embeddings=True)


@pytest.fixture
def advised(monkeypatch):
    """The copy path whatever this machine's mode (madvise works wherever huge pages are built)."""
    monkeypatch.setattr(weights, "huge_pages_mode", lambda: "madvise")


def parameters_of(model, i):
    block = model.model.layers[i]
    a, m = block.self_attn, block.mlp
    return {"qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), "o": a.o_proj.weight,
            "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]), "down": m.down_proj.weight}


def logits(built, ids):
    """A prefill, then a decode step and a verify of 5 tokens after it: [1, T, vocab] each."""
    cache = fast_cache(built, 1, 64)
    start = torch.zeros(1, dtype=torch.long)
    out = [chain(built, cache, ids[:, :16], start, 16)]
    for T in (1, 5):
        out.append(chain(built, cache, ids[:, 16:16 + T], start + 16, 16 + T))
    return out


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_huge_page_copies_hold_the_parameters_and_change_no_output(advised, dtype):
    model = random_model(WIDE, seed=3, dtype=dtype)
    on = weights.model_weights(model)
    with weights.huge_pages.enabled(False):
        off = weights.model_weights(model)
    for i, layer in enumerate(on.layers):
        for name, value in parameters_of(model, i).items():
            matrix = getattr(layer, name)
            assert torch.equal(matrix, value), name
            assert matrix.data_ptr() % 64 == 0, f"{name} does not start on a cache line"
            assert matrix.data_ptr() != value.data_ptr(), f"{name} is not a copy"
        assert layer.qkv.data_ptr() % weights.HUGE_PAGE == 0, "the block does not start on a 2 MB boundary"
        assert off.layers[i].o.data_ptr() == model.model.layers[i].self_attn.o_proj.weight.data_ptr()
    assert torch.equal(on.lm_head, model.lm_head.weight)
    assert on.lm_head.data_ptr() != model.lm_head.weight.data_ptr(), "the head is not a copy"
    ids = torch.randint(0, WIDE.vocab_size, (1, 21), generator=torch.Generator().manual_seed(0))
    for path in (True, False):
        with fused.enabled(path):
            for a, b in zip(logits(on, ids), logits(off, ids)):
                assert torch.equal(a, b), f"huge pages changed the logits (fused={path})"


def test_an_in_place_edit_of_the_model_reaches_the_copies(advised):
    model = random_model(WIDE, seed=4)
    before = weights.model_weights(model)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(2)
        model.lm_head.weight.add_(1)
    after = weights.model_weights(model)
    assert after.layers[0] is before.layers[0], "an untouched layer was copied again"
    assert torch.equal(after.layers[1].down, model.model.layers[1].mlp.down_proj.weight)
    assert not torch.equal(after.layers[1].down, before.layers[1].down)
    assert torch.equal(after.lm_head, model.lm_head.weight)


def test_no_copies_below_one_huge_page_or_when_switched_off(advised):
    small = random_model("tiny", seed=5)
    built = weights.model_weights(small)
    assert built.layers[0].o.data_ptr() == small.model.layers[0].self_attn.o_proj.weight.data_ptr()
    assert built.lm_head.data_ptr() == small.lm_head.weight.data_ptr()
    wide = random_model(WIDE, seed=5)
    with weights.huge_pages.enabled(False):
        built = weights.model_weights(wide)
    assert built.layers[0].down.data_ptr() == wide.model.layers[0].mlp.down_proj.weight.data_ptr()


def test_the_kernel_grants_huge_pages_where_its_mode_allows():
    mode = weights.huge_pages_mode()
    if mode not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {mode!r} on this machine")
    model = random_model(WIDE, seed=6)
    built = weights.model_weights(model)
    # each layer's 7 MB block holds three whole 2 MB pages; the kernel may decline some (when it
    # finds no free 2 MB of memory), none only when it was not asked (a shared mapping, no advice)
    assert weights.huge_page_bytes(built) > 0
    if mode == "madvise":   # unadvised memory gets none
        with weights.huge_pages.enabled(False):
            assert weights.huge_page_bytes(weights.model_weights(model)) == 0
