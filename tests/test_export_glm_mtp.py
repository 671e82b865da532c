"""The served target with an MTP layer as GLM-4.5 (properties/export/glm_mtp.py), what
llama.cpp's draft-mtp runs: its trunk computes the kit's target (transformers' Glm4Moe gives
bit for bit what its Qwen3 gives on the kit's own export), and the folder reads back into
exactly the served target and MTP layer the kit replays."""

import json

import pytest
import torch

from fast.testing import one_thread
from properties.export import glm_mtp, kit
from properties.export import heads as head_export
from properties.methods import HeadDraft
from properties.models import served
from properties.models.heads import served_head
from reference.cache import KVCache
from reference.heads.random import random_head
from reference.hidden import last_layer

DRAFTER = HeadDraft("mtp", "target-glm4moe-mtp", last_layer(2, normed=True),
                    options=(("recycle", "normed"), ("lead", True)))
IDS = [[1, 5, 9, 30, 2, 2, 7, 11, 0, 31, 4, 4, 4, 17]]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm")
    return head_export.export(root, DRAFTER), kit.export_model("target", root / "target")


def test_the_trunk_is_the_kits_target(exported):
    transformers = pytest.importorskip("transformers")
    glm_dir, qwen_dir = exported
    glm = transformers.AutoModelForCausalLM.from_pretrained(glm_dir, dtype=torch.float64)
    qwen = transformers.AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.float64)
    assert type(glm).__name__ == "Glm4MoeForCausalLM"
    assert all(type(layer.mlp).__name__ == "Glm4MoeMLP" for layer in glm.model.layers)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        a, b = glm(ids).logits, qwen(ids).logits
    assert torch.equal(a, b)      # the same operations on the same numbers
    target = served.build("target")
    c = target.config
    cache = KVCache(c.num_hidden_layers, 1, c.num_key_value_heads, c.head_dim, ids.shape[1],
                    torch.float64, "cpu")
    # transformers normalizes and rotates in float32 whatever the dtype; the kit in float64
    torch.testing.assert_close(a, target(ids, cache), rtol=0, atol=1e-5)


def test_the_folder_reads_back_into_the_served_target_and_layer(exported):
    glm_dir, _ = exported
    config = json.loads((glm_dir / "config.json").read_text())
    assert config["first_k_dense_replace"] == config["num_hidden_layers"] == 2
    assert (config["n_routed_experts"], config["num_experts_per_tok"],
            config["num_nextn_predict_layers"]) == (2, 1, 1)
    assert config["rope_parameters"]["partial_rotary_factor"] == 1.0
    target, layer = glm_mtp.load(glm_dir)
    for name, t in served.build("target").state_dict().items():
        assert torch.equal(target.state_dict()[name], t), name
    for name, t in served_head(DRAFTER).state_dict().items():
        assert torch.equal(layer.state_dict()[name], t), name
    assert (layer.order, layer.recycle, layer.lead) == ("embedding-first", "normed", True)


def test_only_llama_cpps_convention_is_written(tmp_path):
    target = served.build("target")
    mimo = random_head("mtp", target, hidden=last_layer(2, normed=True), order="hidden-first",
                       recycle="normed")
    with pytest.raises(ValueError, match="order='embedding-first', got order='hidden-first'"):
        glm_mtp.tensors(mimo)
    with pytest.raises(TypeError, match="takes an MTPLayer, got Qwen3"):
        glm_mtp.tensors(target)
    with pytest.raises(ValueError, match="is not a Glm4MoeForCausalLM"):
        (tmp_path / "config.json").write_text("{}")
        glm_mtp.load(tmp_path)


def test_the_served_layer_is_rebuilt_bit_for_bit():
    """The replay rebuilds the layer the export wrote, in another process and after other
    heads: its fit must have one answer (a rank-deficient least squares moved eh_proj by 0.5
    between two builds in one process)."""
    from dataclasses import replace
    build = served_head.__wrapped__
    first = build(DRAFTER)
    build(replace(DRAFTER, options=(("recycle", "output"),)))
    again = build(replace(DRAFTER, head="another-name"))
    for name, t in first.state_dict().items():
        assert torch.equal(again.state_dict()[name], t), name


def test_vllms_layout_is_the_same_target_and_layer(tmp_path):
    """vLLM's layout (glm_mtp.LAYOUTS): the last trunk layer a mixture of two experts equal to
    its MLP with a zero shared expert (vLLM refuses an all-dense trunk), shared_head.norm
    written; it reads back into the same target, and the layer with vLLM's convention."""
    transformers = pytest.importorskip("transformers")
    drafter = HeadDraft("mtp", "target-glm4moe-mtp-vllm", last_layer(2, normed=True),
                        options=(("recycle", "output"), ("mask0", True)))
    path = head_export.export(tmp_path, drafter)
    config = json.loads((path / "config.json").read_text())
    assert config["first_k_dense_replace"] == 1
    target, layer = glm_mtp.load(path)
    for name, t in served.build("target").state_dict().items():
        assert torch.equal(target.state_dict()[name], t), name
    assert (layer.recycle, layer.lead, layer.mask0) == ("output", False, True)
    # float32: transformers' grouped expert kernel takes no float64
    glm = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(glm.model.layers[1].mlp).__name__ == "Glm4MoeMoE"
    ids = torch.tensor(IDS)
    c = target.config
    cache = KVCache(c.num_hidden_layers, 1, c.num_key_value_heads, c.head_dim, ids.shape[1],
                    torch.float64, "cpu")
    with torch.no_grad():
        torch.testing.assert_close(glm(ids).logits.double(), target(ids, cache), rtol=0,
                                   atol=1e-4)


def test_the_trained_targets_trunk_is_the_trained_target(tmp_path):
    """The trick holds for the trained target (6 layers, hidden 128, 2,048 tokens, its lm_head
    tied to its embedding): its GLM-4.5 layout (first_k_dense_replace 6, the lm_head written
    apart) computes in transformers bit for bit what the run's own Qwen3 export of it computes
    (the baseline server's model), and reads back into the same target."""
    transformers = pytest.importorskip("transformers")
    from properties.engines.llamacpp import METHODS
    from properties.export import trained
    pair = trained.pair_of("trained", torch.float32)
    method = METHODS["mtp-trained"]
    layer = random_head("mtp", pair.target, hidden=method.drafter.hidden,
                        **dict(method.drafter.options))
    glm_dir = glm_mtp.write(layer, tmp_path / method.drafter.head,
                            trained.tokenizer_files(pair))
    qwen_dir = trained.export(tmp_path / "qwen", method)["target"]
    config = json.loads((glm_dir / "config.json").read_text())
    assert config["first_k_dense_replace"] == config["num_hidden_layers"] == 6
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == 2048
    glm = transformers.AutoModelForCausalLM.from_pretrained(glm_dir, dtype=torch.float64)
    qwen = transformers.AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.float64)
    ids = torch.tensor([pair.prompts()[0][:24]])
    with torch.no_grad():
        assert torch.equal(glm(ids).logits, qwen(ids).logits)
    target, back = glm_mtp.load(glm_dir)
    for name, t in pair.target.state_dict().items():
        assert torch.equal(target.state_dict()[name], t.double()), name
    for name, t in layer.state_dict().items():
        assert torch.equal(back.state_dict()[name], t.double()), name
    assert (back.recycle, back.lead, back.mask0) == ("normed", True, False)
