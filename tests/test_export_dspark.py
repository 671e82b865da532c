"""The served DSpark head (properties/models/dflash.py, reference/heads/dspark.py) exported as
both engines read a DSpark drafter (properties/export/dflash.py: the DFlash folder plus the
Markov head), read back, and converted by llama.cpp's converter."""

import json

import pytest
import torch

from properties.engines import llamacpp
from properties.export import dflash
from properties.models import dflash as served_dflash
from properties.models import heads as served_heads
from properties.models import served
from reference.checkpoint import _safetensors
from reference.heads.dspark import DSparkHead
from tests.test_export_dflash import convert, export_method, greedy_acceptance, read_back


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_method(tmp_path_factory, "dspark")


def test_the_config_holds_what_both_engines_read(exported):
    path = exported[2]
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DSparkDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"target_layer_ids": [0], "mask_token_id": 31,
                                       "block_size": 4}
    assert (config["markov_rank"], config["markov_head_type"], config["sample_from_anchor"]) \
        == (served_dflash.MARKOV_RANK, "vanilla", True)
    # the block is the round's k tokens, the newest first (anchor-first)
    assert config["block_size"] == served_dflash.K == llamacpp.METHODS["dspark"].k
    state = _safetensors().load_file(str(path / "model.safetensors"))
    V, R = served.VOCAB, served_dflash.MARKOV_RANK
    assert state["markov_head.markov_w1.weight"].shape == (V, R)
    assert state["markov_head.markov_w2.weight"].shape == (V, R)
    # the target's lm_head and embedding (llama.cpp's converter drops a full-vocabulary lm_head)
    assert "lm_head.weight" not in state and not [n for n in state if "embed" in n]


def test_the_folder_read_back_is_the_served_head(exported):
    head, back = read_back(exported)      # the same logits and proposals on CONTEXTS
    assert type(back) is DSparkHead and type(head) is DSparkHead
    assert (back.hidden, back.block_size, back.mask_token_id, back.own_lm_head,
            back.markov_rank) == (head.hidden, 4, head.mask_token_id, False, head.markov_rank)


def test_the_served_head_is_accepted_at_times():
    """The fitted Markov head makes the served head accepted in a fair share of greedy rounds
    of seeded random prompts."""
    accepted, drafted = greedy_acceptance(llamacpp.METHODS["dspark"].drafter)
    assert drafted == 20 * 7 * 4
    assert accepted / drafted > 0.05, (accepted, drafted)


def test_llamacpps_converter_reads_it(exported, tmp_path):
    """conversion/qwen.py DSparkModel: the dflash architecture with the anchor-first layout, no
    confidence head, the Markov tensors as stored, no lm_head (the target's is used)."""
    fields, tensors, state = convert(exported, tmp_path / "head-dspark.gguf")
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.target_layers"] == [1]
    assert fields["dflash.block_size"] == 4
    assert fields["dflash.sample_from_anchor"] is True
    assert fields["dflash.has_confidence_head"] is False
    assert fields["tokenizer.ggml.mask_token_id"] == 31
    assert {"markov_w1.weight", "markov_w2.weight", "fc.weight"} <= set(tensors)
    assert "output.weight" not in tensors and "token_embd.weight" not in tensors
    for gguf_name, name in (("markov_w1.weight", "markov_head.markov_w1.weight"),
                            ("markov_w2.weight", "markov_head.markov_w2.weight")):
        stored = torch.from_numpy(tensors[gguf_name].data.copy()).reshape(state[name].shape)
        assert torch.equal(stored, state[name]), gguf_name


def test_llamacpp_starts_it_as_draft_dspark():
    method = llamacpp.METHODS["dspark"]
    argv = [str(a) for a in llamacpp.spec_options(method, "/export/gguf")]
    assert argv[:4] == ["-md", "/export/gguf/head-dspark.gguf", "--spec-type", "draft-dspark"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    # p_min 0: a head without a confidence head is refused otherwise (speculative.cpp:999-1006)
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0"
    assert method.drafter.hidden == llamacpp.METHODS["dflash"].drafter.hidden
    assert dflash.config_of(served_heads.served_head(method.drafter))["architectures"] == \
        ["DSparkDraftModel"]
