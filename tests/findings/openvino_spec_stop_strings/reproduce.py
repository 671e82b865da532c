"""OpenVINO GenAI 2026.4.1: under speculation a stop string that completes inside a block of
accepted tokens does not end the output where it completes: with a draft model the tokens after
it (to the end of the block) are returned, with prompt lookup the output may not stop at all.
The pipeline without speculation cuts each such output right before the stop string
(include_stop_str_in_output false). Standalone: the engine's Python API, models built with
transformers (../tiny.py, ../openvino_tiny.py); no import of the conformance kit.

    python reproduce.py

Greedy, max_new_tokens 12; for every string of 2 and 3 tokens in the greedy output, the output
of each pipeline with that stop string. Exit status 0 when the finding reproduces: the pipeline
without speculation always returns the greedy output cut before the string's first occurrence,
and the draft-model pipeline does not, for some string.
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


def answer(pipe, stop: str, speculative: dict):
    try:
        out = pipe.generate(ids(PROMPT), config(pipe, MAX_NEW_TOKENS, stop_strings={stop},
                                                **speculative)).tokens[0]
        return [int(t) for t in out]
    except RuntimeError as exc:
        return "RuntimeError: " + " ".join(str(exc).split())[-90:]


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-spec-stop-"))
    _, target, _ = openvino_models(root)
    base = pipeline(target)
    greedy = [int(t) for t in base.generate(ids(PROMPT), config(base, MAX_NEW_TOKENS)).tokens[0]]
    text = "".join(ALPHABET[t] for t in greedy)
    print(f"prompt {PROMPT}; greedy output {greedy} ({text!r})")
    pipes = {"draft model (the target itself)": (pipeline(target, draft=target),
                                                 {"num_assistant_tokens": 4}),
             "prompt lookup": (pipeline(target, prompt_lookup=True),
                               {"num_assistant_tokens": 4, "max_ngram_size": 3})}
    stops = sorted({text[i:i + n] for n in (2, 3) for i in range(len(text) - n + 1)})
    base_right, wrong = True, {name: 0 for name in pipes}
    for stop in stops:
        start = text.find(stop)
        # a string completing at the last token is not cut by any pipeline here: left out
        if start + len(stop) >= MAX_NEW_TOKENS:
            continue
        expected = greedy[:start]
        got = answer(base, stop, {})
        base_right &= got == expected
        line = [f"stop {stop!r} (tokens {start}..{start + len(stop) - 1}): expected {expected}"]
        if got != expected:
            line.append(f"WITHOUT SPECULATION {got}")
        for name, (pipe, fields) in pipes.items():
            out = answer(pipe, stop, fields)
            if out != expected:
                wrong[name] += 1
                line.append(f"{name} {out}")
        print("; ".join(line))
    print(f"without speculation: {'every output cut right' if base_right else 'WRONG too'}; "
          + "; ".join(f"{name}: {n} wrong" for name, n in wrong.items()))
    reproduced = base_right and wrong["draft model (the target itself)"] > 0
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
