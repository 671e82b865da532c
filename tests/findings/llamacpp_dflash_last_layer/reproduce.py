"""llama.cpp llama-server: a DFlash drafter whose dflash_config.target_layer_ids names the
target's last layer (id N - 1: that layer's output, Hugging Face's hidden_states[N]) cannot
run on a Qwen3 target. The converter writes target_layers = id + 1 = N, the drafter asks the
target context for "the input of layer N" (llama_set_embeddings_layer_inp), and the Qwen3 graph
records layer inputs for layers 0 .. N - 1 only (src/models/qwen3.cpp: res->t_layer_inp[il] =
inpL inside the layer loop), so building the target's graph hits GGML_ASSERT(t_layer_inp[il]
!= nullptr && "layer input tensor is null") (src/llama-graph.cpp). The same head with id
N - 2 runs and drafts. Standalone: the tiny target of tiny.py (2 layers), the DFlash heads
written here with torch and safetensors, converted by llama.cpp's own convert_hf_to_gguf.py;
no import of the conformance kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # builds the target and two DFlash heads (target_layer_ids [1] = the last layer, and
        # [0]), converts them, starts llama-server with -md HEAD --spec-type draft-dflash for
        # each, sends one greedy request and prints whether the server answered, its draft
        # counts and the log's assertion line
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoints and GGUFs under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Exit status 0 when the finding
reproduces: with [1] the server dies (or never answers) with the assertion in its log, with
[0] it answers and drafts.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import (counts, free_port, greedy, head_gguf, healthy, post, prepare,
                           server_argv, stop)  # noqa: E402

PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]
CASES = {"last-layer": [1], "control": [0]}     # the tiny target has N = 2 layers
SPEC = ["--spec-type", "draft-dflash", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
        "--spec-draft-p-min", "0", "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]
ASSERTION = "layer input tensor is null"


def write_head(path: Path, target: Path, layer_ids: list, seed: int = 7) -> Path:
    """A one-layer DFlash drafter (DFlashDraftModel, Qwen3 layer names) reading the outputs of
    the target layers `layer_ids`, random weights; no embedding or lm_head: the target's."""
    import torch
    from safetensors.torch import save_file
    config = json.loads((target / "config.json").read_text())
    H, I = config["hidden_size"], config["intermediate_size"]
    heads, kv, d = (config["num_attention_heads"], config["num_key_value_heads"],
                    config["head_dim"])
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=generator) * scale
    state = {"fc.weight": rand(H, H * len(layer_ids)), "hidden_norm.weight": torch.ones(H),
             "norm.weight": torch.ones(H)}
    prefix = "layers.0."
    state |= {prefix + "input_layernorm.weight": torch.ones(H),
              prefix + "post_attention_layernorm.weight": torch.ones(H),
              prefix + "self_attn.q_proj.weight": rand(heads * d, H),
              prefix + "self_attn.k_proj.weight": rand(kv * d, H),
              prefix + "self_attn.v_proj.weight": rand(kv * d, H),
              prefix + "self_attn.o_proj.weight": rand(H, heads * d, scale=0.003),
              prefix + "self_attn.q_norm.weight": torch.ones(d),
              prefix + "self_attn.k_norm.weight": torch.ones(d),
              prefix + "mlp.gate_proj.weight": rand(I, H),
              prefix + "mlp.up_proj.weight": rand(I, H),
              prefix + "mlp.down_proj.weight": rand(H, I, scale=0.003)}
    head = {k: v for k, v in config.items()
            if k not in ("architectures", "num_hidden_layers", "layer_types")}
    head |= {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
             "num_hidden_layers": 1, "target_hidden_size": H,
             "num_target_layers": config["num_hidden_layers"], "block_size": 5,
             "dflash_config": {"target_layer_ids": layer_ids, "mask_token_id": 31,
                               "block_size": 5}}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(head, indent=2))
    save_file({k: v.float().contiguous() for k, v in state.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def try_head(server, gguf: Path, head: Path, root: Path, name: str) -> dict:
    argv = server_argv(server, gguf, free_port(), ["-md", str(head)] + SPEC)
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    log = root / f"server-{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    answered, drafted = False, None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if healthy(url):
                try:
                    drafted = counts(post(url, greedy(PROMPT, 12)))
                    answered = True
                except (OSError, SystemExit) as exc:
                    print(f"    the request failed: {exc}")
                break
            time.sleep(0.5)
        time.sleep(0.5)
        alive = process.poll() is None
    finally:
        stop(process)
    text = log.read_text(errors="replace")
    lines = [line.rstrip() for line in text.splitlines()
             if ASSERTION in line or "GGML_ASSERT" in line or "target_layers" in line
             or "extract_layers" in line]
    said = "".join(f"\n      {line}" for line in lines) or " none"
    print(f"--- {name}: target_layer_ids {CASES[name]}\n    server: {shlex.join(argv)}\n"
          f"    answered: {answered}; (drafted, accepted): {drafted}; alive afterwards: {alive}"
          f"\n    log lines:{said}\n    (log {log})")
    return {"answered": answered, "drafted": drafted, "asserted": ASSERTION in text}


def main() -> int:
    args, server, root, target, gguf = prepare(__doc__, "llama-dflash-last-")
    heads = {}
    for name, ids in CASES.items():
        folder = write_head(root / f"head-{name}", target, ids)
        heads[name] = head_gguf(Path(args.llama_src).resolve(), folder, target,
                                root / f"head-{name}.gguf")
    if args.models:
        for name, head in heads.items():
            print(f"{name}:\n  {shlex.join(server_argv(server, gguf, 8080, ['-md', str(head)] + SPEC))}")
        return 0
    seen = {name: try_head(server, gguf, head, root, name) for name, head in heads.items()}
    last, control = seen["last-layer"], seen["control"]
    reproduced = (not last["answered"] and last["asserted"] and control["answered"]
                  and control["drafted"] is not None and control["drafted"][0] > 0)
    print(f"\nREPRODUCED: a DFlash head reading the target's last layer aborts llama-server "
          f"('{ASSERTION}'); the same head on layer 0 drafts {control['drafted']}"
          if reproduced else "\nNOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
