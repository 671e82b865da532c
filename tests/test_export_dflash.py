"""properties/export/dflash.py: the served DFlash head written as both engines read a DFlash
drafter (config.json with architectures ["DFlashDraftModel"] and dflash_config, safetensors
under the reference's names), read back into the same head, and -- where llama.cpp's source is
built here -- converted by the vendored converter, its GGUF read back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from properties.engines import EngineMissing, llamacpp, vllm
from properties.export import dflash, heads, kit
from properties.models import heads as served_heads
from properties.models import dflash as served_dflash
from properties.models import served
from reference.checkpoint import _safetensors
from reference.heads.random import random_head
from tests.heads_by_hand import small_target

CONTEXTS = [[1, 2, 3, 4, 5], [7, 9], [0] * 10, [31, 30, 2, 2, 17, 4, 4, 9]]


def dflash_methods():
    return [m for engine in (llamacpp, vllm) for m in engine.METHODS.values()
            if getattr(m.drafter, "kind", None) == "dflash"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_method(tmp_path_factory, "dflash")


def export_method(tmp_path_factory, name):
    """(the export root, llama.cpp's method `name`'s drafter, the head's folder)."""
    root = tmp_path_factory.mktemp(name)
    drafter = llamacpp.METHODS[name].drafter
    return root, drafter, heads.export(root, drafter)


def test_the_config_holds_what_both_engines_read(exported):
    _, drafter, path = exported
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"target_layer_ids": [0], "mask_token_id": 31,
                                       "block_size": 5}
    assert config["num_hidden_layers"] == 1 and config["num_target_layers"] == 2
    assert config["block_size"] == served_dflash.BLOCK == llamacpp.METHODS["dflash"].k + 1
    assert config["vocab_size"] == served.VOCAB and config["tie_word_embeddings"] is False
    state = _safetensors().load_file(str(path / "model.safetensors"))
    H = served.TARGET_CONFIG.hidden_size
    assert state["fc.weight"].shape == (H, H) and "hidden_norm.weight" in state
    assert state["lm_head.weight"].shape == (served.VOCAB, H)
    # no embedding: both engines take the target's (llama.cpp would tie an embedding it finds
    # into the lm_head when the folder had no lm_head)
    assert not [name for name in state if "embed" in name]
    assert "layers.0.self_attn.q_norm.weight" in state
    assert all(t.dtype == torch.float32 for t in state.values())
    # every engine's dflash method drafts k = block_size - 1 tokens a round
    assert all(m.k == served_dflash.K for m in dflash_methods())


def test_the_folder_read_back_is_the_served_head(exported):
    head, back = read_back(exported)
    assert (back.hidden, back.block_size, back.mask_token_id, back.own_lm_head) == (
        head.hidden, head.block_size, head.mask_token_id, True)


def read_back(exported):
    """(the served head, the folder read back): checked to give the same logits and greedy
    proposals on CONTEXTS."""
    _, drafter, path = exported
    target = served.build("target")
    head = served_heads.served_head(drafter)
    back = heads.load_vllm(path, target)
    for context in CONTEXTS:
        features = served_heads._features(head, target, context[:-1])[None]
        newest = torch.tensor([context[-1]])
        assert torch.equal(back(features, newest), head(features, newest))
        assert served_heads.greedy_proposals(back, target, context, 4) == \
            served_heads.greedy_proposals(head, target, context, 4)
    return head, back


def test_the_served_head_is_accepted_at_times():
    """A fully random head is accepted too rarely to show anything; the fitted lm_head is
    accepted in a fair share of greedy rounds of seeded random prompts."""
    accepted, drafted = greedy_acceptance(llamacpp.METHODS["dflash"].drafter)
    assert drafted == 20 * 7 * 4
    assert accepted / drafted > 0.05, (accepted, drafted)


def greedy_acceptance(drafter):
    """(accepted, drafted) of `drafter`'s greedy rounds of k = 4 over 20 seeded random prompts,
    7 rounds each, against the served target's greedy continuation."""
    from properties import oracle
    generator = torch.Generator().manual_seed(1)
    drafted = accepted = 0
    for _ in range(20):
        prompt = torch.randint(0, served.VOCAB, (4,), generator=generator).tolist()
        greedy = oracle.served_greedy(prompt, 12)
        for n in range(1, 8):
            proposals = drafter.greedy_round(tuple(prompt) + tuple(greedy[:n]), 4)
            drafted += len(proposals)
            accepted += next((i for i, t in enumerate(proposals) if t != greedy[n + i]),
                             len(proposals))
    return accepted, drafted


def _llamacpp_source():
    try:
        return llamacpp.find().source
    except EngineMissing as missing:
        pytest.skip(f"llama.cpp is not built here: {missing}")


def test_llamacpps_converter_reads_it(exported, tmp_path):
    """The vendored converter (conversion/qwen.py DFlashModel) converts the folder with the
    target beside it; the GGUF holds the dflash architecture, target_layers = id + 1, the
    block size, the mask token and the head's own tensors (lm_head as `output`)."""
    fields, tensors, state = convert(exported, tmp_path / "head-dflash.gguf")
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.target_layers"] == [1]          # output of 0 = input of 1
    assert fields["dflash.block_size"] == 5
    assert fields["tokenizer.ggml.mask_token_id"] == 31
    assert "dflash.attention.causal" not in fields         # non-causal, the driver's default
    assert {"fc.weight", "enc.output_norm.weight", "output.weight",
            "output_norm.weight"} <= set(tensors)
    assert "token_embd.weight" not in tensors
    for gguf_name, name in (("fc.weight", "fc.weight"), ("output.weight", "lm_head.weight"),
                            ("blk.0.attn_k.weight", "layers.0.self_attn.k_proj.weight")):
        stored = torch.from_numpy(tensors[gguf_name].data.copy()).reshape(state[name].shape)
        assert torch.equal(stored, state[name]), gguf_name


def convert(exported, out):
    """Convert the exported head with the vendored converter, the target beside it; -> (the
    GGUF's fields, its tensors by name, the folder's tensors)."""
    source = _llamacpp_source()
    root, _, path = exported
    kit.export_model("target", root / "target")
    driver = Path(llamacpp.__file__).with_name("gguf_convert.py")
    done = subprocess.run([sys.executable, str(driver), str(source), str(path), str(out),
                           str(root / "target")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    sys.path.insert(0, str(Path(source) / "gguf-py"))
    try:
        import gguf
        reader = gguf.GGUFReader(str(out))
    finally:
        sys.path.remove(str(Path(source) / "gguf-py"))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    return (fields, {t.name: t for t in reader.tensors},
            _safetensors().load_file(str(path / "model.safetensors")))


def test_bad_input_is_refused_by_name(tmp_path):
    target = small_target()
    with pytest.raises(TypeError, match="config_of takes a DFlashHead, got Eagle3Head"):
        dflash.config_of(random_head("eagle3", target))
    head = random_head("dflash", target, seed=2)
    path = dflash.write_dflash(head, tmp_path / "ok")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"architectures": ["X"]}))
    with pytest.raises(ValueError, match=r"architectures=\['X'\], not \['DFlashDraftModel'\]"):
        dflash.load_dflash(path, target)
    config["dflash_config"].pop("mask_token_id")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"dflash_config lacks \['mask_token_id'\]"):
        dflash.load_dflash(path, target)
    with pytest.raises(ValueError, match="made for a target of 4 layers, not this one's 2"):
        dflash.load_dflash(dflash.write_dflash(head, tmp_path / "deep"), served.build("target"))
    with pytest.raises(ValueError, match="must name its hidden states"):
        from properties.methods import HeadDraft
        served_dflash.served_dflash(HeadDraft("dflash", "head-x"), 1)


def test_both_engines_start_the_same_head_as_dflash():
    """llama.cpp: -md with the converted head and --spec-type draft-dflash, k proposals every
    round (without -md the type is accepted and ignored:
    tests/findings/llamacpp_spec_type_ignored_without_draft/); vLLM: method "dflash" on the
    same export folder."""
    method = llamacpp.METHODS["dflash"]
    argv = [str(a) for a in llamacpp.spec_options(method, "/export/gguf")]
    assert argv[:4] == ["-md", "/export/gguf/head-dflash.gguf", "--spec-type", "draft-dflash"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0"
    assert vllm.speculative_config("/export", vllm.METHODS["dflash"]) == {
        "method": "dflash", "model": "/export/head-dflash", "num_speculative_tokens": 4}
    assert vllm.METHODS["dflash"].drafter == method.drafter and method.drafter.replays
    assert method.drafter.hidden.layers == (0,) and method.drafter.hidden.where == "output"
