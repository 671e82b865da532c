"""OpenVINO GenAI 2026.4.1: with an EAGLE-3 draft, a request whose prompt is one token fails.
The continuous-batching EAGLE-3 pipeline makes the draft's input by dropping the prompt's first
token (eagle3_strategy.cpp, create_draft_input_ids) and asserts that at least two are there:
"input_ids shape is invalid for creating eagle3 draft input_ids". The same pipeline answers a
two-token prompt, and the target without a draft answers the one-token prompt. Standalone: the
engine's Python API, models built with transformers (../openvino_tiny.py: a 4-layer tiny Qwen3
target and a random EAGLE-3 head in EAGLE-3's Llama-layer checkpoint format, converted with
optimum-cli); no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: the one-token prompt fails with that message while
the two-token prompt and the pipeline without a draft answer.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import (DEVICE, config, eagle3_greedy, eagle3_models, ids,  # noqa: E402
                           versions)

LAYERS = "0 1 2"        # hidden_layers_list: the outputs of target layers 0, 1, 2 (of 4)
MESSAGE = "input_ids shape is invalid for creating eagle3 draft input_ids"


def head_reading(head: Path, out: Path) -> Path:
    """A copy of the converted head whose rt_info holds hidden_layers_list (the Python API
    cannot pass it: ../openvino_eagle3_hidden_layers_list)."""
    import openvino as ov
    shutil.copytree(head, out)
    model = ov.Core().read_model(str(head / "openvino_model.xml"))
    model.set_rt_info(LAYERS, ["hidden_layers_list"])
    ov.save_model(model, str(out / "openvino_model.xml"), compress_to_fp16=False)
    return out


def plain(target: Path, prompt, max_new_tokens: int = 8):
    """The target alone (no draft): its greedy tokens."""
    import openvino_genai as genai
    pipe = genai.LLMPipeline(str(target), "CPU", **DEVICE)
    return list(pipe.generate(ids(prompt), config(pipe, max_new_tokens)).tokens[0])


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-eagle3-one-token-"))
    target, head = eagle3_models(root)
    head = head_reading(head, root / "ir" / "head-layers")
    print(f"target: 4 Qwen3 layers; head: EAGLE-3 (LlamaForCausalLMEagle3), hidden_layers_list "
          f"[{LAYERS}] in its rt_info; greedy, num_assistant_tokens 4, max_new_tokens 8")
    one = eagle3_greedy(target, head, [5], max_new_tokens=8)
    print(f"1. EAGLE-3, prompt [5]:\n   {one}")
    two = eagle3_greedy(target, head, [5, 6], max_new_tokens=8)
    print(f"2. EAGLE-3, prompt [5, 6] (tokens, drafted, accepted):\n   {two}")
    alone = plain(target, [5])
    print(f"3. no draft, prompt [5]:\n   {alone}")
    failed = isinstance(one, str) and MESSAGE in one
    answered = isinstance(two, tuple) and len(two[0]) == 8 and len(alone) == 8
    print("REPRODUCED" if failed and answered else "NOT REPRODUCED")
    return 0 if failed and answered else 1


if __name__ == "__main__":
    sys.exit(main())
