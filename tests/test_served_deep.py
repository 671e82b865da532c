"""The deeper variant of the served target (properties/models/served.py VARIANTS, issue 40): a
4-layer target seeded and built as the served one, which a head method names
(HeadDraft.target) and its run serves (properties/serve/run.py serve_target); OpenVINO GenAI's
eagle3-deep reads three of its layer outputs. Built bit for bit again from its seed, exported
and read back, its head exported and read back, and the switch leaves the served models as
they are."""

import json

import pytest
import torch

from properties import oracle
from properties.engines import openvino
from properties.export import heads as head_export
from properties.export import kit as export
from properties.methods import HeadDraft
from properties.models import heads, served
from properties.serve.run import serve_target
from reference.model import random_model

DEEP = openvino.METHODS["eagle3-deep"]


@pytest.fixture
def deep():
    """The deep target served for one test; the kit's served target again after it."""
    serve_target(DEEP)
    try:
        yield served.build("target")
    finally:
        serve_target(openvino.METHODS["draft-early-exit"])


def test_the_variant_is_seeded_and_built_as_the_served_target():
    model = served.build("target-deep")
    assert model.config == served.DEEP_CONFIG and len(model.layers) == 4
    # the served target's shapes, the depth apart
    assert served.DEEP_CONFIG == served.TARGET_CONFIG.__class__(
        **{**served.TARGET_CONFIG.__dict__, "num_hidden_layers": 4})
    again = random_model(served.DEEP_CONFIG, seed=served.DEEP_SEED, dtype=torch.float32,
                         std=served.PROJECTION_STD).to(torch.float64)
    state = model.state_dict()
    assert set(again.state_dict()) == set(state)
    assert all(torch.equal(t, state[k]) for k, t in again.state_dict().items())
    # weights exact in float32, as the served models
    assert all(torch.equal(t, t.float().double()) for t in state.values())
    assert model.model.embed_tokens.weight.dtype == torch.float64


def test_the_served_models_are_unchanged_without_the_switch():
    assert served.served_target() == "target"
    assert "target-deep" not in served.MODELS     # an export writes what it wrote before
    target = served.build("target")
    assert len(target.layers) == served.TARGET_CONFIG.num_hidden_layers == 2
    assert served.build("target") is target
    again = random_model(served.TARGET_CONFIG, seed=served.TARGET_SEED, dtype=torch.float32,
                         std=served.PROJECTION_STD).to(torch.float64)
    assert all(torch.equal(t, target.state_dict()[k]) for k, t in again.state_dict().items())
    with pytest.raises(ValueError, match="no variant of the served target"):
        served.use_target("target-deeper")
    with pytest.raises(ValueError, match="unknown served model"):
        served.build("target-deeper")


def test_the_switch_serves_the_variant_and_gives_the_target_back(deep):
    assert served.served_target() == "target-deep"
    assert deep is served.build("target-deep") and len(deep.layers) == 4
    # the early exit is the served target's first layer
    exit_ = served.build("draft-early-exit")
    assert torch.equal(exit_.layers[0].mlp.down_proj.weight, deep.layers[0].mlp.down_proj.weight)
    # the oracle answers for the served target: its greedy output is the deep target's
    prompt = [3, 1, 4, 1, 5]
    ids, seq = [], list(prompt)
    for _ in range(6):
        ids.append(int(served.forward([seq], "target-deep")[0, -1].argmax()))
        seq.append(ids[-1])
    assert oracle.served_greedy(prompt, 6) == ids
    serve_target(openvino.METHODS["draft-early-exit"])
    assert served.served_target() == "target" and len(served.build("target").layers) == 2
    assert oracle.served_greedy(prompt, 6) != ids      # nothing cached from the other target


def test_the_export_of_the_variant_loads_as_the_served_target(deep, tmp_path):
    paths = export.export(tmp_path / "export")
    config = json.loads((paths["target"] / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    export.check_export("target", paths["target"])
    # the baseline loads the same folder: the engines load this target on both sides
    assert served.build("target").state_dict().keys() == served.build(
        "target-deep").state_dict().keys()


def test_the_deep_head_reads_three_distinct_layer_outputs_and_its_export_loads(deep, tmp_path):
    drafter = DEEP.drafter
    assert isinstance(drafter, HeadDraft) and drafter.target == "target-deep"
    assert drafter.qk_norm is False and drafter.replays is False
    assert openvino.openvino_layers(drafter.hidden) == (0, 1, 2)
    assert openvino.METHODS["eagle3-deep-no-prefix-caching"].drafter == drafter
    assert openvino.METHODS["eagle3-deep-no-prefix-caching"].scheduler == {
        "enable_prefix_caching": False}
    head = heads.served_head(drafter)
    assert head.qk_norm is False and head.target_config == served.DEEP_CONFIG
    # EAGLE-3's embedding is the target's
    assert torch.equal(head.embed_tokens.weight, deep.model.embed_tokens.weight)
    folder = head_export.export(tmp_path, drafter)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    back = head_export.load_vllm(folder, deep)
    proposed = set()
    for context in ([1, 2, 3, 4, 5], [7, 9], [31, 30, 2, 2, 17, 4, 4, 9]):
        p = heads.greedy_proposals(back, deep, context, 4)
        assert p == heads.greedy_proposals(head, deep, context, 4) == drafter.greedy_round(
            context, 4)
        proposed.add(p)
    assert len(proposed) > 1


def test_the_head_is_made_for_its_own_target_whatever_is_served():
    """A HeadDraft names its target: its head and rounds do not follow the switch."""
    served.use_target("target")
    head = heads.served_head(DEEP.drafter)
    assert head.target_config.num_hidden_layers == 4
    with pytest.raises(ValueError, match="variant of the served target"):
        HeadDraft("eagle3", "x", DEEP.drafter.hidden, qk_norm=False, target="target-deeper")
    with pytest.raises(ValueError, match="variant of the served target"):
        HeadDraft("eagle3", "x", DEEP.drafter.hidden, qk_norm=False, target="target-deep",
                  trained_only=True)
    # the served heads' export and a recipe without an export leave it out (its run exports
    # its own target)
    assert openvino.SERVED_HEADS == ("head-eagle3-llama",)
    assert "head-eagle3-llama-deep" in openvino.HEADS


def test_the_tree_method_sets_the_tree_in_each_greedy_request():
    """eagle3-deep-tree: the same head, tree_depth and branching_factor in the worker's session
    and in each request's GenerationConfig (the engine refuses them with sampling)."""
    tree = openvino.METHODS["eagle3-deep-tree"]
    assert tree.drafter == DEEP.drafter and tree.tree == openvino.TREE == (3, 2)
    assert DEEP.tree == () and tree.scheduler is None
    line = openvino.command(None, "/x", tree, 8000)
    session = json.loads(line.argv[line.argv.index("--config") + 1])
    assert session["tree"] == [3, 2] and session["k"] == tree.k
    assert json.loads(openvino.command(None, "/x", DEEP, 8000).argv[-1])["tree"] == []
