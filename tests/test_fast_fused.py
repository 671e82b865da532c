"""fast/fused.cpp, a step's decoder layers in one native call, against the eager loop it
replaces (fast/forward.py's eager_layers): the same logits and cache entries to rounding in
float32 and float64 on chains, ragged batches, trees, grouped-query shapes and an early-exit
draft; each row bit for bit what it is alone (a verify row is its decode step); and every
input off its contract sent to the eager loop rather than guessed at."""

import pytest
import torch

from fast import fused
from fast.engine import FastEngine
from fast.forward import forward, window_mask
from fast.rotary import rotary_table
from fast.testing import chain, fast_cache
from fast.tree import TreeShape
from fast.weights import model_weights
from reference.model import EarlyExit, preset, random_model

TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4}


@pytest.fixture(autouse=True)
def kernel(native_kernel):
    return native_kernel


def new_cache(weights, batch, capacity=96):
    return fast_cache(weights, batch, capacity)


def both_paths(run):
    """run(on) under the fused call and under the eager loop: (fused result, eager result)."""
    with fused.enabled(True):
        a = run()
    with fused.enabled(False):
        b = run()
    return a, b


def ragged_run(weights, batch, block, seed=0):
    """Prefill ragged prompts (eagerly or not, 20 tokens a row), then feed `block` tokens a row
    at each row's own length: (logits [batch, block, V], every layer's keys)."""
    g = torch.Generator().manual_seed(seed)
    V = weights.shape.vocab_size
    prompts = torch.randint(0, V, (batch, 20), generator=g)
    lengths = torch.tensor([20 - 3 * (b % 4) for b in range(batch)])
    blocks = torch.randint(0, V, (batch, block), generator=g)

    def run():
        cache = new_cache(weights, batch)
        chain(weights, cache, prompts, torch.zeros(batch, dtype=torch.long), 20, None)
        logits = chain(weights, cache, blocks, lengths, 20 + block)
        return logits, [k[:batch].clone() for k in cache.keys]

    return both_paths(run)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch,block", [(1, 1), (1, 5), (3, 4), (8, 5), (2, 8)])
def test_chain_steps_match_the_eager_loop(dtype, batch, block):
    weights = model_weights(random_model("tiny", seed=2, dtype=dtype))
    (fused_logits, fused_keys), (eager_logits, eager_keys) = ragged_run(weights, batch, block)
    scale = eager_logits.abs().max()
    assert (fused_logits - eager_logits).abs().max() <= TOLERANCE[dtype] * scale
    for a, b in zip(fused_keys, eager_keys):
        assert (a - b).abs().max() <= TOLERANCE[dtype] * b.abs().max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_early_exit_draft_and_an_odd_shape_match(dtype):
    """Shared layers (an early exit); 6 query heads on 1 key/value head of 20 with widths that
    are no multiple of 8 (every loop's tail); and a head size of 24, a multiple of 8 that
    attention's compiled sizes (16, 32, 64, 128) leave to its run-time loop."""
    target = random_model("tiny", seed=4, dtype=dtype)
    odd = preset("tiny", hidden_size=90, intermediate_size=100, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=1, head_dim=20)
    head_24 = preset("tiny", hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=24)
    for model in (EarlyExit(target, 2), random_model(odd, seed=5, dtype=dtype),
                  random_model(head_24, seed=6, dtype=dtype)):
        weights = model_weights(model)
        (a, _), (b, _) = ragged_run(weights, 2, 3, seed=1)
        assert (a - b).abs().max() <= TOLERANCE[dtype] * b.abs().max()


def test_a_tree_step_matches_the_eager_loop():
    weights = model_weights(random_model("tiny", seed=6, dtype=torch.float64))
    shape = TreeShape((2, 2, 2), "cpu")
    nodes = torch.randint(0, 256, (2, shape.size), generator=torch.Generator().manual_seed(2))
    prompt = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(3))
    base = torch.tensor([9, 6])

    def run():
        cache = new_cache(weights, 2)
        chain(weights, cache, prompt, torch.zeros(2, dtype=torch.long), 9, None)
        slots = base[:, None] + torch.arange(shape.size)
        positions = base[:, None] + shape.depth
        mask = window_mask(base, shape.ancestors, 40)
        return forward(weights, cache, nodes, slots, positions, mask, 40)

    a, b = both_paths(run)
    assert (a - b).abs().max() <= 1e-10 * b.abs().max()


@pytest.mark.parametrize("head_dim", [16, 24])
def test_each_row_is_what_it_is_alone_bit_for_bit(head_dim):
    """float32, fused: the decoder output for a token verified among 5 is the very output a
    decode step of that token gives on the same cache (batch invariance), and a row of a batch
    of 3 is what it is in a batch of 1; with a head size attention compiles in (16) and one it
    runs with a run-time size (24). The spans (13-17 slots) end inside a block of 8 slots."""
    weights = model_weights(random_model(preset("tiny", head_dim=head_dim), seed=7))
    s = weights.shape
    rotary = rotary_table(s.head_dim, s.rope_theta, 64, weights.dtype, "cpu")
    prompt, tokens = torch.randint(0, 256, (1, 12)), torch.randint(0, 256, (1, 5))

    def layers(cache, ids, start, span):
        T = ids.shape[1]
        slots = start[:, None] + torch.arange(T)
        mask = window_mask(start, torch.ones(T, T, dtype=torch.bool).tril(), span)
        x = fused.decoder_layers(weights, cache, ids, slots, slots, mask, span, rotary)
        assert x is not None
        return x

    def prefilled(batch):
        cache = new_cache(weights, batch, 64)
        layers(cache, prompt.expand(batch, -1), torch.zeros(batch, dtype=torch.long), 12)
        return cache

    verify = layers(prefilled(1), tokens, torch.tensor([12]), 17)[0]          # [5, hidden]
    cache = prefilled(1)
    steps = torch.cat([layers(cache, tokens[:, i:i + 1], torch.tensor([12 + i]), 13 + i)[0]
                       for i in range(5)])                                    # [5, hidden]
    assert torch.equal(verify, steps)
    three = layers(prefilled(3), tokens.expand(3, -1), torch.full((3,), 12), 17)
    assert all(torch.equal(three[b], verify) for b in range(3))


def prefill_call(weights, B, T, **options):
    """fused.decoder_layers over seeded ids [B, T] fed from slot 0 into a new cache, with
    `options`: (its answer, the cache)."""
    s = weights.shape
    rotary = rotary_table(s.head_dim, s.rope_theta, 64, weights.dtype, "cpu")
    ids = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(B * 100 + T))
    slots = torch.arange(T).expand(B, T)
    mask = window_mask(torch.zeros(B, dtype=torch.long), torch.ones(T, T, dtype=torch.bool).tril(), T)
    cache = new_cache(weights, B, 64)
    return fused.decoder_layers(weights, cache, ids, slots, slots, mask, T, rotary, **options), cache


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_final_norm_in_the_call_is_the_models_final_norm(dtype):
    """final_norm=True: the rows rms_norm(x, weights.norm) would give after the call without it."""
    from fast.forward import rms_norm
    weights = model_weights(random_model("tiny", seed=10, dtype=dtype))
    (plain, _), (normed, _) = (prefill_call(weights, 3, 7, final_norm=on) for on in (False, True))
    expected = rms_norm(plain, weights.norm, weights.shape.eps)
    assert (normed - expected).abs().max() <= TOLERANCE[dtype] * expected.abs().max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_cache_only_call_writes_the_same_cache(dtype):
    """cache_only=True (a prefill: forward with logits_at=None) stops after the last layer's keys
    and values: every layer's cache entries are bit for bit those of the full call, and the
    answer is an empty [B, T, 0], not None (None would send the step to the eager loop and
    write the cache twice)."""
    weights = model_weights(random_model("tiny", seed=11, dtype=dtype))
    (full, cache), (short, cache_only) = (prefill_call(weights, 2, 9, cache_only=on) for on in (False, True))
    assert full.shape == (2, 9, weights.shape.hidden_size) and short.shape == (2, 9, 0)
    for a, b in zip(cache.keys + cache.values, cache_only.keys + cache_only.values):
        assert torch.equal(a, b)


def test_the_native_window_mask_is_forwards_definition():
    """fast_native.window_mask against forward.window_mask's torch operations, bit for bit: chain
    and tree visibilities, windows that start at 0, inside the span and past it, spans shorter
    than the window; off-contract inputs answer None (and forward's torch path runs)."""
    g = torch.Generator().manual_seed(5)
    visibilities = [torch.ones(5, 5, dtype=torch.bool).tril(), torch.ones(1, 1, dtype=torch.bool),
                    TreeShape((2, 2, 2), "cpu").ancestors, torch.rand(4, 6, generator=g) < 0.5]
    for visibility in visibilities:
        for span in (1, 6, 17, 40):
            start = torch.tensor([0, 3, span - 1, span, span + 5])
            native = fused.window_mask(start, visibility, span)
            with fused.enabled(False):
                assert fused.window_mask(start, visibility, span) is None
                expected = window_mask(start, visibility, span)
            assert native is not None and native.is_contiguous()
            assert torch.equal(native, expected), (visibility.shape, span)
    causal = visibilities[0]
    assert fused.window_mask(torch.tensor([1], dtype=torch.int32), causal, 8) is None
    assert fused.window_mask(torch.tensor([1]), causal.T, 8) is None            # not contiguous
    assert fused.window_mask(torch.tensor([1]), causal.long(), 8) is None
    assert fused.window_mask(torch.tensor([[1]]), causal, 8) is None
    assert torch.equal(window_mask(torch.tensor([1], dtype=torch.int32), causal, 8),
                       window_mask(torch.tensor([1]), causal, 8))


def test_off_contract_inputs_go_to_the_eager_loop():
    weights = model_weights(random_model("tiny", seed=8, dtype=torch.float64))
    s = weights.shape
    rotary = rotary_table(s.head_dim, s.rope_theta, 1100, weights.dtype, "cpu")

    def attempt(ids, span=None, mask=None, slots=None, cache=None):
        B, T = ids.shape
        span = span or T
        slots = torch.arange(T).expand(B, T) if slots is None else slots
        if mask is None:
            mask = window_mask(torch.zeros(B, dtype=torch.long),
                               torch.ones(T, T, dtype=torch.bool).tril(), span)
        return fused.decoder_layers(weights, cache or new_cache(weights, B, max(96, T)), ids,
                                    slots, slots, mask, span, rotary)

    limit = fused.MAX_ROWS
    assert attempt(torch.zeros(1, limit, dtype=torch.long)) is not None     # the limit itself
    assert attempt(torch.zeros(1, limit + 1, dtype=torch.long)) is None     # a long prefill
    assert attempt(torch.zeros(3, limit // 3 + 1, dtype=torch.long)) is None   # too many in all
    assert attempt(torch.full((1, 3), 256)) is None                         # an id past the vocab
    assert attempt(torch.zeros(1, 3, dtype=torch.long), slots=torch.tensor([[0, 1, 3]])) is None
    assert attempt(torch.zeros(1, 3, dtype=torch.long),
                   mask=torch.ones(1, 3, 4, dtype=torch.bool)) is None      # mask not [B, T, span]
    assert attempt(torch.zeros(1, 3, dtype=torch.int32)) is None            # ids not int64
    with fused.enabled(False):
        assert attempt(torch.zeros(1, 3, dtype=torch.long)) is None
    half = model_weights(random_model("tiny", seed=8, dtype=torch.bfloat16))
    cache = new_cache(half, 1)
    assert fused.decoder_layers(half, cache, torch.zeros(1, 2, dtype=torch.long),
                                torch.arange(2)[None], torch.arange(2)[None],
                                torch.ones(1, 2, 2, dtype=torch.bool).tril(), 2,
                                rotary_table(s.head_dim, s.rope_theta, 96, torch.bfloat16, "cpu")) is None
    # forward still answers: the eager loop's own error for the bad id, its result for the rest
    cache = new_cache(weights, 1, limit + 1)
    with pytest.raises(IndexError):
        chain(weights, cache, torch.full((1, 3), 256), torch.zeros(1, dtype=torch.long), 3)
    assert chain(weights, cache, torch.zeros(1, limit + 1, dtype=torch.long),
                 torch.zeros(1, dtype=torch.long), limit + 1).shape == (1, limit + 1, 256)
    with pytest.raises(TypeError, match="on must be True or False, got 1"):
        with fused.enabled(1):
            pass


def test_the_engine_runs_its_steps_fused(monkeypatch):
    """What `--impl=fast` hands the kit runs every draft step and verify through the fused call
    (so the kit's verdict on it is a verdict on fast/fused.cpp), and fast.eager none of them."""
    import fast.eager
    target = random_model("tiny", seed=9, dtype=torch.float64)
    draft = EarlyExit(target, 2)
    answered = []
    real = fused.decoder_layers

    def spy(*args, **kwargs):
        x = real(*args, **kwargs)
        answered.append(x is not None)
        return x

    monkeypatch.setattr(fused, "decoder_layers", spy)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    fast_tokens, _ = FastEngine(target, draft, max_batch=1, max_cache_len=64).generate([prompt], 12)
    assert len(answered) > 4 and all(answered)
    answered.clear()
    eager_tokens, _ = fast.eager.speculative_generate(target, draft, prompt, 12)
    assert answered and not any(answered)
    assert fast_tokens[0] == eager_tokens
