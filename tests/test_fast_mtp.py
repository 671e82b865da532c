"""The fast engine's MTP drafter (fast/mtp.py) against the reference's MTP proposer: the same
proposals on the same contexts (greedy), the same law q (sampling), the target's greedy output
in ragged batches, the native step equal to the eager one, bad input refused by name, and the
weight-bound pair's trained layer (reference/trained-large/mtp) drafting as recorded."""

from pathlib import Path

import pytest
import torch

import fast
import reference.speculative as speculative
from fast import fused
from fast.mtp import MTPDrafter, mtp_weights
from fast.testing import target_greedy
from reference.heads.proposer import head_proposer
from reference.heads.random import random_head
from reference.heads.replay import round_logits
from reference.hidden import forward_hidden, last_layer
from reference.model import Config, random_model
from tests.heads_by_hand import small_target

PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 40, 7, 40, 40, 7], [63, 0, 31, 32, 8, 8, 8, 20, 11], [9, 3]]
LAYERS_OF = 6       # the tiny target's layers
# the conventions the drafter runs: llama.cpp's (the trained layers': the normed last state,
# embedding first, the normed output chained, a lead pair), vLLM's (the un-normed state, no lead
# pair, position 0's embedding masked), MiMo's order, and a lead pair with position 0 masked
LAYERS = {
    "llamacpp": dict(hidden=last_layer(LAYERS_OF, normed=True), order="embedding-first",
                     recycle="normed", lead=True),
    "vllm": dict(recycle="normed", mask0=True),
    "mimo": dict(order="hidden-first", recycle="output"),
    # no engine's, but the reference runs it: the lead pair's embedding masked too
    "lead-mask0": dict(recycle="output", lead=True, mask0=True),
}


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=21, dtype=torch.float64)


@pytest.fixture(scope="module")
def layers(target):
    assert target.config.num_hidden_layers == LAYERS_OF
    # random layers accept next to nothing on this target: every round is compared, but rounds
    # that accept several proposals are the trained layer's test below
    return {name: random_head("mtp", target, seed=40 + i, **options)
            for i, (name, options) in enumerate(LAYERS.items())}


def logged_fast(monkeypatch, log):
    """MTPDrafter.propose with each round logged: (row id, target length, proposals, q row)."""
    propose = MTPDrafter.propose

    def logged(self, rows, lengths, k, sampler, bound):
        proposals, q = propose(self, rows, lengths, k, sampler, bound)
        for b, (row, length) in enumerate(zip(rows.row_ids.tolist(), lengths.tolist())):
            log.append((row, length, proposals[b].tolist(), None if q is None else q[b]))
        return proposals, q
    monkeypatch.setattr(MTPDrafter, "propose", logged)


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


def same_proposals(fast_log, reference_log, prompts, outputs) -> int:
    """Every fast round whose context the reference also proposed on proposes its tokens;
    returns how many rounds were compared."""
    theirs = dict(reference_log)
    compared = 0
    for row, length, proposals, _ in fast_log:
        context = tuple((prompts[row] + outputs[row])[:length + 1])
        if context in theirs:
            # the reference proposes fewer near the end of the budget (useful_k)
            assert proposals[:len(theirs[context])] == theirs[context], context
            compared += len(theirs[context]) > 0
    return compared


@pytest.mark.parametrize("fused_step", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("name", LAYERS)
def test_greedy_proposals_are_the_reference_proposers(target, layers, name, fused_step,
                                                      monkeypatch):
    """Whole greedy runs, every round: the fast drafter's k proposals on a context are the
    reference proposer's on the same context (a one-token prompt's included: its lead pair is
    fed in its second round), and both outputs are the target's greedy."""
    layer, k, new = layers[name], 3, 16
    prompts = PROMPTS + [[17]]
    fast_log, reference_log = [], []
    logged_fast(monkeypatch, fast_log)
    logged_reference(monkeypatch, reference_log)
    with fused.enabled(fused_step):
        outputs, _ = fast.batched_generate(target, MTPDrafter(layer), prompts, new, k=k)
    truths = [target_greedy(target, p, new) for p in prompts]
    assert outputs == truths
    for prompt, truth in zip(prompts, truths):
        tokens, _ = speculative.speculative_generate(target, layer, prompt, new, k=k)
        assert tokens == truth
    # the same proposals give the same acceptance, so the runs meet at every round
    assert same_proposals(fast_log, reference_log, prompts, truths) == \
        sum(1 for _, proposals in reference_log if proposals)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("name", ["llamacpp", "vllm"])
def test_sampled_q_is_the_layers_law(target, layers, name, temperature, monkeypatch):
    """Under sampling every round's q is the reference's law for that round (replayed from the
    target's features with reference.heads.replay, the proposals before it taken as accepted),
    softmaxed at the temperature; each proposal has q > 0; a one-token prompt's first round
    proposes its newest token with q one-hot."""
    layer, k = layers[name], 3
    prompts = PROMPTS + [[17]]
    log = []
    logged_fast(monkeypatch, log)
    generator = torch.Generator().manual_seed(4)
    outputs, _ = fast.batched_generate(target, MTPDrafter(layer), prompts, 10, k=k,
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
        _, features = forward_hidden(target, ids, target.new_cache(1, len(seq)), layer.hidden)
        laws = torch.softmax(round_logits(layer, features[0], seq, length, k) / temperature, -1)
        torch.testing.assert_close(q, laws, rtol=0, atol=1e-10)
        assert all(q[i, t] > 0 for i, t in enumerate(proposals))
        seen += 1
    assert seen > len(prompts)


@pytest.mark.parametrize("k", [1, 4, 6])
def test_ragged_batches_with_stops_are_the_targets_greedy(target, layers, k):
    prompts = PROMPTS + [[17], [200, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 5]]
    budgets = [20, 0, 13, 7, 20, 9]
    truths = [target_greedy(target, p, 20) for p in prompts]
    stops = sorted({truths[0][9], truths[4][5]})
    outputs, stats = fast.batched_generate(target, MTPDrafter(layers["llamacpp"]), prompts,
                                           budgets, k=k, stop_ids=stops)
    for out, truth, n in zip(outputs, truths, budgets):
        cut = next((i + 1 for i, t in enumerate(truth) if t in stops), len(truth))
        assert out == truth[:min(n, cut)]
    assert stats["host_syncs"] == stats["rounds"]


def test_the_native_block_is_the_eager_one(target, layers):
    """fused.decoder_layers' MTP mode (the stream starts as x) against the drafter's torch
    block, float64 and float32, on a ragged block over a cache with earlier entries: the same
    output and the same cache entries, to rounding."""
    from fast.forward import window_mask
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        t = random_model("tiny", seed=21, dtype=dtype)
        layer = random_head("mtp", t, seed=7, dtype=dtype, **LAYERS["llamacpp"])
        outputs = []
        for on in (True, False):
            drafter = MTPDrafter(layer)
            drafter.attach(fast.weights.model_weights(t), 2, 32)
            generator = torch.Generator().manual_seed(0)
            H = t.config.hidden_size
            start = torch.tensor([3, 0])
            slots = start[:, None] + torch.arange(4)                          # [2, 4]
            tokens = torch.randint(0, t.config.vocab_size, (2, 4), generator=generator)
            h = torch.randn(2, 4, H, generator=generator, dtype=dtype)
            with torch.no_grad():
                drafter.cache.keys[0].normal_(generator=generator)
                drafter.cache.values[0].normal_(generator=generator)
            mask = window_mask(start, torch.ones(4, 4, dtype=torch.bool).tril(), 12)
            x = drafter._input(tokens, h, slots)
            if on:
                g = fused.decoder_layers(drafter.weights.block, drafter.cache, tokens, slots,
                                         slots, mask, 12, drafter.rotary, start=x)
                assert g is not None, "the native MTP mode did not apply"
            else:
                g = drafter._eager_block(tokens, x, slots, mask, 12)
            outputs.append((g, drafter.cache.keys[0][:2, :, :8].clone(),
                            drafter.cache.values[0][:2, :, :8].clone()))
        for mine, theirs in zip(*outputs):
            torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)


def test_bad_layers_are_refused_by_name(target, layers):
    with pytest.raises(ValueError, match="layer must be a reference.heads.mtp.MTPLayer, got "
                                         "Qwen3"):
        MTPDrafter(target)
    other = random_model("tiny", seed=1, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"layer is torch.float64 on cpu but the target is "
                                         r"torch.float32"):
        fast.batched_generate(other, MTPDrafter(layers["llamacpp"]), [[1, 2]], 4)
    with pytest.raises(ValueError, match=r"layer was made for a target of \(vocab, hidden, "
                                         r"heads, kv heads, head_dim\) = \(64, "):
        fast.batched_generate(target, MTPDrafter(random_head("mtp", small_target())),
                              [[1, 2]], 4)
    with pytest.raises(ValueError, match="pair .* and start .* are two modes"):
        h = torch.zeros(1, 1, 8)
        fused.decoder_layers(None, None, torch.zeros(1, 1, dtype=torch.long), None, None, None,
                             1, None, pair=(h, h[0, 0]), start=h)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_batch_of_one_token_prompts_drafts_from_the_second_round(target, layers, temperature):
    """No row has a verified feature in the first round (no layer step at all then)."""
    prompts = [[17], [3]]
    generator = torch.Generator().manual_seed(2)
    outputs, _ = fast.batched_generate(target, MTPDrafter(layers["llamacpp"]), prompts, 9, k=3,
                                       temperature=temperature, generator=generator)
    assert [len(out) for out in outputs] == [9, 9]
    if temperature == 0:
        assert outputs == [target_greedy(target, p, 9) for p in prompts]


def test_the_layers_fast_weights_are_made_once_and_remade_when_it_changes(target):
    layer = random_head("mtp", target, seed=30, **LAYERS["llamacpp"])
    first = mtp_weights(layer)
    assert mtp_weights(layer) is first and MTPDrafter(layer).weights is first
    before = first.eh_proj.clone()
    with torch.no_grad():
        layer.eh_proj.weight.mul_(2.0)
    remade = mtp_weights(layer)
    assert remade is not first and torch.equal(remade.eh_proj, 2.0 * before)
    outputs, _ = fast.batched_generate(target, MTPDrafter(layer), PROMPTS[:2], 8, k=3)
    assert outputs == [target_greedy(target, p, 8) for p in PROMPTS[:2]]


def test_the_trained_layer_drafts_as_the_reference_does(monkeypatch):
    """The committed trained target and its MTP layer (reference/trained/mtp, llama.cpp's
    convention), float64: the fast drafter proposes the reference proposer's tokens round for
    round, rounds that accept several proposals and a one-token prompt's lead pair included;
    its output is the target's greedy output, and it accepts as much as the reference."""
    pretrained = pytest.importorskip("reference.pretrained")
    pair = pretrained.load(torch.float64)
    if not pair.has_head("mtp"):
        pytest.skip("reference/trained/mtp is not trained (make models-heads)")
    layer = pair.head("mtp")
    prompts = [p[:24] for p in pair.prompts()[:2]] + [pair.prompts()[2][:1]]
    fast_log, reference_log = [], []
    logged_fast(monkeypatch, fast_log)
    logged_reference(monkeypatch, reference_log)
    outputs, stats = fast.batched_generate(pair.target, MTPDrafter(layer), prompts, 24, k=4)
    for prompt, out in zip(prompts, outputs):
        tokens, _ = speculative.speculative_generate(pair.target, layer, prompt, 24, k=4)
        assert out == tokens == target_greedy(pair.target, prompt, 24)
    assert same_proposals(fast_log, reference_log, prompts, outputs) == \
        sum(1 for _, proposals in reference_log if proposals)
    assert stats["acceptance_rate"] > 0.4     # a trained layer, not a random one


LARGE_MTP = Path(__file__).parents[1] / "reference" / "trained-large" / "mtp"


@pytest.mark.skipif(not LARGE_MTP.is_dir(), reason="reference/trained-large/mtp is not trained "
                    "(python -m reference.train_mtp --models reference/trained-large)")
def test_the_weight_bound_pairs_trained_layer_drafts_as_recorded():
    """The weight-bound pair's trained MTP layer, float32 as its manifest measured it: the fast
    drafter's output is the target's greedy output, and on the manifest's held-out prompts (64
    tokens, k = 4, each row's own rounds) it accepts what the manifest records at T = 0, tokens
    per target call to within 0.02 (near-ties can round either way in another kernel)."""
    from reference.pretrained import load_dir
    pair = load_dir(LARGE_MTP.parent)
    layer = pair.head("mtp")
    recorded = pair.manifest["heads"]["mtp"]["acceptance"]["mtp"]["T=0"]
    prompts = [p["ids"] for p in pair.held["prompts"][:recorded["prompts"]]]
    outputs, stats = fast.batched_generate(pair.target, MTPDrafter(layer), prompts,
                                           recorded["max_new_tokens"], k=recorded["k"])
    assert outputs[0] == target_greedy(pair.target, prompts[0], recorded["max_new_tokens"])
    per_call = sum(map(len, outputs)) / stats["row_rounds"]
    assert abs(per_call - recorded["tokens_per_target_call"]) <= 0.02, \
        (per_call, recorded["tokens_per_target_call"])


def test_the_kit_impl_drafts_with_the_targets_trained_layer_where_one_fits():
    """--impl=fast-mtp (fast/head_kit.py's MTP): the committed trained target gets its trained
    MTP layer, a kit target of other shapes a random one in the same convention; one per target,
    kept."""
    from fast.head_kit import MTP
    from reference.heads.kit import head_for
    pretrained = pytest.importorskip("reference.pretrained")
    pair = pretrained.load(torch.float64)
    if not pair.has_head("mtp"):
        pytest.skip("reference/trained/mtp is not trained (make models-heads)")
    layer = head_for(pair.target, "mtp")
    assert torch.equal(layer.eh_proj.weight, pair.head("mtp").eh_proj.weight)
    assert head_for(pair.target, "mtp") is layer and MTP.drafter(pair.target).layer is layer
    shallow = random_model(Config(num_hidden_layers=2), seed=1, dtype=torch.float64)
    made = head_for(shallow, "mtp")
    assert (made.hidden, made.lead, made.recycle) == (last_layer(2, normed=True), True, "normed")
    assert "perfect_draft" in MTP.KIT_NOT_APPLICABLE
    outputs, _ = MTP.batched_generate(shallow, None, PROMPTS[:2], 6, k=3)
    assert outputs == [target_greedy(shallow, p, 6) for p in PROMPTS[:2]]
