"""llama.cpp llama-server, --spec-type draft-mtp: the MTP layer pairs the first token of every
request with the hidden state the slot's previous request left behind (pending_h), so the same
greedy request drafts differently depending on what its slot served before. The output stays
the target's; only the drafts (and so acceptance and speed) move. Standalone: plain HTTP, the
2-layer tiny target of ../tiny.py rewritten as a GLM-4.5 checkpoint (Glm4MoeForCausalLM: a dense
trunk, the same numbers) with one seeded MTP layer, converted with llama.cpp's own
convert_hf_to_gguf.py; no import of the kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # on a fresh one-slot server: request B; then A, then B again; on a second fresh
        # server: B once more. Prints each answer's draft counts.
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoints and GGUFs under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Exit status 0 when it
reproduces: B's output is the same every time, B's counts are the same on both fresh servers,
and B's counts after A differ from them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import llamacpp_tiny  # noqa: E402
from llamacpp_tiny import (counts, curl_line, free_port, greedy, post, prepare, server_argv,
                           start, stop)  # noqa: E402

K, MAX_TOKENS = 4, 32
# greedy continuations of 32 tokens without token 11 (llama.cpp's default end of sequence here)
A = [5, 6, 5, 6, 5, 6, 5, 6]
B = [1, 2, 3, 4, 5, 6, 7]
SPEC = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(K), "--spec-draft-n-min", "0",
        "--spec-draft-p-min", "0", "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]


def write_glm(target: Path, path: Path) -> Path:
    """The tiny Qwen3 target as Glm4MoeForCausalLM with one MTP layer (model.layers.2): every
    trunk layer dense (first_k_dense_replace 2), full-width NEOX RoPE (partial_rotary_factor
    1.0), q/k norm, no attention bias: Qwen3's layer and tensor names. The MTP layer's FFN is a
    mixture of experts (llama.cpp's graph requires one): two equal experts, top-1, weight
    sigmoid/sigmoid = 1, and a zero shared expert. Its eh_proj passes hnorm(h) through (the
    embedding half zero), so that through the target's final norm and lm_head it drafts the
    target's token at h's position again: accepted where the output repeats a token; its
    attention (seeded random, o_proj small) adds what the earlier pairs hold, the first one
    included."""
    from safetensors.torch import load_file, save_file
    tc = json.loads((target / "config.json").read_text())
    H, I = tc["hidden_size"], tc["intermediate_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    n = tc["num_hidden_layers"]
    gen = torch.Generator().manual_seed(11)

    def rand(*shape, std=0.3):
        return (torch.randn(*shape, generator=gen) * std).float()

    t = dict(load_file(str(target / "model.safetensors")))
    m = f"model.layers.{n}."
    t.update({m + "enorm.weight": torch.ones(H), m + "hnorm.weight": torch.ones(H),
              m + "eh_proj.weight": torch.cat([torch.zeros(H, H), torch.eye(H)], 1),
              m + "input_layernorm.weight": torch.ones(H),
              m + "post_attention_layernorm.weight": torch.ones(H),
              m + "self_attn.q_proj.weight": rand(nh * hd, H),
              m + "self_attn.k_proj.weight": rand(nkv * hd, H),
              m + "self_attn.v_proj.weight": rand(nkv * hd, H),
              m + "self_attn.o_proj.weight": rand(H, nh * hd, std=0.05),
              m + "self_attn.q_norm.weight": torch.ones(hd),
              m + "self_attn.k_norm.weight": torch.ones(hd),
              m + "mlp.gate.weight": torch.zeros(2, H),
              m + "mlp.gate.e_score_correction_bias": torch.zeros(2)})
    swiglu = {"gate_proj": rand(I, H, std=0.03), "up_proj": rand(I, H, std=0.03),
              "down_proj": rand(H, I, std=0.03)}
    for e in range(2):
        for name, w in swiglu.items():
            t[m + f"mlp.experts.{e}.{name}.weight"] = w.clone()
    for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        t[m + f"mlp.shared_experts.{name}.weight"] = torch.zeros(shape)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
              "vocab_size": tc["vocab_size"], "hidden_size": H, "intermediate_size": I,
              "num_hidden_layers": n, "num_attention_heads": nh, "num_key_value_heads": nkv,
              "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": tc["rms_norm_eps"],
              "max_position_embeddings": tc["max_position_embeddings"],
              "tie_word_embeddings": False, "attention_bias": False, "use_qk_norm": True,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 1.0},
              "partial_rotary_factor": 1.0, "first_k_dense_replace": n,
              "n_routed_experts": 2, "num_experts_per_tok": 1, "n_shared_experts": 1,
              "moe_intermediate_size": I, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
              "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 1,
              "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": None}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for f in target.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            (path / f.name).write_bytes(f.read_bytes())
    return path


def main() -> int:
    args, server, root, target, _ = prepare(__doc__, "llamacpp-mtp-lead-")
    glm = write_glm(target, root / "glm-mtp")
    gguf = root / "glm-mtp.gguf"
    if not gguf.exists():   # converted alone: the MTP layer is inside the model
        log = root / "glm-mtp.log"
        with open(log, "wb") as out:
            done = subprocess.run([sys.executable, llamacpp_tiny.__file__, "--convert",
                                   str(Path(args.llama_src).resolve()), str(glm), str(gguf)],
                                  stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not gguf.exists():
            sys.exit(f"converting {glm} to GGUF failed; see {log}")
    if args.models:
        print("llama-server line:", shlex.join(server_argv(server, gguf, 8080, SPEC)))
        for prompt in (B, A, B):
            print(curl_line(greedy(prompt, MAX_TOKENS)))
        return 0
    results = []
    for run, prompts in (("fresh server 1", (B, A, B)), ("fresh server 2", (B,))):
        process, url = start(server_argv(server, gguf, free_port(), SPEC),
                             root / f"server-{run[-1]}.log")
        try:
            for prompt in prompts:
                answer = post(url, greedy(prompt, MAX_TOKENS))
                d, a = counts(answer)
                results.append((run, prompt, answer["tokens"], d, a))
                print(f"{run}: prompt {prompt}: {len(answer['tokens'])} tokens, {d} drafted, "
                      f"{a} accepted")
        finally:
            stop(process)
    b = [r for r in results if r[1] == B]
    same_output = all(r[2] == b[0][2] for r in b)
    fresh = [(r[3], r[4]) for r in (b[0], b[2])]
    after_a = (b[1][3], b[1][4])
    print(f"B's output the same every time: {same_output}")
    print(f"B on a fresh slot: {fresh[0]} and {fresh[1]} (drafted, accepted); after A: {after_a}")
    reproduced = same_output and fresh[0] == fresh[1] and after_a != fresh[0]
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
