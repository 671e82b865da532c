"""OpenVINO GenAI's EAGLE-3 path (properties/engines/openvino.py): the methods as declared, the
hidden_layers_list the kit derives from a head's convention (an id names a layer's output),
the staged head optimum-cli converts (d2t and t2d written, the target's tokenizer beside it),
the trained head in a Llama layer (properties/export/heads.py llama_layer), and, with the
engine installed (extra), the converted IR's logits against the reference head's."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from properties.engines import openvino
from properties.export import heads, trained
from properties.methods import HeadDraft
from reference.checkpoint import _safetensors
from reference.hidden import HiddenStates

TRAINED = openvino.METHODS["eagle3-trained"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The trained target and the trained head in a Llama layer, as a run exports them."""
    root = tmp_path_factory.mktemp("ov-eagle3") / "export"
    trained.export(root, TRAINED, "trained")
    heads.export(root, TRAINED.drafter, "trained")
    return root


def test_layer_ids_name_layer_outputs():
    assert openvino.openvino_layers(HiddenStates((1, 3, 5), "input")) == (0, 2, 4)
    assert openvino.openvino_layers(HiddenStates((0, 2, 4), "output")) == (0, 2, 4)
    # the embeddings (the input of layer 0) have no id: -1, which the engine does not find
    assert openvino.openvino_layers(HiddenStates((0, 1, 2), "input")) == (-1, 0, 1)
    with pytest.raises(ValueError, match="normed=False"):
        openvino.openvino_layers(HiddenStates((1,), "output", normed=True))
    with pytest.raises(ValueError, match="hidden=None"):
        openvino.openvino_layers(None)


def test_the_methods_as_declared():
    kit, made = openvino.METHODS["eagle3"], TRAINED
    for method in (kit, made):
        assert isinstance(method.drafter, HeadDraft)
        assert method.drafter.kind == "eagle3" and method.drafter.qk_norm is False
        # the engine's counts were not all equal to the exact replay (finding 5)
        assert method.drafter.replays is False
    # the kit's 2-layer target: refused, in the engine's words, and said not to be a GPU matter
    assert "Number of extracted hidden states does not match the requested number" in kit.refused
    assert "Not a GPU matter" in kit.refused
    assert kit.drafter.trained_only is False and made.drafter.trained_only is True
    assert made.refused is None
    # the trained head's own convention, which OpenVINO reads as [0, 2, 4]
    config = json.loads((Path(trained.pair_of("trained").path) / "eagle3" / "config.json")
                        .read_text())
    assert made.drafter.hidden == HiddenStates(tuple(config["hidden"]["layers"]),
                                               config["hidden"]["where"])
    assert openvino.openvino_layers(made.drafter.hidden) == (0, 2, 4)
    assert set(openvino.HEADS) == {"head-eagle3-llama", "head-eagle3-llama-trained",
                                   "head-eagle3-llama-trained-large", "head-eagle3-llama-deep"}
    large = json.loads((Path(trained.pair_of("trained-large").path) / "eagle3" / "config.json")
                       .read_text())
    assert (openvino.METHODS["eagle3-trained-large"].drafter.hidden
            == HiddenStates(tuple(large["hidden"]["layers"]), large["hidden"]["where"]))
    assert openvino.openvino_layers(openvino.EAGLE3_TRAINED_LARGE_HIDDEN) == (0, 3, 6)
    assert openvino.SERVED_HEADS == ("head-eagle3-llama",)
    # no other engine's head method names the same folder with another head
    from properties import engines
    for name in engines.available():
        for m in engines.get(name).methods.values():
            if isinstance(m.drafter, HeadDraft) and m.drafter.head in openvino.HEADS:
                ours = openvino.head_of(m.drafter.head)
                assert ((m.drafter.kind, m.drafter.hidden, m.drafter.qk_norm)
                        == (ours.kind, ours.hidden, ours.qk_norm)), (name, m.name)


def test_the_trained_head_in_a_llama_layer_is_the_trained_weights_without_qk_norm():
    pair = trained.pair_of("trained", torch.float64)
    qwen = pair.head("eagle3").to(torch.float64)
    llama = heads.trained_head(TRAINED.drafter, "trained")
    assert qwen.qk_norm is True and llama.qk_norm is False and llama.hidden == qwen.hidden
    kept = {k: v for k, v in qwen.state_dict().items() if "q_norm" not in k and "k_norm" not in k}
    assert set(llama.state_dict()) == set(kept)
    assert all(torch.equal(llama.state_dict()[k], v) for k, v in kept.items())
    # a drafter with q/k norm still gets the trained head itself
    assert heads.trained_head(HeadDraft("eagle3", "x", qwen.hidden), "trained").qk_norm is True
    with pytest.raises(TypeError, match="Eagle3Head"):
        heads.llama_layer(torch.nn.Linear(2, 2))


def test_the_export_is_a_llama_head_read_back_as_the_reference(exported):
    folder = exported / TRAINED.drafter.head
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    pair = trained.pair_of("trained", torch.float64)
    back = heads.load_vllm(folder, pair.target)
    ref = heads.trained_head(TRAINED.drafter, "trained")
    assert back.qk_norm is False
    from properties.models.heads import greedy_proposals
    for prompt in pair.prompts()[:2]:
        for cut in (4, 9, 15):
            context = prompt[:cut]
            assert (greedy_proposals(back, pair.target, context, 4)
                    == greedy_proposals(ref, pair.target, context, 4))


def test_the_staged_head_holds_d2t_t2d_and_the_targets_tokenizer(exported, tmp_path):
    folder = exported / TRAINED.drafter.head
    out = tmp_path / "staged"
    openvino.stage(folder, out, exported / "target")
    staged = _safetensors().load_file(str(out / "model.safetensors"))
    original = _safetensors().load_file(str(folder / "model.safetensors"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    # the identity map over the whole vocabulary (EAGLE-3's d2t stores target id - draft id)
    assert torch.equal(staged.pop("d2t"), torch.zeros(vocab, dtype=torch.int64))
    assert torch.equal(staged.pop("t2d"), torch.ones(vocab, dtype=torch.bool))
    assert set(staged) == set(original)
    assert all(torch.equal(staged[k], original[k]) for k in original)
    for name in ("config.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).exists(), name
    # the trained tokenizer already has an added token: staged as it is
    from tokenizers import Tokenizer
    a, b = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (out, exported / "target"))
    assert a.get_vocab(with_added_tokens=True) == b.get_vocab(with_added_tokens=True)


def test_a_head_that_is_not_a_llama_eagle3_is_refused_at_staging(tmp_path):
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text(json.dumps(
        {"architectures": ["Eagle3Qwen3ForCausalLM"]}))
    with pytest.raises(SystemExit, match="LlamaForCausalLMEagle3"):
        openvino.stage_head(tmp_path / "head", tmp_path / "out")


def test_the_prepare_steps_of_a_head(exported):
    steps = openvino.prepare_commands(None, exported)
    names = openvino.models_of(exported)
    assert names == ("target", TRAINED.drafter.head)
    argv = [[str(a) for a in step.argv] for _, step in steps]
    assert len(steps) == 2 + 3      # the target's stage and convert; the head's three
    stage, convert, layers = argv[2:]
    assert stage[-2:] == ["--tokenizer-from", str(exported / "target")]
    assert "--trust-remote-code" in convert and convert[-1].endswith("openvino/" +
                                                                      TRAINED.drafter.head)
    assert layers[1] == "-c" and layers[-1] == "0 2 4"
    # a recipe without an export lists the kit's served head, whose ids the engine refuses
    recipe = [[str(a) for a in step.argv] for _, step in
              openvino.prepare_commands(None, Path("/nonexistent"))]
    kit = openvino.METHODS["eagle3"].drafter
    assert recipe[-1][-1] == " ".join(map(str, openvino.openvino_layers(kit.hidden)))
    assert recipe[-1][-1].startswith("-1 ")     # the embeddings: no id the engine finds


def test_the_staging_command_line():
    assert openvino.main(["stage", "a"]) == 2
    assert openvino.main(["stage", "a", "b", "--tokenizer-from"]) == 2


# the converted head run alone on the engine: its logits for pairs (t_{j+1}, features_j)
RUN_IR = """
import sys, numpy as np, openvino as ov
folder, data = sys.argv[1], np.load(sys.argv[2])
model = ov.Core().compile_model(folder + "/openvino_model.xml", "CPU",
                                {"INFERENCE_PRECISION_HINT": "f32"})
ids = data["ids"]
request = model.create_infer_request()
request.infer({"input_ids": ids, "hidden_states": data["features"],
               "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None],
               "beam_idx": np.zeros(1, dtype=np.int32)})
np.save(sys.argv[3], request.get_tensor("logits").data)
"""


@pytest.mark.extra
def test_the_converted_head_computes_the_reference_heads_logits(exported, tmp_path):
    """The kit's prepare steps for the trained Llama-layer head (staged, optimum-cli with
    --trust-remote-code, hidden_layers_list written), then the IR run alone on the engine: its
    logits for the target's features of a held-out prompt equal the reference head's within
    float32 error, and its rt_info holds eagle3_mode and the list. About 40 s."""
    import numpy as np
    try:
        env = openvino.find()
    except Exception as exc:
        pytest.skip(str(exc))
    for what, step in openvino.model_commands(env, exported, TRAINED.drafter.head):
        done = subprocess.run([str(a) for a in step.argv], capture_output=True, text=True,
                              env={**os.environ, **step.env})
        assert done.returncode == 0, (what, done.stderr[-2000:])
    folder = openvino.converted(exported) / TRAINED.drafter.head
    pair = trained.pair_of("trained", torch.float64)
    head = heads.trained_head(TRAINED.drafter, "trained")
    from reference.cache import KVCache
    prompt = torch.tensor([pair.prompts()[0][:12]])
    c = pair.target.config
    cache = KVCache(c.num_hidden_layers, 1, c.num_key_value_heads, c.head_dim, 12,
                    torch.float64, "cpu")
    _, features = pair.target.forward_hidden(prompt, cache, head.hidden)
    tokens, features = prompt[:, 1:], features[:, :-1]
    own = head.new_cache(16)
    logits, _ = head(tokens, head.start(features), own)
    np.savez(tmp_path / "in.npz", ids=tokens.numpy().astype(np.int64),
             features=features.numpy().astype(np.float32))
    done = subprocess.run([str(env.python), "-c", RUN_IR, str(folder), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npy")], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    served = torch.from_numpy(np.load(tmp_path / "out.npy")).double()
    assert served.shape == logits.shape
    assert (served - logits).abs().max().item() < 1e-3
    assert torch.equal(served.argmax(-1), logits.argmax(-1))
    xml = (folder / "openvino_model.xml").read_text()
    assert "eagle3_mode" in xml and 'hidden_layers_list value="0 2 4"' in xml
