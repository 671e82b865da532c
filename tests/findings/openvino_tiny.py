"""Shared by the OpenVINO GenAI reproductions in this folder (none imports the conformance kit):
the tiny Qwen3 checkpoints of ../tiny.py converted to OpenVINO IR with optimum-cli, and an
LLMPipeline fed token ids.

Run with the Python of an environment holding openvino-genai 2026.4.1.0, optimum-intel 2.2.0
(its `optimum-cli` beside that Python), transformers < 5.6 and scipy:

    python -m venv ov && ov/bin/pip install openvino-genai==2026.4.1.0 \
        "optimum-intel[openvino]==2.2.0" "transformers<5.6" scipy
    ov/bin/pip uninstall -y torchvision       # its import breaks the export

(pip pulls a CUDA build of torch unless torch 2.13.0+cpu is installed first, from
https://download.pytorch.org/whl/cpu.)

The tokenizer: ../tiny.py writes a byte-level BPE of 32 one-character tokens with no merges
and no added token, which openvino-tokenizers 2026.4.1 does not convert ("Incorrect number of
inputs passed to BPETokenizer"), and a speculative LLMPipeline does not start without one. With
one added special token at id 32 it converts, and maps every id to itself; the models' 32
logits never reach id 32, which also serves as the end-of-sequence id (the checkpoints name
none, and the pipeline refuses the null one).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import exact_law, tiny_models  # noqa: E402,F401  (exact_law: for the callers)

EOS = 32     # no model emits it: 32 logits


def add_special_token(model_dir: Path) -> None:
    """Rewrite the checkpoint's tokenizer.json with "<|endoftext|>" added at id 32."""
    from tokenizers import AddedToken, Tokenizer
    path = model_dir / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    assert tokenizer.token_to_id("<|endoftext|>") == EOS
    tokenizer.save(str(path))


def convert_command(model_dir: Path, out: Path) -> list:
    cli = Path(sys.executable).with_name("optimum-cli")
    return [str(cli), "export", "openvino", "--model", str(model_dir), "--task",
            "text-generation-with-past", "--weight-format", "fp32", str(out)]


def openvino_models(root: Path) -> tuple[Path, Path, Path]:
    """(HF target, IR target, IR draft) under `root`: ../tiny.py's checkpoints (a 2-layer
    target and its early-exit draft), their tokenizer given the added token, converted."""
    target, draft = tiny_models(root / "hf")
    out = []
    for model in (target, draft):
        add_special_token(model)
        ir = root / "ir" / model.name
        done = subprocess.run(convert_command(model, ir), capture_output=True, text=True)
        if done.returncode != 0 or not (ir / "openvino_tokenizer.xml").exists():
            sys.exit(f"optimum-cli failed on {model}:\n{done.stderr[-3000:]}")
        out.append(ir)
    return target, out[0], out[1]


DEVICE = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def pipeline(target: Path, draft: Path | None = None, prompt_lookup: bool = False):
    import openvino_genai as genai
    options = dict(DEVICE)
    if draft is not None:
        options["draft_model"] = genai.draft_model(str(draft), "CPU", **DEVICE)
    if prompt_lookup:
        options["prompt_lookup"] = True
    return genai.LLMPipeline(str(target), "CPU", **options)


def config(pipe, max_new_tokens: int, **fields):
    """The pipeline's generation config: end of sequence at EOS (never emitted), no stop id
    unless given, then `fields` (GenerationConfig attributes)."""
    c = pipe.get_generation_config()
    c.set_eos_token_id(EOS)
    c.stop_token_ids = set()
    c.ignore_eos = True
    c.max_new_tokens = max_new_tokens
    for key, value in fields.items():
        setattr(c, key, value)
    return c


def ids(prompt) -> "object":
    import numpy as np
    import openvino as ov
    return ov.Tensor(np.array([list(prompt)], dtype=np.int64))


def versions() -> str:
    from importlib.metadata import version
    return ", ".join(f"{p} {version(p)}" for p in ("openvino-genai", "openvino",
                                                    "openvino-tokenizers", "optimum-intel",
                                                    "transformers", "torch"))
