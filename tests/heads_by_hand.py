"""The heads' math written out by hand, for the tests: every law is recomputed from scratch
(a fresh cache, the whole sequence of pairs, every step), from target features computed by
running the target's blocks one by one. The proposers compute the same things incrementally
(a cache kept across rounds, rolled back, fed only the new pairs); these must agree with them.
"""

import torch
import torch.nn.functional as F

from reference.cache import KVCache
from reference.model import Config, random_model

# A small target for the heads' tests: 4 layers (EAGLE-3 reads three of them), 64 tokens.
SMALL = Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def small_target(seed: int = 3):
    return random_model(SMALL, seed=seed, dtype=torch.float64)


def random_heads(target, specs: dict, first_seed: int) -> dict:
    """name -> (kind, a seeded random head) for specs {name: dict(kind=..., **options)}."""
    from reference.heads.random import random_head
    out = {}
    for i, (name, spec) in enumerate(specs.items()):
        options = {key: value for key, value in spec.items() if key != "kind"}
        out[name] = (spec["kind"], random_head(spec["kind"], target, seed=first_seed + i, **options))
    return out


def _run(block_fn, x, cache_config, dtype):
    """block_fn(x, cache, positions, mask) over the whole sequence x [1, T, ...] with a fresh
    one-layer cache, positions 0 .. T - 1 and a causal mask."""
    T = x.shape[1]
    cache = KVCache(1, 1, cache_config.num_key_value_heads, cache_config.head_dim, T, dtype)
    positions = torch.arange(T)[None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None]
    return block_fn(x, cache, positions, mask)


def blocks_one_by_one(target, seq):
    """The residual stream after 0, 1, ..., N blocks over seq, each [T, H]: the blocks run in
    turn over the whole sequence with a fresh cache."""
    ids = torch.tensor([seq])
    T = len(seq)
    cache = target.new_cache(1, T)
    positions = torch.arange(T)[None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None]
    x = target.model.embed_tokens(ids)
    states = [x[0]]
    for block in target.layers:
        x = block(x, cache, positions, mask)
        states.append(x[0])
    return states


def target_features(target, seq, hidden):
    """The features `hidden` names over seq, [T, width], by hand: "output" of layer l is the
    stream after l + 1 blocks, "input" the stream after l."""
    states = blocks_one_by_one(target, seq)
    chosen = [states[l + 1] if hidden.where == "output" else states[l] for l in hidden.layers]
    if hidden.normed:
        chosen = [target.model.norm(s) for s in chosen]
    return torch.cat(chosen, dim=-1)


# --- one pass of each chained head over a whole sequence of pairs ----------------------------
# tokens [1, T] (t_{j+1}), h [1, T, H] -> (logits [1, T, Vd], the h of the next pair [1, T, H])

def eagle_pass(head, target, tokens, h):
    x = head.fc(torch.cat([target.model.embed_tokens(tokens), h], -1))
    g = _run(head.layer, x, head.config, x.dtype)
    out = g if head.hidden.normed else target.model.norm(g)
    return target.lm_head(out), g


def eagle3_pass(head, target, tokens, h):
    m = head.midlayer
    pair = torch.cat([m.input_layernorm(head.embed_tokens(tokens)), m.hidden_norm(h)], -1)
    attended = _run(lambda x, c, p, k: m.self_attn(x, c, p, k), pair, head.config, h.dtype)
    h = h + attended                                    # the residual stream is the hidden
    g = h + m.mlp(m.post_attention_layernorm(h))
    return head.lm_head(head.norm(g)), g


def mtp_pass(head, target, tokens, h):
    e, n = head.enorm(target.model.embed_tokens(tokens)), head.hnorm(h)
    x = head.eh_proj(torch.cat([e, n] if head.order == "embedding-first" else [n, e], -1))
    out = _run(head.mtp_block, x, head.config, x.dtype)
    normed = target.model.norm(out)
    return target.lm_head(normed), (out if head.recycle == "output" else normed)


PASSES = {"eagle": eagle_pass, "eagle3": eagle3_pass, "mtp": mtp_pass}


def chain_laws(kind, head, target, features, context, proposals):
    """The head's logits for each proposal of a round whose newest token is context[-1]:
    pairs (f_j, t_{j+1}) for the n = len(context) - 1 verified features, then one more pair per
    proposal, built on the head's previous output. features: [n, width] (the target's)."""
    n = len(context) - 1
    tokens = list(context[1:]) + list(proposals)            # tokens[j] = t_{j+1}
    start = head.fc(features) if kind == "eagle3" else features
    hs = list(start)
    if getattr(head, "lead", False):
        # llama.cpp's MTP: a pair (zero state, t_0) before pair 0, every pair one place later
        n, tokens, hs = n + 1, [context[0]] + tokens, [torch.zeros_like(hs[0])] + hs
    laws = []
    for step in range(len(proposals)):
        m = n + step                                        # pairs 0 .. m - 1
        logits, g = PASSES[kind](head, target, torch.tensor([tokens[:m]]),
                                 torch.stack(hs[:m])[None])
        laws.append(logits[0, -1])
        hs.append(g[0, -1])                                 # the h of pair m
    return laws


def medusa_laws(head, features, count):
    """Head i's logits (i = 1 .. count) from the latest verified feature features[-1]."""
    f = features[-1]
    laws = []
    for i in range(count):
        block = head.blocks[i].layers[0]
        laws.append(head.lm_heads[i](f + F.silu(f @ block.weight.T + block.bias)))
    return laws


def laws(kind, head, target, features, context, proposals):
    if kind == "medusa":
        return medusa_laws(head, features, len(proposals))
    return chain_laws(kind, head, target, features, context, proposals)


def on_target_vocab(head, law):
    """A law over the head's draft vocabulary placed on the target's (zero outside the map)."""
    d2t = getattr(head, "draft_to_target", None)
    if d2t is None:
        return law
    q = torch.zeros(head.config.vocab_size, dtype=law.dtype)
    for i, t in enumerate(d2t.tolist()):
        q[t] = law[i]
    return q


def greedy_proposal(head, logits) -> int:
    i = int(torch.argmax(logits))
    d2t = getattr(head, "draft_to_target", None)
    return i if d2t is None else int(d2t[i])


def committed_entry(kind: str) -> dict:
    """The manifest entry of the committed trained head of `kind` (reference/trained, make
    models-heads), after what every head's entry must hold: its fields, its two files listed
    and hashing as recorded, its acceptance at T = 0 and 1 a rate."""
    import json

    from reference.pretrained import TRAINED_DIR, check_manifest
    manifest = json.loads((TRAINED_DIR / "manifest.json").read_text())
    entry = manifest["heads"][kind]
    assert {"seed", "steps", "timings", "acceptance", "held_out_kl"} <= set(entry)
    assert {f"{kind}/config.json", f"{kind}/model.safetensors"} <= set(manifest["files"])
    assert not [p for p in check_manifest(TRAINED_DIR) if p.startswith(f"{kind}/")]
    for t in ("T=0", "T=1"):
        assert 0 < entry["acceptance"][kind][t]["acceptance"] <= 1
    return entry


def reproduces_recorded_acceptance(pair, head, kind: str) -> dict:
    """The committed head of `kind`, loaded as the engines' replays load it, drafts the target's
    own greedy output and gives its manifest entry's T = 0 figures exactly (the held-out
    prompts, tokens and k recorded there: accepted per position, reach, tokens per target
    call), every draft position reached at least once."""
    from reference import acceptance
    from reference.speculative import greedy_generate, speculative_generate
    prompt = pair.prompts()[0]
    assert speculative_generate(pair.target, head, prompt, 24, k=4)[0] == \
        greedy_generate(pair.target, prompt, 24)
    recorded = committed_entry(kind)["acceptance"][kind]["T=0"]
    measured = acceptance.measure(pair.target, head, pair.prompts()[:recorded["prompts"]],
                                  recorded["max_new_tokens"], recorded["k"], 0.0)
    assert measured == recorded
    assert sum(measured["reached"][1:]) > 0     # proposals 2 .. k are reached and judged too
    return measured
