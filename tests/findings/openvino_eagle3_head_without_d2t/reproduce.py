"""optimum-intel 2.2.0 (the converter OpenVINO GenAI's EAGLE3 guide prescribes): an EAGLE-3 head
checkpoint without `d2t` (a head over the whole vocabulary, which needs no draft-to-target
map) converts with a `d2t` constant of uninitialized memory. Its LlamaEagle3Model registers
d2t and t2d as buffers made with torch.zeros, loading reports them "MISSING", and the IR's d2t
holds whatever the memory held; OpenVINO GenAI maps every drafted id through it. Standalone:
models built with transformers (../openvino_tiny.py: a 4-layer tiny Qwen3 target and a random
LlamaForCausalLMEagle3 head), converted with optimum-cli; no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: in some of the conversions of the head without d2t
the IR's d2t is not all 0, while the head with d2t written converts to all 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import (convert_command, eagle3_greedy, eagle3_models,  # noqa: E402
                           versions)

CONVERSIONS = 3
PROMPT = [0, 1, 2, 3, 4, 5, 6, 7]


def d2t_of(ir: Path) -> list:
    """The IR's d2t constant (the head's map from draft ids to target ids, as offsets)."""
    import openvino as ov
    model = ov.Core().read_model(str(ir / "openvino_model.xml"))
    found = [op for op in model.get_ordered_ops()
             if op.get_type_name() == "Constant" and "d2t" in op.get_friendly_name()]
    return [int(v) for v in found[0].get_vector()] if found else []


def run(target: Path, head: Path):
    """(tokens, drafted, accepted) of one greedy request with the head's rt_info naming layers
    0, 1, 2 (the Python API cannot pass them: ../openvino_eagle3_hidden_layers_list), or the
    exception's last line."""
    import openvino as ov
    model = ov.Core().read_model(str(head / "openvino_model.xml"))
    model.set_rt_info("0 1 2", ["hidden_layers_list"])
    ov.save_model(model, str(head / "layers.xml"), compress_to_fp16=False)
    del model
    for ext in (".xml", ".bin"):
        (head / f"layers{ext}").replace(head / f"openvino_model{ext}")
    return eagle3_greedy(target, head, PROMPT)


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-eagle3-d2t-"))
    target, with_d2t = eagle3_models(root / "with")
    _, without = eagle3_models(root / "without", d2t=False)
    print(f"with d2t written (all 0): the IR's d2t is {d2t_of(with_d2t)[:8]}... "
          f"all 0: {set(d2t_of(with_d2t)) == {0}}")
    source = root / "without" / "hf" / "head"
    report = subprocess.run(convert_command(source, root / "again")[:-1]
                            + ["--trust-remote-code", str(root / "again")],
                            capture_output=True, text=True)
    print("optimum-cli's load report for the head without d2t:")
    print("\n".join("   " + line for line in report.stdout.splitlines() + report.stderr.splitlines()
                    if "d2t" in line or "t2d" in line))
    garbage = 0
    for i in range(CONVERSIONS):
        ir = root / f"without-{i}"
        if i == 0:
            shutil.copytree(without, ir)
        else:
            done = subprocess.run(convert_command(source, ir)[:-1] + ["--trust-remote-code", str(ir)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
        values = d2t_of(ir)
        bad = set(values) != {0}
        garbage += bad
        print(f"without d2t, conversion {i + 1}: the IR's d2t {values[:6]}...  "
              f"{'not all 0' if bad else 'all 0'}")
    print(f"the head with d2t, greedy (tokens, drafted, accepted): {run(target, with_d2t)}")
    print(f"the head without d2t, conversion 1: {run(target, root / 'without-0')}")
    print(f"{garbage} of {CONVERSIONS} conversions without d2t hold a d2t that is not all 0")
    ok = garbage > 0 and set(d2t_of(with_d2t)) == {0}
    print("REPRODUCED" if ok else "NOT REPRODUCED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
