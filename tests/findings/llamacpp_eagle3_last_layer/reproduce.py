"""llama.cpp llama-server: an EAGLE-3 head whose `eagle_aux_hidden_state_layer_ids` name the
target's depth N (the pre-final-norm state, read with llama_get_embeddings_nextn) drafts, on a
Qwen3 target, from a buffer nothing writes (the Qwen3 graph never sets res->t_h_nextn): zeros,
or logits earlier calls left there. No error, no warning; the output stays the target's, only
acceptance is lost. Standalone: plain HTTP, a 2-layer Qwen3 target and an EAGLE-3 head (a Llama
layer) built here, converted with llama.cpp's convert_hf_to_gguf.py; no import of the kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # two heads, identical but for the third aux id (1 or 2), their fc reading only that
        # slot; replays their greedy rounds exactly (float64, torch) with that slot holding
        # the true state, zeros, or the server's output buffer; four greedy requests to a fresh
        # server for [0,1,1], twice to one for [0,1,2] and once to another: draft counts
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoints and GGUFs under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Exit status 0 when it
reproduces: ids [0,1,1]: the server's counts equal the replay; ids [0,1,2]: they differ from
the replay with the true pre-norm state, and the output is still the target's greedy one.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import (counts, curl_line, free_port, greedy, head_gguf, post, prepare,
                           server_argv, start, stop)  # noqa: E402

K, MAX_TOKENS = 4, 48
# greedy continuations that never produce token 11 (llama.cpp's default EOS for this vocabulary)
PROMPTS = [[5, 6, 5, 6, 5, 6, 5, 6], [1, 2, 3, 4, 5, 6, 7], [20, 21, 0, 11, 3], [9, 19, 6, 4, 21]]
# a round drafts K tokens however unsure the head is (p-min 0); draft KV cache in float32 too
SPEC = ["--spec-type", "draft-eagle3", "--spec-draft-n-max", str(K), "--spec-draft-n-min", "0",
        "--spec-draft-p-min", "0", "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]
D = torch.float64
SMALL = 0.05            # the head layer's own weights: its output stays near its input g
# llama-server's output buffer (src/llama-context.cpp, output_reserve): [logits: n_vocab x
# n_outputs | embd_nextn | layer inputs], laid out anew at each call from that call's number of
# outputs, so embd_nextn's first rows lie where a previous call with more outputs (at most
# K + 1) left its logits; past that, zeros (the buffer is cleared when allocated)
STALE = 32 * (K + 1)


def write_head(target: Path, path: Path, ids: list) -> Path:
    """An EAGLE-3 Llama-layer head for the tiny target, the same seeded weights whatever `ids`.
    Its fc passes the third slot through unchanged (identity) and reads nothing of the first
    two: ids [0,1,1] and [0,1,2] differ only in what that slot holds. Its norm and lm_head are
    the target's final norm and lm_head, so that fed the pre-norm state at P it drafts the
    target's own token x_{P+1} (right wherever the target repeats a token)."""
    from safetensors.torch import load_file, save_file
    tc = json.loads((target / "config.json").read_text())
    H, I = tc["hidden_size"], tc["intermediate_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    gen, m = torch.Generator().manual_seed(7), "midlayer."
    t = load_file(str(target / "model.safetensors"))
    fc = torch.zeros(H, 3 * H)
    fc[:, 2 * H:] = torch.eye(H)
    state = {"embed_tokens.weight": t["model.embed_tokens.weight"], "fc.weight": fc,
             "norm.weight": t["model.norm.weight"], "lm_head.weight": t["lm_head.weight"]}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        state[f"{m}{name}.weight"] = torch.ones(H)
    Q, KV = nh * hd, nkv * hd            # q/k/v read the pair: 2H wide
    for name, shape in (("self_attn.q_proj", (Q, 2 * H)), ("self_attn.k_proj", (KV, 2 * H)),
                        ("self_attn.v_proj", (KV, 2 * H)), ("self_attn.o_proj", (H, Q)),
                        ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                        ("mlp.down_proj", (H, I))):
        state[f"{m}{name}.weight"] = torch.randn(*shape, generator=gen) * SMALL
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": H, "intermediate_size": I, "num_attention_heads": nh,
              "num_key_value_heads": nkv, "head_dim": hd, "num_hidden_layers": 1,
              "vocab_size": tc["vocab_size"], "draft_vocab_size": tc["vocab_size"],
              "max_position_embeddings": 2048, "rms_norm_eps": tc["rms_norm_eps"],
              "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "torch_dtype": "float32", "mlp_bias": False, "attention_bias": False,
              "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": list(ids),
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.float().contiguous() for k, v in state.items()},
              str(path / "model.safetensors"))
    return path


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta=10000.0):          # x [T, heads, d]; rotate-half (HF Llama's convention)
    T, d = x.shape[0], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=D) / d)
    ang = torch.arange(T, dtype=D)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def head_run(W, c, tokens, h):
    """The head's decoder (src/models/eagle3.cpp) over pairs (tokens[P], h[P]) at positions
    0..T-1, causal: (logits [T, V], pre-norm output [T, H]: the next pair's h)."""
    m, eps, T = "midlayer.", c["rms_norm_eps"], len(tokens)
    pair = torch.cat([rms(W["embed_tokens.weight"][tokens], W[m + "input_layernorm.weight"], eps),
                      rms(h, W[m + "hidden_norm.weight"], eps)], -1)
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = rope((pair @ W[m + "self_attn.q_proj.weight"].T).view(T, nh, hd))
    k = rope((pair @ W[m + "self_attn.k_proj.weight"].T).view(T, nkv, hd))
    v = (pair @ W[m + "self_attn.v_proj.weight"].T).view(T, nkv, hd)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, nh * hd)
    r = h + a @ W[m + "self_attn.o_proj.weight"].T
    x = rms(r, W[m + "post_attention_layernorm.weight"], eps)
    f = torch.nn.functional.silu(x @ W[m + "mlp.gate_proj.weight"].T)
    out = r + (f * (x @ W[m + "mlp.up_proj.weight"].T)) @ W[m + "mlp.down_proj.weight"].T
    return rms(out, W["norm.weight"], eps) @ W["lm_head.weight"].T, out


def target_states(model, seq):
    """(hidden states as transformers gives them, the pre-final-norm state) for `seq`."""
    seen = {}
    hook = model.model.norm.register_forward_hook(lambda mod, i, o: seen.update(pre=i[0]))
    with torch.no_grad():
        out = model(torch.tensor([seq]), output_hidden_states=True)
    hook.remove()
    return [s[0] for s in out.hidden_states], seen["pre"][0]


def replay(model, head: Path, prompt, third: str, buffer=None):
    """Exact counts (drafted, accepted) of one greedy request and the target's greedy
    continuation (what the server must return). The third aux slot holds `third`: "given" (what
    the ids name: a layer's input, or for id N the true pre-norm state), "zero", or "buffer"
    (what llama-server reads if nothing writes embd_nextn: `buffer`, the STALE floats its
    earlier calls left, carried across the requests of one server)."""
    from safetensors.torch import load_file
    c = json.loads((head / "config.json").read_text())
    W = {k: v.to(D) for k, v in load_file(str(head / "model.safetensors")).items()}
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(MAX_TOKENS + K + 1):       # accepted drafts may run past the end
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    states, pre = target_states(model, seq)
    layer = c["eagle_aux_hidden_state_layer_ids"][2]
    given = states[layer] if layer < len(states) - 1 else pre
    g = {}                                   # position -> g_P, as the last target call left it

    def call(tokens, first: int, n_out: int):
        """One target decode of tokens at positions first.. (the last n_out are outputs) and
        the head's process(): g of those positions from their features (fc: the identity)."""
        rows = len(tokens) - first
        if third == "given":
            feats = given[first:first + rows]
        elif third == "zero":
            feats = torch.zeros(rows, given.shape[1], dtype=D)
        else:                                 # embd_nextn's rows start after n_out logit rows
            flat = torch.cat([buffer, torch.zeros(rows * given.shape[1], dtype=D)])
            with torch.no_grad():             # the target's logits at the outputs
                logits = model(torch.tensor([tokens])).logits[0, -n_out:].reshape(-1)
            start = logits.numel()                           # n_vocab x n_out
            feats = flat[start:start + rows * given.shape[1]].view(rows, -1).clone()
            buffer[:logits.numel()] = logits   # this call's logits, for the next calls
        for i in range(rows):
            g[first + i] = feats[i] @ W["fc.weight"][:, 2 * len(feats[i]):].T
    cont, committed, drafted, accepted = seq[len(prompt):], 1, 0, 0
    call(seq[:len(prompt)], 0, 1)            # the prefill: one output, the last position
    while committed < MAX_TOKENS:
        n = min(K, MAX_TOKENS - committed - 1)             # capped to the tokens still wanted
        m = len(prompt) + committed                          # context x_0 .. x_{m-1}
        if n <= 0:                                           # the last token: no draft
            call(seq[:m], m - 1, 1)
            break
        toks, hs, drafts = seq[1:m], [g[p] for p in range(m - 1)], []
        with torch.no_grad():
            for _ in range(K):                   # pairs (x_{P+1}, g_P), then its own outputs
                logits, out = head_run(W, c, toks, torch.stack(hs))
                drafts.append(int(logits[-1].argmax()))
                toks, hs = toks + [drafts[-1]], hs + [out[-1]]
        a = 0
        while a < n and drafts[a] == cont[committed + a]:
            a += 1
        call(seq[:m] + drafts[:n], m - 1, n + 1)           # the verification: all outputs
        drafted, accepted, committed = drafted + n, accepted + a, committed + a + 1
    return (drafted, accepted), cont[:MAX_TOKENS]


def serve(server, target_gguf, head_gguf_path, root, name, passes=1):
    """Per pass over PROMPTS, each request's ((drafted, accepted), tokens), on one fresh server."""
    argv = server_argv(server, target_gguf, free_port(), ["-md", str(head_gguf_path)] + SPEC)
    process, url = start(argv, root / f"server-{name}.log")
    try:
        return [[(counts(a), a.get("tokens")) for a in
                 (post(url, greedy(p, MAX_TOKENS)) for p in PROMPTS)] for _ in range(passes)]
    finally:
        stop(process)


def warned(root: Path, name: str) -> set:
    """The warnings and errors a server logged, without their timestamps."""
    lines = (root / f"server-{name}.log").read_text(errors="replace").splitlines()
    return {line.split(" ", 1)[-1] for line in lines if " W " in line or " E " in line}


def main() -> int:
    args, server, root, target, tgt = prepare(__doc__, "llama-eagle3-last-")
    heads = {name: write_head(target, root / f"head-{name}", ids)
             for name, ids in (("011", [0, 1, 1]), ("012", [0, 1, 2]))}
    ggufs = {n: head_gguf(Path(args.llama_src).resolve(), h, target, root / f"head-{n}.gguf")
             for n, h in heads.items()}
    for n, g in ggufs.items():
        argv = server_argv(server, tgt, 8080, ["-md", str(g)] + SPEC)
        print(f"server, head {n}:\n  {shlex.join(argv)}")
    print(f"each request, e.g.:\n  {curl_line(greedy(PROMPTS[0], MAX_TOKENS))}")
    if args.models:
        return 0
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=D).eval()
    states, pre = target_states(model, PROMPTS[0])
    eps = model.config.rms_norm_eps
    print(f"transformers: hidden_states[-1] is the post-norm state: "
          f"{torch.allclose(states[-1], rms(pre, model.model.norm.weight, eps))}; "
          f"pre-norm differs from it: {not torch.allclose(states[-1], pre)}")
    # the exact counts per request; "buffer": one server's life, the 4 requests sent twice
    want, buffer = {}, torch.zeros(STALE, dtype=D)
    for key in (("011", "given"), ("012", "given"), ("012", "zero"), ("012", "buffer"),
                ("012", "buffer 2")):
        rows = [replay(model, heads[key[0]], p, key[1].split()[0], buffer) for p in PROMPTS]
        want[key] = [r[0] for r in rows]
        expected = [r[1] for r in rows]      # the target's greedy continuations
    total = lambda rows: tuple(map(sum, zip(*rows)))     # noqa: E731
    for (name, third), rows in want.items():
        print(f"replay, ids [{', '.join(name)}], third slot {third:8}: {rows} total {total(rows)}")
    got = {"011": serve(server, tgt, ggufs["011"], root, "011"),
           "012 first server": serve(server, tgt, ggufs["012"], root, "012-a", passes=2),
           "012 second server": serve(server, tgt, ggufs["012"], root, "012-b")}
    runs = {name: [[c for c, _ in answers] for answers in passes] for name, passes in got.items()}
    for name, passes in runs.items():
        for i, rows in enumerate(passes):
            print(f"server, ids {name}, pass {i + 1}: {rows} total {total(rows)}")
    lossless = all(t == w for passes in got.values() for answers in passes
                   for (_, t), w in zip(answers, expected))
    (b1, b2), (c1,) = runs["012 first server"], runs["012 second server"]
    same = runs["011"][0] == want["011", "given"]
    wrong = all(r != want["012", "given"] for r in (b1, b2, c1))
    stale = b1 == c1 == want["012", "buffer"] and b2 == want["012", "buffer 2"]
    said = (warned(root, "012-a") | warned(root, "012-b")) - warned(root, "011")
    print(f"ids [0,1,1]: the server's counts equal the exact replay: {same}\n"
          f"ids [0,1,2]: they differ from the replay with the true pre-norm state in every run: "
          f"{wrong}\nids [0,1,2]: they equal the replay fed what the output buffer held (zeros,"
          f" stale logits), both passes, both servers: {stale}\nids [0,1,2]: the first request "
          f"on a fresh server equals the all-zero replay: {b1[0] == want['012', 'zero'][0]}\n"
          f"every output is the target's greedy continuation: {lossless}\n"
          f"warnings or errors the [0,1,2] servers logged and the [0,1,1] one did not: "
          f"{sorted(said) or 'none'}")
    ok = bool(same and wrong and lossless and not said)
    print(f"REPRODUCED: with aux id 2 (the 2-layer Qwen3 target's depth) llama-server's EAGLE-3 "
          f"head drafts from a pre-norm state nothing writes, silently: {total(b1)} drafted/"
          f"accepted against {total(want['012', 'given'])} exact"
          f"{' (= zeros / stale logits in its place)' if stale else ''}; ids [0,1,1]: "
          f"{total(want['011', 'given'])} exact and served" if ok else "not reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
