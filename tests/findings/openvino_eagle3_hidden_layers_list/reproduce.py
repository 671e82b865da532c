"""OpenVINO GenAI 2026.4.1: an EAGLE-3 draft's `hidden_layers_list` cannot be given through the
Python API. The property is read as a C++ vector of int32 (eagle3_model_transforms.cpp,
extract_eagle3_info_from_config), while the Python bindings turn a list of ints into a vector
of int64 (src/python/py_utils.cpp), so every list is refused: "hidden_layers_list must be a
vector of int32_t values". The same list written into the draft IR's rt_info is taken, and the
pipeline drafts. Standalone: the engine's Python API, models built with transformers (a 4-layer
tiny Qwen3 target and a random EAGLE-3 head in EAGLE-3's Llama-layer checkpoint format,
converted with optimum-cli); no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: the Python list is refused with that message and the
rt_info route runs and drafts.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import eagle3_greedy, eagle3_models, versions  # noqa: E402

LAYERS = [0, 1, 2]          # the outputs of target layers 0, 1, 2 (of 4)
PROMPT = [0, 1, 2, 3, 4, 5, 6, 7]


def with_rt_info(head: Path, out: Path, layers) -> Path:
    """A copy of the converted head whose rt_info holds hidden_layers_list."""
    import shutil
    import openvino as ov
    shutil.copytree(head, out)
    model = ov.Core().read_model(str(head / "openvino_model.xml"))
    model.set_rt_info(" ".join(map(str, layers)), ["hidden_layers_list"])
    ov.save_model(model, str(out / "openvino_model.xml"), compress_to_fp16=False)
    return out


def attempt(target: Path, head: Path, **draft_options):
    """(tokens, drafted, accepted) of one greedy request, or the exception's text."""
    return eagle3_greedy(target, head, PROMPT, **draft_options)


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-eagle3-layers-"))
    target, head = eagle3_models(root)
    print(f"target: 4 Qwen3 layers; head: EAGLE-3 (LlamaForCausalLMEagle3); "
          f"hidden_layers_list {LAYERS}; greedy, num_assistant_tokens 4, prompt {PROMPT}")
    listed = attempt(target, head, hidden_layers_list=LAYERS)
    print(f"1. draft_model(head, 'CPU', hidden_layers_list={LAYERS}):\n   {listed}")
    unset = attempt(target, head)
    print(f"2. no hidden_layers_list (the default needs 10 layers or more):\n   {unset}")
    written = attempt(target, with_rt_info(head, root / "ir" / "head-rt", LAYERS))
    print(f"3. the same list in the head IR's rt_info (tokens, drafted, accepted):\n   {written}")
    refused = isinstance(listed, str) and "must be a vector of int32_t values" in listed
    ran = isinstance(written, tuple) and written[1] > 0
    print("REPRODUCED" if refused and ran else "NOT REPRODUCED")
    return 0 if refused and ran else 1


if __name__ == "__main__":
    sys.exit(main())
