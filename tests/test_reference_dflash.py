"""The DFlash reference drafter (reference/heads/dflash.py): its block forward against a
computation by hand, number by number, on a tiny case; every proposing round is one forward
giving all of its proposals; greedy output is the target's; the replay (reference/heads/replay.py,
what the kit's exact acceptance replays use) gives the proposer's own laws; the checkpoint round
trip; bad input refused by name."""

import math

import pytest
import torch

import reference.speculative as speculative
from properties import statistics
from properties.oracle import law_from
from reference.heads import DFlashHead, KINDS
from reference.heads.checkpoint import load_head, save_head
from reference.heads.dflash import DFlashProposer, default_hidden
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.heads.replay import round_logits
from reference.hidden import HiddenStates
from reference.model import Config, random_model
from reference.speculative import greedy_generate, speculative_generate
from tests.heads_by_hand import small_target, target_features

# a tiny target for the hand computation: two heads sharing one key/value head of width 2
TINY = Config(vocab_size=8, hidden_size=4, intermediate_size=6, num_hidden_layers=3,
              num_attention_heads=2, num_key_value_heads=1, head_dim=2)
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 7, 7, 7], [9, 3], [40, 41, 42, 40, 41, 42, 40]]


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.fixture(scope="module")
def head(target):
    return random_head("dflash", target, seed=31, hidden=HiddenStates((0, 2), "output"))


# --- by hand: scalars and loops, nothing of reference.model ----------------------------------

def _rms(x, w, eps):
    scale = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [wi * v * scale for wi, v in zip(w, x)]


def _matvec(W, x):   # W [out, in] as nested lists
    return [sum(w * v for w, v in zip(row, x)) for row in W]


def _rope(x, pos, theta):
    """Half-split rotary embedding of one head's vector at position pos."""
    d = len(x)
    out = list(x)
    for i in range(d // 2):
        angle = pos * theta ** (-2 * i / d)
        a, b = x[i], x[i + d // 2]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + d // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


def _split(v, count, d):
    return [v[h * d:(h + 1) * d] for h in range(count)]


def block_by_hand(head, target, features, newest):
    """The head's logits at the block rows it reads (DFlash: the masks), [B - 1][V] nested
    lists (DSpark: [B][V], before its Markov bias)."""
    c = head.config
    eps, theta, d = c.rms_norm_eps, c.rope_theta, c.head_dim
    nh, nkv = c.num_attention_heads, c.num_key_value_heads
    L = lambda t: t.detach().tolist()
    n, B = len(features), head.block_size
    ctx = [_rms(_matvec(L(head.fc.weight), f), L(head.hidden_norm.weight), eps)
           for f in features]
    emb = L(target.model.embed_tokens.weight)
    x = [list(emb[newest])] + [list(emb[head.mask_token_id]) for _ in range(B - 1)]
    for layer in head.layers:
        a = layer.self_attn
        keys, values = [], []     # per position: [nkv][d]
        for j, cj in enumerate(ctx):   # context: no input norm, keys and values only
            keys.append([_rope(_rms(k, L(a.k_norm.weight), eps), j, theta)
                         for k in _split(_matvec(L(a.k_proj.weight), cj), nkv, d)])
            values.append(_split(_matvec(L(a.v_proj.weight), cj), nkv, d))
        queries = []
        for i, xi in enumerate(x):
            h = _rms(xi, L(layer.input_layernorm.weight), eps)
            queries.append([_rope(_rms(q, L(a.q_norm.weight), eps), n + i, theta)
                            for q in _split(_matvec(L(a.q_proj.weight), h), nh, d)])
            keys.append([_rope(_rms(k, L(a.k_norm.weight), eps), n + i, theta)
                         for k in _split(_matvec(L(a.k_proj.weight), h), nkv, d)])
            values.append(_split(_matvec(L(a.v_proj.weight), h), nkv, d))
        new_x = []
        for i, xi in enumerate(x):
            y = []
            for hq in range(nh):
                g = hq // (nh // nkv)
                scores = [sum(qv * kv for qv, kv in zip(queries[i][hq], keys[s][g])) / math.sqrt(d)
                          for s in range(len(keys))]          # every position: no mask
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                y += [sum(w * values[s][g][e] for s, w in enumerate(weights)) / total
                      for e in range(d)]
            r = [u + v for u, v in zip(xi, _matvec(L(a.o_proj.weight), y))]
            m = _rms(r, L(layer.post_attention_layernorm.weight), eps)
            gate, up = _matvec(L(layer.mlp.gate_proj.weight), m), _matvec(L(layer.mlp.up_proj.weight), m)
            act = [gv / (1 + math.exp(-gv)) * uv for gv, uv in zip(gate, up)]
            new_x.append([u + v for u, v in zip(r, _matvec(L(layer.mlp.down_proj.weight), act))])
        x = new_x
    readout = L(head.readout().weight)
    return [_matvec(readout, _rms(xi, L(head.norm.weight), eps))
            for xi in x[head.first_row:]]     # DFlash the masks; DSpark every row


@pytest.mark.parametrize("own_lm_head,num_layers", [(False, 1), (True, 2)])
def test_the_block_forward_is_the_math_by_hand(own_lm_head, num_layers):
    tiny = random_model(TINY, seed=5, dtype=torch.float64)
    head = random_head("dflash", tiny, seed=6, hidden=HiddenStates((1, 0), "output"),
                       block_size=4, mask_token_id=3, num_layers=num_layers,
                       own_lm_head=own_lm_head)
    seq = [2, 6, 1, 5, 0]
    features = target_features(tiny, seq, head.hidden)        # the target's blocks one by one
    for n in (1, 3, 5):       # newest token at position n, features of 0 .. n - 1
        newest = seq[n] if n < len(seq) else 7
        got = head(features[:n][None], torch.tensor([newest]))[0]
        want = torch.tensor(block_by_hand(head, tiny, features[:n].tolist(), newest),
                            dtype=torch.float64)
        assert got.shape == (3, TINY.vocab_size)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (n, (got - want).abs().max())


def test_attention_within_the_block_is_not_causal(target, head):
    """A mask's law depends on the masks after it (they are attended to): the first proposal of
    a block of 3 differs from that of a block of 5, all else equal."""
    small = random_head("dflash", target, seed=31, hidden=head.hidden, block_size=3)
    small.load_state_dict(head.state_dict())
    features = target_features(target, PROMPTS[0], head.hidden)[:5][None]
    newest = torch.tensor([PROMPTS[0][5]])
    assert not torch.allclose(small(features, newest)[0, 0], head(features, newest)[0, 0])


def test_greedy_output_is_the_targets_greedy(target, head):
    for prompt in PROMPTS:
        reference = greedy_generate(target, prompt, 20)
        for k in (1, 2, 4, 6):     # 6 > block_size - 1: four proposals a round at most
            tokens, _ = speculative_generate(target, head, prompt, 20, k=k)
            assert tokens == reference, (prompt, k)


def _recording(monkeypatch, log):
    def make(*args):
        proposer = head_proposer(*args)
        assert isinstance(proposer, DFlashProposer)
        propose = proposer.propose

        def recorded(context, k):
            before = proposer.forwards
            proposals, q = propose(context, k)
            features = None if proposer.verified.features is None \
                else proposer.verified.features.clone()
            log.append((list(context), k, proposals, q, proposer.forwards - before, features))
            return proposals, q
        proposer.propose = recorded
        return proposer
    monkeypatch.setattr(speculative, "head_proposer", make)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_round_proposes_k_tokens_from_one_forward(target, head, monkeypatch, temperature):
    """Every round with a verified token runs the head once and proposes min(k, B - 1) tokens:
    greedy, the argmax of each mask's logits; sampled, draws from their softmax, the q handed
    to the verifier. The features it drafts from are the target's over the committed tokens
    but the newest; the replay gives the same logits."""
    log = []
    _recording(monkeypatch, log)
    generator = torch.Generator().manual_seed(3)
    for prompt in PROMPTS:
        speculative_generate(target, head, prompt, 16, k=3, temperature=temperature,
                             generator=generator)
    assert log
    for context, k, proposals, q, forwards, features in log:
        n = len(context) - 1
        assert forwards == 1 and len(proposals) == min(k, head.max_proposals)
        exact = target_features(target, context, head.hidden)[:n]
        assert torch.allclose(features, exact, atol=1e-12, rtol=0)
        logits = head(exact[None], torch.tensor([context[-1]]))[0, :len(proposals)]
        replayed = round_logits(head, exact, context + proposals, n, len(proposals))
        assert torch.equal(replayed, logits)
        if temperature == 0:
            assert proposals == logits.argmax(-1).tolist()
        else:
            assert torch.allclose(torch.stack(q), torch.softmax(logits, -1), atol=1e-12)


def test_a_one_token_prompt_drafts_from_the_second_round(target, head, monkeypatch):
    log = []
    _recording(monkeypatch, log)
    speculative_generate(target, head, [5], 6, k=4)
    assert log[0][2] == [] and log[0][4] == 0
    assert all(len(entry[2]) > 0 and entry[4] == 1 for entry in log[1:])


def test_the_checkpoint_round_trip(target, tmp_path):
    head = random_head("dflash", target, seed=8, hidden=HiddenStates((1,), "output"),
                       block_size=3, mask_token_id=0, num_layers=2, own_lm_head=True)
    loaded = load_head(save_head(head, tmp_path / "h"), target)
    assert isinstance(loaded, DFlashHead) and KINDS["dflash"] is DFlashHead
    assert (loaded.block_size, loaded.mask_token_id, len(loaded.layers), loaded.own_lm_head,
            loaded.hidden) == (3, 0, 2, True, head.hidden)
    features = target_features(target, PROMPTS[0], head.hidden)[None]
    assert torch.equal(loaded(features, torch.tensor([1])), head(features, torch.tensor([1])))
    assert "lm_head.weight" in loaded.state_dict()
    assert not any(k.startswith("target") for k in loaded.state_dict())


def test_the_default_reads_a_middle_layer_never_the_last():
    assert default_hidden(2) == HiddenStates((0,), "output")
    assert default_hidden(4) == HiddenStates((1,), "output")
    assert default_hidden(1) == HiddenStates((0,), "output")


def test_bad_input_is_refused_by_name(target, head):
    with pytest.raises(ValueError, match="block_size must be an int >= 2"):
        DFlashHead(target, block_size=1)
    with pytest.raises(ValueError, match=r"mask_token_id must be a token id in \[0, 64\), got 64"):
        DFlashHead(target, mask_token_id=64)
    with pytest.raises(ValueError, match="num_layers must be an int >= 1, got 0"):
        DFlashHead(target, num_layers=0)
    with pytest.raises(ValueError, match="own_lm_head must be a bool"):
        DFlashHead(target, own_lm_head="yes")
    with pytest.raises(ValueError, match="un-normed layer outputs"):
        DFlashHead(target, hidden=HiddenStates((1,), "input"))
    with pytest.raises(ValueError, match="un-normed layer outputs"):
        DFlashHead(target, hidden=HiddenStates((1,), "output", normed=True))
    with pytest.raises(ValueError, match="past the target's 4 layers"):
        DFlashHead(target, hidden=HiddenStates((4,), "output"))
    with pytest.raises(ValueError, match=r"features must be \[batch, tokens, 64\]"):
        head(torch.zeros(1, 3, 32, dtype=torch.float64), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"newest must be \[batch\] token ids"):
        head(torch.zeros(1, 3, 64, dtype=torch.float64), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"outside \[0, 64\)"):
        head(torch.zeros(1, 3, 64, dtype=torch.float64), torch.tensor([64]))
    with pytest.raises(ValueError, match="at most 4 proposals, asked for 5"):
        round_logits(head, torch.zeros(8, 64, dtype=torch.float64), list(range(8)), 2, 5)
    with pytest.raises(ValueError, match="kind must be one of"):
        random_head("dflash2", target)


@pytest.mark.extra
def test_sampled_output_follows_the_targets_law(target, head):
    """The first 3 tokens at temperature 1, k = 2, against the exact law (chi-square after
    pooling at the kit's alpha 2e-6, n for power 0.99 at total variation 0.15), as
    tests/test_reference_heads_law.py does for the other heads."""
    prompt = [1, 2, 3, 4, 5, 6]

    def next_logits(seqs):
        ids = torch.tensor(seqs)
        return target(ids, target.new_cache(len(seqs), ids.shape[1]))[:, -1]
    law = law_from(next_logits, prompt, 3, 1.0)
    plan = statistics.plan(list(law.values()), statistics.DELTA_SEQUENCE_QWEN3)
    generator = torch.Generator().manual_seed(11)
    outcomes = [tuple(speculative_generate(target, head, prompt, 3, k=2, temperature=1.0,
                                           generator=generator)[0]) for _ in range(plan.n)]
    result = statistics.chi_square_gof(outcomes, law)
    assert result.passed, result.summary()
