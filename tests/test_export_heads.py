"""properties/export/heads.py: the heads of the engines' head methods (vLLM's EAGLE-3 and
Medusa, llama.cpp's EAGLE-3 with a Llama layer) written in the Hugging Face layout vLLM loads
and llama.cpp's converter reads. The folder read back (config.json + model.safetensors, pure
torch) is the reference head, and it drafts what the reference proposer drafts in whole
speculative runs on the served target; the config says what the loaders read (architectures,
aux layer ids, draft_vocab_size, Medusa's bias flag)."""

import json

import pytest
import torch

import reference.speculative as speculative
from properties.engines import llamacpp
from properties.engines.vllm import METHODS
from properties.export import heads
from properties.models import heads as served_heads
from properties.methods import HeadDraft
from properties.models import served
from reference.checkpoint import _safetensors
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.hidden import HiddenStates
from tests.heads_by_hand import small_target

# the served head methods of each engine, "engine:method" (the trained head has its own test)
HEAD_METHODS = {f"{engine}:{name}": m
                for engine, methods in (("vllm", METHODS), ("llamacpp", llamacpp.METHODS))
                for name, m in methods.items()
                if isinstance(m.drafter, HeadDraft) and not m.drafter.trained_only}
SERVED = sorted(HEAD_METHODS)
PROMPTS = [[1, 2, 3, 4, 5], [7, 9], [0] * 10, [31, 30, 2, 2, 17, 4, 4, 9]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {name: heads.export(root, HEAD_METHODS[name].drafter) for name in SERVED}


def test_the_engines_declare_head_methods():
    assert {"vllm:eagle3", "vllm:medusa", "llamacpp:eagle3"} <= set(SERVED)


@pytest.mark.parametrize("name", SERVED)
def test_the_folder_read_back_drafts_as_the_reference_proposer(exported, name, monkeypatch):
    """Every round of greedy runs of the reference engine with the served head: the head read
    back from vLLM's folder proposes what the reference proposer proposed (greedy_proposals
    is the kit's account of a round, which the engine's counters are compared with)."""
    target = served.build("target")
    head = served_heads.served_head(HEAD_METHODS[name].drafter)
    back = heads.load_vllm(exported[name], target)
    assert back.hidden == head.hidden == HEAD_METHODS[name].drafter.hidden
    assert getattr(back, "qk_norm", True) == HEAD_METHODS[name].drafter.qk_norm
    log = []

    def recording(*args):
        proposer = head_proposer(*args)
        propose = proposer.propose

        def logged(context, k):
            proposals, q = propose(context, k)
            log.append((list(context), proposals))
            return proposals, q
        proposer.propose = logged
        return proposer
    monkeypatch.setattr(speculative, "head_proposer", recording)
    for prompt in PROMPTS:
        speculative.speculative_generate(target, head, prompt, 10, k=4)
    rounds = [(c, p) for c, p in log if p]
    assert len(rounds) >= 2 * len(PROMPTS)
    for context, proposals in rounds:
        assert served_heads.greedy_proposals(back, target, context, len(proposals)) == tuple(proposals)
    # a head that drafts from the context, not one token whatever it reads
    assert len({tuple(p) for _, p in rounds}) > len(PROMPTS)


def test_the_config_holds_what_the_loaders_read(exported):
    eagle3 = json.loads((exported["vllm:eagle3"] / "config.json").read_text())
    assert eagle3["architectures"] == ["Eagle3Qwen3ForCausalLM"]
    assert eagle3["num_hidden_layers"] == 1 and eagle3["tie_word_embeddings"] is False
    assert eagle3["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert eagle3["target_hidden_size"] == served.TARGET_CONFIG.hidden_size
    state = _safetensors().load_file(str(exported["vllm:eagle3"] / "model.safetensors"))
    H = served.TARGET_CONFIG.hidden_size
    assert state["fc.weight"].shape == (H, 3 * H)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H   # [embedding, hidden]
    assert torch.equal(state["embed_tokens.weight"].double(),
                       served.build("target").model.embed_tokens.weight)
    # llama.cpp's converter takes a head for EAGLE-3 by draft_vocab_size and one layer, and
    # computes a Llama layer: no q/k norm weights may be in the folder
    llama = json.loads((exported["llamacpp:eagle3"] / "config.json").read_text())
    assert llama["architectures"] == ["LlamaForCausalLMEagle3"]
    assert llama["draft_vocab_size"] == llama["vocab_size"] and llama["num_hidden_layers"] == 1
    assert llama["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    state = _safetensors().load_file(str(exported["llamacpp:eagle3"] / "model.safetensors"))
    assert not [n for n in state if "q_norm" in n or "k_norm" in n] and "fc.weight" in state
    medusa = json.loads((exported["vllm:medusa"] / "config.json").read_text())
    assert medusa["model_type"] == "medusa" and medusa["medusa_fc_bias"] is True
    assert medusa["num_heads"] == served_heads.MEDUSA_HEADS == METHODS["medusa"].k
    state = _safetensors().load_file(str(exported["vllm:medusa"] / "model.safetensors"))
    assert "blocks.3.layers.0.bias" in state and "lm_heads.3.weight" in state
    assert all(t.dtype == torch.float32 for t in state.values())


def test_a_draft_vocabulary_is_stored_as_vllms_offsets(tmp_path):
    target = small_target()
    draft_vocab = list(range(63, 0, -2)) + [2, 4]
    head = random_head("eagle3", target, seed=4, draft_vocab=draft_vocab)
    path = heads.write_vllm(head, tmp_path / "d2t")
    state = _safetensors().load_file(str(path / "model.safetensors"))
    # vLLM's compute_logits places draft id i at i + d2t[i]
    assert (state["d2t"] + torch.arange(len(draft_vocab))).tolist() == draft_vocab
    assert json.loads((path / "config.json").read_text())["draft_vocab_size"] == len(draft_vocab)
    back = heads.load_vllm(path, target)
    head32 = head.to(torch.float32).to(torch.float64)   # what the float32 file holds
    for context in ([1, 2, 3, 4, 5, 6], [40, 40, 7, 40, 40]):
        proposals = served_heads.greedy_proposals(back, target, context, 3)
        assert proposals == served_heads.greedy_proposals(head32, target, context, 3)
        assert set(proposals) <= set(draft_vocab)


def test_the_trained_head_exports_for_models_trained(tmp_path):
    drafter = METHODS["eagle3-trained"].drafter
    path = heads.export(tmp_path, drafter, "trained")
    config = json.loads((path / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == list(drafter.hidden.layers) == [1, 3, 5]
    assert config["head_dim"] in (32, 64)   # a head size vLLM's CPU attention takes


def test_bad_input_is_refused_by_name(tmp_path):
    target = small_target()
    with pytest.raises(TypeError, match="write_vllm takes an Eagle3Head or MedusaHeads"):
        heads.write_vllm(random_head("eagle", target), tmp_path / "eagle")
    normed = random_head("eagle3", target, hidden=HiddenStates((1, 2, 3), "output", True))
    with pytest.raises(ValueError, match="un-normed inputs of target layers"):
        heads.write_vllm(normed, tmp_path / "normed")
    with pytest.raises(ValueError, match="no served head of kind 'eagle'"):
        served_heads.served_head(HeadDraft("eagle", "head-eagle"))
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        served_heads.greedy_proposals(served_heads.served_head(METHODS["eagle3"].drafter),
                               served.build("target"), [1, 2], -1)
    with pytest.raises(ValueError, match="trained eagle3 head reads the input of layers 1, 3, 5, "
                                         "not the input of layers 0, 1, 2"):
        heads.export(tmp_path, METHODS["eagle3"].drafter, "trained")


@pytest.mark.parametrize("name", SERVED)
def test_the_exact_replays_take_the_round_start_from_the_head(name):
    """A HeadDraft answers the replays itself: acceptance.greedy's rounds are its
    greedy_round from each round's context, and the sampled law of a round of argmax proposals
    walks the head's own chain (proposal j + 1 after proposals 1 .. j of the same round, with
    the features ending at the round's start), as computed here by hand."""
    from properties import acceptance, acceptance_sampled, methods, oracle
    from reference.sampling import SamplingParams
    drafter = HEAD_METHODS[name].drafter
    assert methods.exact_draft(drafter) is drafter
    assert methods.exact_draft(METHODS["draft-early-exit"].drafter) == "draft-early-exit"
    sampling = SamplingParams(temperature=1.0)
    for prompt in PROMPTS:
        greedy = oracle.served_greedy(prompt, 16 + 5)
        rounds, committed, drafted, accepted = 0, 1, 0, 0
        while committed < 16:            # the "full" schedule: k every round
            proposals = drafter.greedy_round(tuple(prompt) + tuple(greedy[:committed]), 4)
            a = next((i for i, t in enumerate(proposals) if t != greedy[committed + i]), 4)
            rounds, drafted, accepted = rounds + 1, drafted + 4, accepted + a
            committed += a + 1
        assert acceptance.greedy(prompt, 16, drafter, 4, "full") == acceptance.Expected(
            rounds, drafted, accepted)
        context = tuple(prompt) + (greedy[0],)
        law = acceptance_sampled.round_laws([context], 4, drafter, sampling, "greedy")[0]
        chain, reach, mass = drafter.greedy_round(context, 4), [], 1.0
        for j, token in enumerate(chain):
            p = sampling.probs(oracle.served_next_logits([context + chain[:j]])[0])
            mass *= float(p[token])
            reach.append(mass)
        assert law.reach == pytest.approx(reach, rel=1e-9, abs=1e-15)


def test_the_export_command_writes_the_declared_heads(tmp_path):
    """`python -m properties.serve export DIR` writes every served head a method declares, so
    the recipes' head command lines (--speculative-config model DIR/head-...) find them."""
    written = heads.export_declared(tmp_path)
    assert set(written) == {HEAD_METHODS[name].drafter.head for name in SERVED}
    for path in written.values():
        assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def test_the_trained_check_replays_the_trained_head():
    """properties/serve/trained.py replays a head method's rounds with the float64 trained
    head (a draft model's replay would be no replay of it): each round's proposals start from
    the request's prompt and the committed path, as walked here by hand ("full" schedule)."""
    from properties.serve import trained as check
    head = heads.trained_head(METHODS["eagle3-trained"].drafter)
    ref = check.pair(None)
    prompt = check.prompts(1)[0]
    tokens = ref.greedy(ref.target, prompt, 12)[0]
    replayed = check.replay(ref, prompt, tokens, 12, 4, "full", head=head).expected
    path = tokens + ref.greedy(ref.target, prompt + tuple(tokens), 5)[0]
    committed, drafted, accepted = 1, 0, 0
    while committed < 12:
        proposals = served_heads.greedy_proposals(head, ref.target, list(prompt) + path[:committed], 4)
        a = next((i for i, t in enumerate(proposals) if t != path[committed + i]), 4)
        drafted, accepted, committed = drafted + 4, accepted + a, committed + a + 1
    assert (replayed.drafted, replayed.accepted) == (drafted, accepted)
    assert accepted > 0      # the trained head agrees with its target at times
