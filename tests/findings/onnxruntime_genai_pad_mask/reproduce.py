"""onnxruntime-genai 0.18.0: after a prompt whose last token is the padding id, the next-token
logits are those of the prompt without that token, and the model builder makes the padding id
the end-of-sequence id when the checkpoint has no padding token. A prompt that ends with the
end-of-sequence id (a conversation whose last turn ended there, a continuation after an end of
sequence) is then continued as if that token were not there. The same id earlier in a prompt
is read right.

Standalone (no import of the conformance kit): a tiny Qwen3 checkpoint (../tiny.py, written
with transformers, its config naming end of sequence 31 and no padding token) is converted by
onnxruntime-genai's model builder (float32, CPU); the next-token logits after prompts that end
with, or hold, id 31 are compared with the checkpoint's own (transformers, float64), once with
the genai_config.json the builder wrote (pad_token_id 31) and once with pad_token_id set
outside the vocabulary (32). Needs, in one Python: torch, transformers, onnxruntime-genai
0.18.0, onnx, onnx_ir (the builder's imports), numpy.

    python reproduce.py [--models DIR]

Exit status 1 while the defect shows (with the builder's config the logits after a prompt
ending with id 31 are off by more than 1e-3 and equal, within 1e-3, the checkpoint's for the
prompt without it; prompts without 31 at the end, and every prompt with pad 32, right), else 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import tiny_models  # noqa: E402   (the findings' own helper, not the kit)

EOS = 31
PROMPTS = {"without id 31": [30, 22, 13, 8, 1, 7, 3],
           "ending with id 31": [30, 22, 13, 8, 1, 7, 3, 31],
           "holding id 31 earlier": [30, 22, 31, 13, 8, 1, 7, 3]}
TOLERANCE = 1e-3


def checkpoint_logits(path: Path, prompt) -> list:
    import torch
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1].tolist()


def engine_logits(folder: Path, prompt) -> list:
    import numpy as np
    import onnxruntime_genai as og
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompt, dtype=np.int32))
    return np.asarray(generator.get_logits()).reshape(-1)[-32:].tolist()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=None, help="where to write the models")
    args = parser.parse_args()
    root = Path(args.models or tempfile.mkdtemp(prefix="ortgenai-pad-"))
    target, _ = tiny_models(root)
    config = json.loads((target / "config.json").read_text())
    config["eos_token_id"] = EOS      # the builder needs one; no pad_token_id
    (target / "config.json").write_text(json.dumps(config, indent=2))
    built = root / "onnx"
    if not (built / "genai_config.json").exists():
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(target),
                   "-o", str(built), "-p", "fp32", "-e", "cpu"]
        print("$", " ".join(command))
        subprocess.run(command, check=True, capture_output=True)
    genai = json.loads((built / "genai_config.json").read_text())
    print(f"builder's genai_config.json: eos_token_id {genai['model']['eos_token_id']}, "
          f"pad_token_id {genai['model']['pad_token_id']}")
    padded = root / "onnx-pad-32"
    shutil.rmtree(padded, ignore_errors=True)
    shutil.copytree(built, padded)
    genai["model"]["pad_token_id"] = 32
    (padded / "genai_config.json").write_text(json.dumps(genai, indent=2))

    off = {}
    for folder, label in ((built, "builder's config"), (padded, "pad_token_id 32")):
        for name, prompt in PROMPTS.items():
            exact = checkpoint_logits(target, prompt)
            got = engine_logits(folder, prompt)
            gap = max(abs(a - b) for a, b in zip(exact, got))
            argmax = (max(range(32), key=exact.__getitem__), max(range(32), key=got.__getitem__))
            off[label, name] = gap > TOLERANCE
            print(f"{label:>16} | prompt {name:<22} {prompt}: largest logit gap {gap:.2e}, "
                  f"argmax checkpoint {argmax[0]} / engine {argmax[1]}")
            if prompt[-1] == EOS:
                shorter = checkpoint_logits(target, prompt[:-1])
                back = max(abs(a - b) for a, b in zip(shorter, got))
                off[label, "as without its last token"] = back <= TOLERANCE
                print(f"{'':>16} |   the engine's logits against the checkpoint's for the "
                      f"prompt without its last token: largest gap {back:.2e}")
    builder = {n: off["builder's config", n] for n in PROMPTS}
    shows = (builder["ending with id 31"] and off["builder's config", "as without its last token"]
             and not builder["without id 31"] and not builder["holding id 31 earlier"]
             and not any(off["pad_token_id 32", n] for n in PROMPTS))
    print("DEFECT SHOWN: a prompt ending with the padding (= end-of-sequence) id gets the "
          "logits of the prompt without it" if shows else "not shown")
    return 1 if shows else 0


if __name__ == "__main__":
    raise SystemExit(main())
