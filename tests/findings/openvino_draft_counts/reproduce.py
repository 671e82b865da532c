"""OpenVINO GenAI 2026.4.1: extended_perf_metrics leaves the last speculative round of a
request out of its counts. With the target as its own draft every proposal is accepted, so the
tokens each verification step commits beyond one are accepted draft tokens; the main model's
own step sizes (main_model_metrics.raw_metrics.m_batch_sizes) show them, and
get_num_accepted_tokens() / get_num_draft_tokens() report fewer (get_num_draft_tokens() 0 with
4 accepted for a single round). Standalone: the engine's Python API, models built with
transformers (../tiny.py, ../openvino_tiny.py); no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: for some max_new_tokens the reported counts differ
from the accepted tokens the step sizes show.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import config, ids, openvino_models, pipeline, versions  # noqa: E402

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
K = 4


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-draft-counts-"))
    _, target, _ = openvino_models(root)
    pipe = pipeline(target, draft=target)     # the target drafts for itself: all accepted
    wrong = 0
    print(f"greedy, num_assistant_tokens {K}, the target as its own draft; prompt {PROMPT}")
    print("max_new_tokens | main model's tokens per step | accepted by the steps | "
          "get_num_draft_tokens | get_num_accepted_tokens")
    for n in range(2, 15):
        result = pipe.generate(ids(PROMPT), config(pipe, n, num_assistant_tokens=K))
        m = result.extended_perf_metrics
        steps = list(m.main_model_metrics.raw_metrics.m_batch_sizes)
        accepted = sum(s - 1 for s in steps[1:])    # the first step is the prefill's token
        drafted, reported = m.get_num_draft_tokens(), m.get_num_accepted_tokens()
        mark = "" if drafted == accepted == reported else "   <- differs"
        wrong += bool(mark)
        print(f"{n:14} | {steps} | {accepted} | {drafted} | {reported}{mark}")
    print(f"{wrong} of 13 requests report counts other than their steps show")
    print("REPRODUCED" if wrong else "NOT REPRODUCED")
    return 0 if wrong else 1


if __name__ == "__main__":
    sys.exit(main())
