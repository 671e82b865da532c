"""The DSpark reference drafter (reference/heads/dspark.py): DFlash's block forward with every
row read and the Markov bias chained by argmax, against a computation by hand on a tiny case;
every proposing round is one forward giving all of its proposals; greedy output is the
target's; the replay (reference/heads/replay.py) gives the proposer's own laws; the checkpoint
round trip; bad input refused by name."""

import pytest
import torch

import reference.speculative as speculative
from reference.heads import DSparkHead, KINDS
from reference.heads.checkpoint import load_head, save_head
from reference.heads.dflash import DFlashProposer
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.heads.replay import round_logits
from reference.hidden import HiddenStates
from reference.model import random_model
from reference.speculative import greedy_generate, speculative_generate
from tests.heads_by_hand import small_target, target_features
from tests.test_reference_dflash import PROMPTS, TINY, _matvec, block_by_hand


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.fixture(scope="module")
def head(target):
    head = random_head("dspark", target, seed=41, hidden=HiddenStates((0, 2), "output"),
                       markov_rank=3)
    with torch.no_grad():          # a Markov bias large enough to move argmaxes
        head.markov_head.markov_w2.weight.mul_(32)   # a power of two: still exact in float32
    return head


def chain_by_hand(head, base, newest):
    """The Markov chain over the base rows by hand: row i + bias(prev), prev the argmax of the
    row before (the anchor for row 0), the lowest index winning a tie."""
    w1 = head.markov_head.markov_w1.weight.tolist()
    w2 = head.markov_head.markov_w2.weight.tolist()
    rows, prev = [], newest
    for row in base:
        bias = _matvec(w2, w1[prev])
        rows.append([b + m for b, m in zip(row, bias)])
        prev = max(range(len(rows[-1])), key=lambda v: (rows[-1][v], -v))
    return rows


@pytest.mark.parametrize("own_lm_head,num_layers", [(False, 1), (True, 2)])
def test_the_block_forward_is_the_math_by_hand(own_lm_head, num_layers):
    tiny = random_model(TINY, seed=5, dtype=torch.float64)
    head = random_head("dspark", tiny, seed=6, hidden=HiddenStates((1, 0), "output"),
                       block_size=3, mask_token_id=3, num_layers=num_layers,
                       own_lm_head=own_lm_head, markov_rank=2)
    seq = [2, 6, 1, 5, 0]
    features = target_features(tiny, seq, head.hidden)
    for n in (1, 3, 5):
        newest = seq[n] if n < len(seq) else 7
        got = head(features[:n][None], torch.tensor([newest]))[0]
        base = block_by_hand(head, tiny, features[:n].tolist(), newest)
        assert len(base) == 3          # every row of the block of 3, the anchor's first
        want = torch.tensor(chain_by_hand(head, base, newest), dtype=torch.float64)
        assert got.shape == (3, TINY.vocab_size)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (n, (got - want).abs().max())


def test_the_markov_bias_follows_the_chain(target, head):
    """Row i's bias is that of row i - 1's argmax (row 0's: the newest token's), and it moves
    the argmax somewhere in these rounds (the chain is not a no-op)."""
    features = target_features(target, PROMPTS[0], head.hidden)[:5][None]
    newest = torch.tensor([PROMPTS[0][5]])
    rows = head(features, newest)[0]
    base = rows.clone()
    prev = newest
    for i in range(rows.shape[0]):
        base[i] -= head.markov_bias(prev)[0]
        prev = rows[i].argmax()[None]
    plain = DSparkHead.__mro__[1].forward(head, features, newest)[0]      # DFlash's forward
    assert torch.allclose(base, plain, atol=1e-12, rtol=0)
    moved = 0
    for prompt in PROMPTS:
        f = target_features(target, prompt, head.hidden)
        for n in range(1, len(prompt)):
            out = head(f[:n][None], torch.tensor([prompt[n]]))[0]
            raw = DSparkHead.__mro__[1].forward(head, f[:n][None], torch.tensor([prompt[n]]))[0]
            moved += int((out.argmax(-1) != raw.argmax(-1)).any())
    assert moved > 0


def test_greedy_output_is_the_targets_greedy(target, head):
    for prompt in PROMPTS:
        reference = greedy_generate(target, prompt, 20)
        for k in (1, 2, 4, 6):     # 6 > block_size: four proposals a round at most
            tokens, _ = speculative_generate(target, head, prompt, 20, k=k)
            assert tokens == reference, (prompt, k)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_round_proposes_k_tokens_from_one_forward(target, head, monkeypatch, temperature):
    """Every round with a verified token runs the head once and proposes min(k, B) tokens:
    greedy, the argmax of each row; sampled, draws from their softmax (the q handed to the
    verifier). The replay gives the same logits."""
    log = []

    def make(*args):
        proposer = head_proposer(*args)
        assert isinstance(proposer, DFlashProposer)
        propose = proposer.propose

        def recorded(context, k):
            before = proposer.forwards
            proposals, q = propose(context, k)
            log.append((list(context), k, proposals, q, proposer.forwards - before))
            return proposals, q
        proposer.propose = recorded
        return proposer
    monkeypatch.setattr(speculative, "head_proposer", make)
    generator = torch.Generator().manual_seed(3)
    for prompt in PROMPTS:
        speculative_generate(target, head, prompt, 16, k=3, temperature=temperature,
                             generator=generator)
    assert [entry for entry in log if entry[2]]
    for context, k, proposals, q, forwards in log:
        n = len(context) - 1
        if not proposals:
            assert n == 0 and forwards == 0
            continue
        assert forwards == 1 and len(proposals) == min(k, head.max_proposals) == min(k, 4)
        exact = target_features(target, context, head.hidden)[:n]
        logits = head(exact[None], torch.tensor([context[-1]]))[0, :len(proposals)]
        replayed = round_logits(head, exact, context + proposals, n, len(proposals))
        assert torch.equal(replayed, logits)
        if temperature == 0:
            assert proposals == logits.argmax(-1).tolist()
        else:
            assert torch.allclose(torch.stack(q), torch.softmax(logits, -1), atol=1e-12)


def test_the_checkpoint_round_trip(target, head, tmp_path):
    loaded = load_head(save_head(head, tmp_path / "h"), target)
    assert type(loaded) is DSparkHead and KINDS["dspark"] is DSparkHead
    assert (loaded.block_size, loaded.mask_token_id, loaded.markov_rank, loaded.own_lm_head,
            loaded.hidden) == (4, head.mask_token_id, 3, False, head.hidden)
    features = target_features(target, PROMPTS[0], head.hidden)[None]
    assert torch.equal(loaded(features, torch.tensor([1])), head(features, torch.tensor([1])))


def test_bad_input_is_refused_by_name(target):
    with pytest.raises(ValueError, match="markov_rank must be an int >= 1, got 0"):
        DSparkHead(target, markov_rank=0)
    with pytest.raises(ValueError, match="block_size must be an int >= 2"):
        DSparkHead(target, block_size=1)
