"""OpenVINO GenAI 2026.4.1: with prompt lookup, a request with a stop string that the output
meets fails with "Check 'm_generated_ids.size() >= n' failed at
src/cpp/src/sequence_group.hpp:221: Cannot remove more tokens than has been generated"; the
same request without prompt lookup stops where the string completes. Standalone: the engine's
Python API, models built with transformers (../tiny.py, ../openvino_tiny.py); no import of the
conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: the pipeline without prompt lookup answers each
request, and the prompt-lookup pipeline fails at least one of them.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import config, ids, openvino_models, pipeline, versions  # noqa: E402

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEF"   # token i is this string's i-th character
PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
MAX_NEW_TOKENS = 12


def answer(pipe, lookup: bool, stop: str):
    fields = {"stop_strings": {stop}}
    if lookup:
        fields.update(num_assistant_tokens=4, max_ngram_size=3)
    try:
        return [int(t) for t in pipe.generate(ids(PROMPT), config(pipe, MAX_NEW_TOKENS,
                                                                  **fields)).tokens[0]]
    except RuntimeError as exc:
        return "RuntimeError: " + " ".join(str(exc).split())[:300]


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-lookup-stop-"))
    _, target, _ = openvino_models(root)
    base, lookup = pipeline(target), pipeline(target, prompt_lookup=True)
    greedy = [int(t) for t in base.generate(ids(PROMPT), config(base, MAX_NEW_TOKENS)).tokens[0]]
    text = "".join(ALPHABET[t] for t in greedy)
    print(f"prompt {PROMPT}; greedy output {greedy} ({text!r})")
    # stop strings of two tokens that the greedy output meets, at each offset
    stops = sorted({text[i:i + 2] for i in range(len(text) - 1)})
    base_ok, lookup_failed = True, 0
    for stop in stops:
        without, with_lookup = answer(base, False, stop), answer(lookup, True, stop)
        base_ok &= not isinstance(without, str)
        lookup_failed += isinstance(with_lookup, str)
        print(f"stop string {stop!r}: without lookup {without}; prompt lookup {with_lookup}")
    reproduced = base_ok and lookup_failed > 0
    print(f"{lookup_failed} of {len(stops)} stop strings fail with prompt lookup")
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
