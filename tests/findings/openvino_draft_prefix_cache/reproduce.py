"""OpenVINO GenAI 2026.4.1: with a draft model, sampling, and LLMPipeline's default
SchedulerConfig (prefix caching on), generate fails a request now and then with "Check
'content_length <= prompt_ids.size() + m_generated_ids.size()' failed at
src/cpp/src/sequence_group.cpp:32", and from then on the pipeline answers a seeded request
differently than it did before the failure. With prefix caching off, or without the draft,
no request fails and seeds replay. Standalone: the engine's Python API, models built with
transformers (../tiny.py, ../openvino_tiny.py); no import of the conformance kit.

    python reproduce.py

For each pipeline: the answer to seed 0, then seeds 1..SEEDS-1 (counting failures), then seed
0 again. Exit status 0 when the finding reproduces: the default pipeline fails at least one
request and then answers seed 0 otherwise, while the pipeline with prefix caching off and the
one without a draft fail none and replay seed 0.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import config, ids, openvino_models, pipeline, versions  # noqa: E402

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
MAX_NEW_TOKENS = 8
SEEDS = 200


def answer(pipe, seed: int, speculative: bool):
    fields = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "rng_seed": seed}
    if speculative:
        fields["num_assistant_tokens"] = 4
    try:
        return [int(t) for t in pipe.generate(ids(PROMPT), config(pipe, MAX_NEW_TOKENS,
                                                                  **fields)).tokens[0]]
    except RuntimeError as exc:
        return "RuntimeError: " + " ".join(str(exc).split())


def trial(name: str, pipe, speculative: bool) -> tuple[int, bool]:
    first = answer(pipe, 0, speculative)
    failed = {}
    for seed in range(1, SEEDS):
        got = answer(pipe, seed, speculative)
        if isinstance(got, str):
            failed[seed] = got
    last = answer(pipe, 0, speculative)
    print(f"{name}: {len(failed)} of {SEEDS - 1} requests failed (seeds {sorted(failed)})")
    for seed, message in list(failed.items())[:2]:
        print(f"  seed {seed}: {message[:330]}")
    print(f"  seed 0 first: {first}\n  seed 0 after: {last}")
    return len(failed), first == last


def scheduler(prefix_caching: bool):
    import openvino_genai as genai
    s = genai.SchedulerConfig()
    # LLMPipeline's default (utils.cpp get_latency_oriented_scheduler_config), then the switch
    s.max_num_batched_tokens = 2**63 - 1
    s.enable_prefix_caching = prefix_caching
    return s


def main() -> int:
    import openvino_genai as genai
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-draft-prefix-cache-"))
    _, target, draft = openvino_models(root)
    print(f"models under {root}; prompt {PROMPT}, max_new_tokens {MAX_NEW_TOKENS}, "
          f"temperature 1.0, num_assistant_tokens 4")
    default = trial("draft model, default SchedulerConfig", pipeline(target, draft), True)
    device = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    off = genai.LLMPipeline(str(target), "CPU", scheduler_config=scheduler(False),
                            draft_model=genai.draft_model(str(draft), "CPU", **device), **device)
    no_cache = trial("draft model, prefix caching off", off, True)
    plain = trial("no draft, default SchedulerConfig", pipeline(target), False)
    reproduced = (default[0] > 0 and not default[1] and no_cache == (0, True)
                  and plain == (0, True))
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
