"""The fast engine's EAGLE-3 drafter (fast/head.py) against the reference's head proposer: the
same proposals on the same contexts (greedy), the same law q (sampling), the target's greedy
output in ragged batches, and bad input refused by name."""

import pytest
import torch

import fast
import reference.speculative as speculative
from fast import fused
from fast.head import HeadDrafter
from fast.testing import target_greedy
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.heads.replay import round_logits
from reference.hidden import HiddenStates, forward_hidden
from reference.model import Config, random_model
from tests.heads_by_hand import small_target

PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 40, 7, 40, 40, 7], [63, 0, 31, 32, 8, 8, 8, 20, 11], [9, 3]]
# the conventions that change what the target hands the head: the default (inputs of layers
# 1, N // 2, N - 1), the embeddings and the last stream (states 0 and N), the final norm's
# output, and a draft vocabulary
HEADS = {
    "eagle3": {},
    "eagle3-ends": dict(hidden=HiddenStates((0, 6), "input")),
    "eagle3-normed": dict(hidden=HiddenStates((1, 3), "output", normed=True)),
    "eagle3-d2t": dict(draft_vocab=list(range(255, 0, -3)) + [2, 4]),
}


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=21, dtype=torch.float64)


@pytest.fixture(scope="module")
def heads(target):
    return {name: random_head("eagle3", target, seed=10 + i, **options)
            for i, (name, options) in enumerate(HEADS.items())}


def logged_fast(monkeypatch, log):
    """HeadDrafter.propose with each round logged: (row id, target length, proposals, q row)."""
    propose = HeadDrafter.propose

    def logged(self, rows, lengths, k, sampler, bound):
        proposals, q = propose(self, rows, lengths, k, sampler, bound)
        for b, (row, length) in enumerate(zip(rows.row_ids.tolist(), lengths.tolist())):
            log.append((row, length, proposals[b].tolist(), None if q is None else q[b]))
        return proposals, q
    monkeypatch.setattr(HeadDrafter, "propose", logged)


def logged_reference(monkeypatch, log):
    """The reference's head proposer with each round logged: (context, proposals)."""
    def recording(head, capacity, sampler, device):
        proposer = head_proposer(head, capacity, sampler, device)
        propose = proposer.propose

        def logged(context, k):
            proposals, q = propose(context, k)
            log.append((tuple(context), proposals))
            return proposals, q
        proposer.propose = logged
        return proposer
    monkeypatch.setattr(speculative, "head_proposer", recording)


@pytest.mark.parametrize("fused_step", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("name", HEADS)
def test_greedy_proposals_are_the_reference_proposers(target, heads, name, fused_step,
                                                      monkeypatch):
    """Whole greedy runs, every round: the fast drafter's k proposals on a context are the
    reference proposer's on the same context, and both outputs are the target's greedy."""
    head, k, new = heads[name], 3, 16
    fast_log, reference_log = [], []
    logged_fast(monkeypatch, fast_log)
    logged_reference(monkeypatch, reference_log)
    with fused.enabled(fused_step):
        outputs, _ = fast.batched_generate(target, HeadDrafter(head), PROMPTS, new, k=k)
    truths = [target_greedy(target, p, new) for p in PROMPTS]
    assert outputs == truths
    for prompt, truth in zip(PROMPTS, truths):
        tokens, _ = speculative.speculative_generate(target, head, prompt, new, k=k)
        assert tokens == truth
    theirs = dict(reference_log)
    compared = 0
    for row, length, proposals, _ in fast_log:
        context = tuple((PROMPTS[row] + truths[row])[:length + 1])
        if context in theirs:
            # the reference proposes fewer near the end of the budget (useful_k)
            assert proposals[:len(theirs[context])] == theirs[context], (name, context)
            compared += len(theirs[context]) > 0
    # the same proposals give the same acceptance, so the runs meet at every round
    assert compared == sum(1 for _, proposals in reference_log if proposals)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("name", HEADS)
def test_sampled_q_is_the_heads_law_on_the_target_vocabulary(target, heads, name, temperature,
                                                             monkeypatch):
    """Under sampling every round's q is the reference's law for that round (replayed from
    the target's features with reference.heads.replay, the proposals before it taken as
    accepted), softmaxed at the temperature; each proposal has q > 0; rows of one-token
    prompts propose their newest token with q one-hot in their first round."""
    head, k = heads[name], 3
    prompts = PROMPTS + [[17]]
    log = []
    logged_fast(monkeypatch, log)
    generator = torch.Generator().manual_seed(4)
    outputs, _ = fast.batched_generate(target, HeadDrafter(head), prompts, 10, k=k,
                                       temperature=temperature, generator=generator)
    seen = 0
    for row, length, proposals, q in log:
        seq = (prompts[row] + outputs[row])[:length + 1]
        if length == 0:
            assert proposals == [seq[-1]] * k and torch.equal(q, torch.eye(q.shape[-1],
                                                             dtype=q.dtype)[proposals])
            continue
        seq = seq + proposals
        ids = torch.tensor([seq])
        _, features = forward_hidden(target, ids, target.new_cache(1, len(seq)), head.hidden)
        laws = torch.softmax(round_logits(head, features[0], seq, length, k) / temperature, -1)
        torch.testing.assert_close(q, laws, rtol=0, atol=1e-10)
        assert all(q[i, t] > 0 for i, t in enumerate(proposals))
        seen += 1
    assert seen > len(prompts)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_ragged_batches_with_stops_are_the_targets_greedy(target, heads, k):
    prompts = PROMPTS + [[17], [200, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 5]]
    budgets = [20, 0, 13, 7, 20, 9]
    truths = [target_greedy(target, p, 20) for p in prompts]
    stops = sorted({truths[0][9], truths[4][5]})
    outputs, stats = fast.batched_generate(target, HeadDrafter(heads["eagle3"]), prompts,
                                           budgets, k=k, stop_ids=stops)
    for out, truth, n in zip(outputs, truths, budgets):
        cut = next((i + 1 for i, t in enumerate(truth) if t in stops), len(truth))
        assert out == truth[:min(n, cut)]
    assert stats["host_syncs"] == stats["rounds"]


def test_the_trained_head_drafts_as_the_reference_does(monkeypatch):
    """The committed trained target and its EAGLE-3 head (reference/trained/eagle3), float64:
    the fast drafter proposes the reference proposer's tokens round for round, its output is
    the target's greedy output, and it accepts as much as the reference."""
    pretrained = pytest.importorskip("reference.pretrained")
    pair = pretrained.load(torch.float64)
    head = pair.head("eagle3")
    prompts = [p[:24] for p in pair.prompts()[:2]]
    fast_log, reference_log = [], []
    logged_fast(monkeypatch, fast_log)
    logged_reference(monkeypatch, reference_log)
    outputs, stats = fast.batched_generate(pair.target, HeadDrafter(head), prompts, 24, k=4)
    for prompt, out in zip(prompts, outputs):
        tokens, _ = speculative.speculative_generate(pair.target, head, prompt, 24, k=4)
        assert out == tokens == target_greedy(pair.target, prompt, 24)
    theirs = dict(reference_log)
    for row, length, proposals, _ in fast_log:
        context = tuple((prompts[row] + outputs[row])[:length + 1])
        assert proposals[:len(theirs[context])] == theirs[context]
    assert stats["acceptance_rate"] > 0.3     # a trained head, not a random one


def test_bad_heads_are_refused_by_name(target, heads):
    with pytest.raises(ValueError, match="head must be a reference.heads.Eagle3Head, got Qwen3"):
        HeadDrafter(target)
    other = random_model("tiny", seed=1, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"head is torch.float64 on cpu but the target is "
                                         r"torch.float32"):
        fast.batched_generate(other, HeadDrafter(heads["eagle3"]), [[1, 2]], 4)
    with pytest.raises(ValueError, match=r"head was made for a target of \(vocab, hidden, "
                                         r"heads, kv heads, head_dim\) = \(64, "):
        fast.batched_generate(target, HeadDrafter(random_head("eagle3", small_target())),
                              [[1, 2]], 4)
    with pytest.raises(ValueError, match="draft must be a Qwen3-family model for tree"):
        fast.tree_generate(target, HeadDrafter(heads["eagle3"]), [1, 2], 4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_batch_of_one_token_prompts_drafts_from_the_second_round(target, heads, temperature):
    """No row has a verified feature in the first round (no head step at all then)."""
    prompts = [[17], [3]]
    generator = torch.Generator().manual_seed(2)
    outputs, _ = fast.batched_generate(target, HeadDrafter(heads["eagle3"]), prompts, 9, k=3,
                                       temperature=temperature, generator=generator)
    assert [len(out) for out in outputs] == [9, 9]
    if temperature == 0:
        assert outputs == [target_greedy(target, p, 9) for p in prompts]


def test_the_kit_impl_drafts_with_the_targets_trained_head_where_one_fits():
    """--impl=fast-head (fast/head_kit.py's EAGLE3): the committed trained target gets its trained head
    (what the kit's trained cases then judge), a shallow kit target a random head reading its
    embeddings and last stream; one head per target, kept."""
    from fast.head_kit import EAGLE3
    from reference.heads.kit import head_for
    pretrained = pytest.importorskip("reference.pretrained")
    pair = pretrained.load(torch.float64)
    head = head_for(pair.target)
    assert torch.equal(head.fc.weight, pair.head("eagle3").fc.weight)
    assert head_for(pair.target) is head and EAGLE3.drafter(pair.target).head is head
    shallow = random_model(Config(num_hidden_layers=2), seed=1, dtype=torch.float64)
    assert head_for(shallow).hidden == HiddenStates((0, 2), "input")
    assert "perfect_draft" in EAGLE3.KIT_NOT_APPLICABLE


def test_the_heads_fast_weights_are_made_once_and_remade_when_it_changes(target):
    """fast.HeadDrafter is built per generate call: the head's fast copies are kept per head
    (fast/head.py's _HEAD_WEIGHTS) and rebuilt when a parameter changes in place, so a
    changed head drafts with its new weights."""
    from fast.head import head_weights
    head = random_head("eagle3", target, seed=30)
    first = head_weights(head)
    assert head_weights(head) is first and HeadDrafter(head).weights is first
    before = head_weights(head).fc.clone()
    with torch.no_grad():
        head.fc.weight.mul_(2.0)
    remade = head_weights(head)
    assert remade is not first and torch.equal(remade.fc, 2.0 * before)
    # what the drafter proposes follows: its greedy output is still the target's
    outputs, _ = fast.batched_generate(target, HeadDrafter(head), PROMPTS[:2], 8, k=3)
    assert outputs == [target_greedy(target, p, 8) for p in PROMPTS[:2]]


def test_an_engine_refuses_target_weights_that_are_not_weights(target, heads):
    from fast.engine import FastEngine
    with pytest.raises(ValueError, match="target_weights must be the target's "
                                         "fast.weights.ModelWeights or None, got Tensor"):
        FastEngine(target, HeadDrafter(heads["eagle3"]), max_batch=1, max_cache_len=32,
                   target_weights=torch.zeros(3))


def test_the_benchmarks_acceptance_by_position_counts_every_round(target, heads):
    """fast/test_bench_head.py's accepted_by_round logs each round's accepted counts (they sum
    to the engine's own count), and by_position turns them into acceptance per position."""
    pytest.importorskip("pytest_benchmark")
    from fast.test_bench_head import accepted_by_round, by_position, restricted_head
    (outputs, stats), accepted = accepted_by_round(
        lambda: fast.batched_generate(target, HeadDrafter(heads["eagle3"]), PROMPTS, 12, k=3))
    assert len(accepted) == stats["row_rounds"] and sum(accepted) == stats["accepted"]
    assert by_position([0, 1, 4, 4], 4) == [0.75, 2 / 3, 1.0, 1.0]
    assert by_position([], 2) == [0.0, 0.0]
    # the benchmark's draft-vocabulary head: the trained head's logits on its rows
    head = heads["eagle3"]
    ids = torch.tensor([2, 5, 40, 63])
    cut = restricted_head(head, ids)
    tokens, h = torch.tensor([[3, 4]]), torch.randn(1, 2, head.config.hidden_size,
                                                    dtype=torch.float64)
    full, _ = head(tokens, h, head.new_cache(4))
    mine, _ = cut(tokens, h, cut.new_cache(4))
    assert torch.equal(mine, full[..., ids]) and torch.equal(cut.draft_to_target, ids)


def test_the_benchmarks_tree_bound_walks_the_chain_as_the_engine_runs_it(target, heads):
    """fast/test_bench_head.py's walk: with top-1 children to depth k it is the chain, so its
    tokens per call are the engine's own on the same prompts (greedy); wider trees accept at
    least as much; and the walk's counting on ranks written by hand."""
    from types import SimpleNamespace
    from fast.test_bench_head import head_walk_ranks, walk_tokens_per_call
    head, k = heads["eagle3"], 3
    prompts = PROMPTS[:3]
    outputs = [target_greedy(target, p, 14) for p in prompts]
    ranks = head_walk_ranks(SimpleNamespace(target=target), head, prompts, outputs, k + 1)
    rounds = 0
    for prompt in prompts:
        _, stats = fast.batched_generate(target, HeadDrafter(head), [prompt], 14, k=k)
        rounds += stats["rounds"]
    assert walk_tokens_per_call(ranks, 1, k) == 14 * len(prompts) / rounds
    assert walk_tokens_per_call(ranks, 2, k) >= walk_tokens_per_call(ranks, 1, k)
    by_hand = [[[0, 0, 3], [0], [0], [0]]]      # one prompt, four output tokens
    assert walk_tokens_per_call(by_hand, 1, 4) == 4 / 2     # rounds take 3, then 1 (+ its bonus)
    assert walk_tokens_per_call(by_hand, 4, 4) == 4 / 1
