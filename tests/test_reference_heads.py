"""The feature-level heads as reference proposers (reference/heads/): greedy output is the
target's own, every round's proposals are the head's math computed by hand from the target's
verified features, and bad input is refused by name. The sampled law and acceptance:
tests/test_reference_heads_law.py."""

import pytest
import torch

import reference.speculative as speculative
from reference.heads import Eagle3Head, EagleHead, MedusaHeads, MTPLayer
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.hidden import HiddenStates
from reference.model import Config, random_model
from reference.speculative import greedy_generate, speculative_generate
from tests import heads_by_hand as by_hand
from tests.heads_by_hand import small_target

PROMPTS = [[1, 2, 3, 4, 5, 6], [9], [40, 40, 7, 40, 40], [63, 0, 31, 32, 8, 8, 8, 20, 11]]
# every head kind, and the conventions that change what a head computes
HEADS = {
    "eagle": dict(kind="eagle"),
    "eagle-normed": dict(kind="eagle", hidden=HiddenStates((3,), normed=True)),
    "eagle3": dict(kind="eagle3"),
    "eagle3-d2t": dict(kind="eagle3", draft_vocab=list(range(63, 0, -2)) + [2, 4]),
    "eagle3-llama": dict(kind="eagle3", qk_norm=False),
    "medusa": dict(kind="medusa", num_heads=3),
    "mtp": dict(kind="mtp"),
    "mtp-mimo": dict(kind="mtp", order="hidden-first", recycle="normed",
                     hidden=HiddenStates((2,), "output")),
    # llama.cpp's draft-mtp: the normed last state, the normed output recycled, and a lead pair
    # (t_0 with a zero state) before pair 0
    "mtp-llamacpp": dict(kind="mtp", hidden=HiddenStates((3,), normed=True), recycle="normed",
                         lead=True),
}


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.fixture(scope="module")
def heads(target):
    return by_hand.random_heads(target, HEADS, first_seed=10)


@pytest.mark.parametrize("name", HEADS)
def test_greedy_output_is_the_targets_greedy(target, heads, name):
    _, head = heads[name]
    for prompt in PROMPTS:
        reference = greedy_generate(target, prompt, 20)
        for k in (1, 2, 5):
            tokens, stats = speculative_generate(target, head, prompt, 20, k=k)
            assert tokens == reference, (name, prompt, k)
            assert stats["rounds"] <= 20


def recorded_rounds(monkeypatch, log, make=head_proposer):
    """speculative_generate's head proposers, each round logged: (context, proposals, q, the
    features the proposer held)."""
    def recording(head, capacity, sampler, device):
        proposer = make(head, capacity, sampler, device)
        propose = proposer.propose

        def logged(context, k):
            proposals, q = propose(context, k)
            held = None if proposer.features is None else proposer.features.clone()
            log.append((list(context), proposals, q, held))
            return proposals, q
        proposer.propose = logged
        return proposer
    monkeypatch.setattr(speculative, "head_proposer", recording)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", HEADS)
def test_every_rounds_proposals_are_the_heads_math_by_hand(target, heads, name, temperature,
                                                           monkeypatch):
    """In every round of whole runs (accepting and rejecting): the proposer holds the target's
    features of every committed token but the newest, as the blocks computed one by one give
    them; its proposals are the argmax of the head's law computed by hand from those features
    (greedy), or drawn from q, which is that law on the target's vocabulary (sampling)."""
    kind, head = heads[name]
    log = []
    recorded_rounds(monkeypatch, log)
    generator = torch.Generator().manual_seed(5)
    for prompt in PROMPTS:
        speculative_generate(target, head, prompt, 12, k=3, temperature=temperature,
                             generator=generator)
    assert len(log) >= 4 * len(PROMPTS)
    drafted = 0
    for context, proposals, q, held in log:
        if len(context) == 1:
            assert held is None and proposals == []   # nothing verified yet: nothing to draft from
            continue
        features = by_hand.target_features(target, context[:-1], head.hidden)
        torch.testing.assert_close(held, features, rtol=0, atol=1e-12)
        # k = 3, fewer near the end (useful_k), and at most one per Medusa head
        assert 1 <= len(proposals) <= (min(3, head.num_heads) if kind == "medusa" else 3)
        laws = by_hand.laws(kind, head, target, features, context, proposals)
        if temperature == 0:
            assert proposals == [by_hand.greedy_proposal(head, law) for law in laws]
        else:
            for token, law, given in zip(proposals, laws, q):
                placed = by_hand.on_target_vocab(head, torch.softmax(law, -1))
                torch.testing.assert_close(given, placed, rtol=0, atol=1e-12)
                assert given[token] > 0
        drafted += len(proposals)
    assert drafted > 0


def test_a_one_token_prompt_drafts_from_the_second_round(target, heads, monkeypatch):
    log = []
    recorded_rounds(monkeypatch, log)
    _, head = heads["eagle"]
    tokens, _ = speculative_generate(target, head, [9], 6, k=2)
    assert tokens == greedy_generate(target, [9], 6)
    assert log[0][1] == [] and all(len(p) == 2 for _, p, _, _ in log[1:-1])


def test_a_draft_vocabulary_only_proposes_mapped_tokens(target, heads):
    _, head = heads["eagle3-d2t"]
    mapped = set(HEADS["eagle3-d2t"]["draft_vocab"])
    proposer = head_proposer(head, 32, speculative.Sampler(speculative.SamplingParams(1.0),
                                                            torch.Generator().manual_seed(0)),
                             torch.device("cpu"))
    ids = [1, 2, 3, 4]
    proposer.saw(target.forward_hidden(torch.tensor([ids[:-1]]), target.new_cache(1, 32),
                                       head.hidden)[1][0])
    proposer.prefill(torch.tensor(ids))
    proposals, q = proposer.propose(ids, 4)
    assert set(proposals) <= mapped
    for law in q:
        assert float(law.sum()) == pytest.approx(1, abs=1e-12)
        assert set(law.nonzero()[:, 0].tolist()) <= mapped


# --- bad input -----------------------------------------------------------------------------

def test_heads_refuse_bad_construction(target):
    two = HiddenStates((1, 2))
    with pytest.raises(ValueError, match="EagleHead reads one hidden state"):
        EagleHead(target, two)
    with pytest.raises(ValueError, match="MTPLayer reads one hidden state"):
        MTPLayer(target, two)
    with pytest.raises(ValueError, match="MedusaHeads read one hidden state"):
        MedusaHeads(target.config, 2, two)
    with pytest.raises(ValueError, match="num_heads must be an int >= 1, got 0"):
        MedusaHeads(target.config, 0)
    with pytest.raises(ValueError, match="order must be one of"):
        MTPLayer(target, order="sideways")
    with pytest.raises(ValueError, match="recycle must be one of"):
        MTPLayer(target, recycle="later")
    with pytest.raises(ValueError, match="lead must be a bool, got 'yes'"):
        MTPLayer(target, lead="yes")
    with pytest.raises(ValueError, match="mask0 must be a bool, got 1"):
        MTPLayer(target, mask0=1)
    with pytest.raises(ValueError, match="layer 9 is past the target's 4 layers"):
        EagleHead(target, HiddenStates((9,)))
    with pytest.raises(ValueError, match="kind must be one of"):
        random_head("hydra", target)
    with pytest.raises(ValueError, match="need a target of >= 3 layers"):
        Eagle3Head(random_model(Config(num_hidden_layers=2)).config)


@pytest.mark.parametrize("draft_vocab, message", [
    ([], "non-empty"), ([3, 3], "names a target token twice"), ([1, 64], "token id 64"),
    ([-1], "token id -1"), ([1.5], "non-empty 1-D sequence of target token ids")])
def test_a_bad_draft_vocabulary_is_refused(target, draft_vocab, message):
    with pytest.raises(ValueError, match=message):
        Eagle3Head(target.config, draft_vocab=draft_vocab)


def test_heads_refuse_inputs_of_the_wrong_shape(target, heads):
    _, eagle = heads["eagle"]
    _, eagle3 = heads["eagle3"]
    _, medusa = heads["medusa"]
    tokens = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"EagleHead: h must be \[batch, tokens, 32\]"):
        eagle(tokens, torch.zeros(1, 2, 96, dtype=torch.float64), eagle.new_cache(4))
    with pytest.raises(ValueError, match="must pair up one to one"):
        eagle(tokens, torch.zeros(1, 3, 32, dtype=torch.float64), eagle.new_cache(4))
    with pytest.raises(ValueError, match=r"features must end in 96 \(input of layers 1, 2, 3\)"):
        eagle3.start(torch.zeros(1, 2, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"MedusaHeads: features must be \[batch, tokens, 32\]"):
        medusa(torch.zeros(2, 32, dtype=torch.float64))


def test_speculative_generate_refuses_heads_where_they_cannot_draft(target, heads):
    _, head = heads["eagle"]
    with pytest.raises(ValueError, match="tree=True needs a model draft; a EagleHead drafts a chain"):
        speculative_generate(target, head, [1, 2], 4, tree=True)
    other = random_model(Config(vocab_size=32, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8), dtype=torch.float64)
    with pytest.raises(ValueError, match="share a vocabulary: draft vocab_size=32"):
        speculative_generate(target, random_head("eagle", other), [1, 2], 4)


def test_the_demo_drafts_with_each_head(capsys):
    """python -m reference speculate --draft KIND (random heads on the random tiny target)."""
    import json as json_
    from reference.__main__ import main
    for kind in ("eagle", "eagle3", "medusa", "mtp"):
        main(["speculate", "--draft", kind, "--max-new-tokens", "8"])
        line = json_.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert line["draft"] == f"{kind} head (random weights)"
        assert line["identical_to_target_greedy"] is True


def test_tree_generate_refuses_a_head(target, heads):
    from reference.speculative import tree_generate
    with pytest.raises(ValueError, match="tree_generate needs a model draft .* got a MedusaHeads"):
        tree_generate(target, heads["medusa"][1], [1, 2], 4)


def test_a_llama_layer_attends_without_a_q_k_norm(target):
    """EAGLE-3 with qk_norm=False (llama.cpp's eagle3 layer): softmax(rope(x Wq) rope(x Wk)^T /
    sqrt(D) + causal) (x Wv) Wo, computed here by hand, with no norm weights in the head; the
    same weights with Qwen3's per-head norm compute something else (the option takes effect)."""
    head = random_head("eagle3", target, seed=21, qk_norm=False)
    assert not [n for n, _ in head.named_parameters() if "q_norm" in n or "k_norm" in n]
    attn, c = head.midlayer.self_attn, head.config
    T, D, heads, kv = 7, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    x = torch.randn(1, T, 2 * c.hidden_size, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    got = by_hand._run(lambda x, cache, p, m: attn(x, cache, p, m), x, c, x.dtype)[0]

    def rope(v):           # [T, D] per head: pairs (i, i + D/2) turned by position * theta^(-2i/D)
        half = D // 2
        angle = torch.arange(T, dtype=torch.float64)[:, None] * c.rope_theta ** (
            -torch.arange(half, dtype=torch.float64) * 2 / D)
        a, b = v[:, :half], v[:, half:]
        return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)
    q = (x[0] @ attn.q_proj.weight.T).view(T, heads, D)
    k = (x[0] @ attn.k_proj.weight.T).view(T, kv, D)
    v = (x[0] @ attn.v_proj.weight.T).view(T, kv, D)
    out = []
    for i in range(heads):
        j = i // (heads // kv)
        scores = rope(q[:, i]) @ rope(k[:, j]).T / D ** 0.5
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out.append(scores.softmax(-1) @ v[:, j])
    want = torch.cat(out, -1) @ attn.o_proj.weight.T
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    qwen = random_head("eagle3", target, seed=21)
    qwen.load_state_dict(head.state_dict(), strict=False)   # the same weights, norms of 1
    other = by_hand._run(lambda x, cache, p, m: qwen.midlayer.self_attn(x, cache, p, m), x, c,
                         x.dtype)[0]
    assert not torch.allclose(other, got, atol=1e-3)


def test_a_llama_layer_head_survives_its_checkpoint(target, tmp_path):
    from reference.heads.checkpoint import load_head, save_head
    head = random_head("eagle3", target, seed=22, qk_norm=False)
    back = load_head(save_head(head, tmp_path / "llama"), target)
    assert back.qk_norm is False
    seq = [5, 6, 7, 8, 9]
    h = head.start(by_hand.target_features(target, seq, head.hidden)[None])
    seq = torch.tensor([seq])
    assert torch.equal(head(seq, h, head.new_cache(8))[0], back(seq, h, back.new_cache(8))[0])


def test_the_lead_pair_is_the_first_token_with_a_zero_state(target):
    """llama.cpp's MTP convention (lead=True): the first round's law is the layer run over the
    pairs (0, t_0), (f_0, t_1), ..., (f_{n-1}, t_n) at positions 0 .. n; hnorm of the zero
    state is exactly zero. Without the lead pair the law differs (the pair is attended)."""
    from reference.heads.replay import round_logits
    hidden = HiddenStates((3,), normed=True)
    lead = random_head("mtp", target, seed=21, hidden=hidden, recycle="normed", lead=True)
    plain = random_head("mtp", target, seed=21, hidden=hidden, recycle="normed")
    seq = [5, 9, 2, 33]
    features = by_hand.target_features(target, seq[:-1], hidden)
    assert torch.equal(lead.hnorm(torch.zeros(1, 32, dtype=torch.float64)),
                       torch.zeros(1, 32, dtype=torch.float64))
    e = lead.enorm(target.model.embed_tokens(torch.tensor([seq])))[0]          # [4, H]
    n = lead.hnorm(torch.cat([torch.zeros(1, 32, dtype=torch.float64), features]))
    out = by_hand._run(lead.mtp_block, lead.eh_proj(torch.cat([e, n], -1))[None], lead.config,
                       torch.float64)
    expected = target.lm_head(target.model.norm(out))[0, -1]
    got = round_logits(lead, features, seq, 3, 1)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(round_logits(plain, features, seq, 3, 1)[0], got, atol=1e-6)


def test_mask0_drops_the_embedding_of_the_pair_at_position_0(target):
    """vLLM's MTP convention (mask0=True): the pair at position 0, (f_0, t_1), enters with a zero
    embedding; every later pair as without the mask."""
    from reference.heads.replay import round_logits
    hidden = HiddenStates((3,), normed=True)
    masked = random_head("mtp", target, seed=22, hidden=hidden, mask0=True)
    seq = [5, 9, 2, 33]
    features = by_hand.target_features(target, seq[:-1], hidden)
    e = target.model.embed_tokens(torch.tensor([seq[1:]]))[0]                    # t_1 .. t_3
    e = torch.cat([torch.zeros_like(e[:1]), e[1:]])
    x = masked.eh_proj(torch.cat([masked.enorm(e), masked.hnorm(features)], -1))
    out = by_hand._run(masked.mtp_block, x[None], masked.config, torch.float64)
    expected = target.lm_head(target.model.norm(out))[0, -1]
    torch.testing.assert_close(round_logits(masked, features, seq, 3, 1)[0], expected, rtol=0,
                               atol=1e-12)
