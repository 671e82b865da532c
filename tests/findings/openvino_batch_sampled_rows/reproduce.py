"""OpenVINO GenAI 2026.4.1: with a draft model, a sampled request answered inside a batch of
ContinuousBatchingPipeline.generate, behind another request, is not sampled as it is alone:
its seed gives another output, and its law moves away from the target's, even with the target
as its own draft. The same pipeline without a draft answers it identically both ways.
Standalone: the engine's Python API, models built with transformers (../tiny.py,
../openvino_tiny.py), scipy for the tests; no import of the conformance kit.

    python reproduce.py

1. Seeds. For each pipeline (a draft model: the target itself, then its early-exit draft; no
   draft) and each of SEEDS seeds: the seeded request alone (twice: the seed replays alone),
   then as the last row of one generate call after the greedy rows BESIDE.
2. Law. With the target as its own draft and without a draft: N seeded requests alone and N
   inside the batch; the first two tokens of each against their exact joint law (float64,
   transformers, the checkpoint converted), and alone against inside the batch (two-sample
   chi-square); cells with an expected count below 5 pooled.
Exit status 0 when the finding reproduces: with each draft some seed moves inside the batch
although it replays alone, and none without a draft; without a draft both samples fit the
exact law (p > 1e-3), and with the target as its own draft the batch's sample differs from
the one alone (p < 1e-6).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import DEVICE, EOS, exact_law, openvino_models, versions  # noqa: E402

PROMPT = [5]               # the seeded sampled request: temperature 1, 3 new tokens
MAX_NEW_TOKENS = 3
# greedy requests in the same call: other prompts and lengths, as a server's batch has
BESIDE = [([3, 9, 27, 3, 9, 27, 3, 9], 16), ([30, 1, 17, 8, 12], 12), ([7, 7, 7, 7], 2),
          ([2, 4], 5)]
SEEDS = 40
N = 400      # requests per sample of the law


def scheduler():
    import openvino_genai as genai
    s = genai.SchedulerConfig()
    # LLMPipeline's default (utils.cpp get_latency_oriented_scheduler_config) with prefix
    # caching off (with it on, a sampled request with a draft can fail: ../openvino_draft_prefix_cache)
    s.max_num_batched_tokens = 2**63 - 1
    s.enable_prefix_caching = False
    return s


def config(pipe, max_new_tokens: int, speculative: bool, **fields):
    c = pipe.get_config()
    c.set_eos_token_id(EOS)
    # ContinuousBatchingPipeline checks that the stop ids hold the end-of-sequence id (never
    # emitted here: the models have 32 logits)
    c.stop_token_ids = {EOS}
    c.ignore_eos = True
    c.max_new_tokens = max_new_tokens
    if speculative:
        c.num_assistant_tokens = 4
    for key, value in fields.items():
        setattr(c, key, value)
    return c


def rows(pipe, seed: int, speculative: bool, batch: bool):
    """The seeded request's output, alone or as the last row of a batch after BESIDE (as
    the first row it keeps its output: the row's place in the call matters)."""
    import numpy as np
    import openvino as ov
    prompts = ([p for p, _ in BESIDE] if batch else []) + [PROMPT]
    configs = ([config(pipe, n, speculative, do_sample=False) for _, n in BESIDE]
               if batch else [])
    configs.append(config(pipe, MAX_NEW_TOKENS, speculative, do_sample=True, temperature=1.0,
                          rng_seed=seed))
    tensors = [ov.Tensor(np.array([p], dtype=np.int64)) for p in prompts]
    results = pipe.generate(tensors, configs)
    return [int(t) for t in results[-1].m_generation_ids[0]]


def trial(name: str, pipe, speculative: bool) -> tuple[int, int]:
    """(seeds that moved inside the batch, seeds that did not replay alone)."""
    moved, unstable = [], []
    for seed in range(SEEDS):
        alone, again = rows(pipe, seed, speculative, False), rows(pipe, seed, speculative, False)
        inside = rows(pipe, seed, speculative, True)
        if alone != again:
            unstable.append(seed)
        elif inside != alone:
            moved.append((seed, alone, inside))
    print(f"{name}: {len(moved)} of {SEEDS} seeds give another output inside the batch; "
          f"{len(unstable)} do not replay alone")
    for seed, alone, inside in moved[:3]:
        print(f"  seed {seed}: alone {alone}, inside the batch {inside}")
    return len(moved), len(unstable)


def chi_square(observed: Counter, law: dict) -> tuple[float, int, float]:
    """Against an exact law: (statistic, degrees of freedom, p)."""
    from scipy.stats import chi2
    n = sum(observed.values())
    stat, cells, pooled_o, pooled_e = 0.0, 0, 0, 0.0
    for outcome in set(law) | set(observed):
        e, o = law.get(outcome, 0.0) * n, observed.get(outcome, 0)
        if e < 5:
            pooled_o, pooled_e = pooled_o + o, pooled_e + e
        else:
            stat, cells = stat + (o - e) ** 2 / e, cells + 1
    if pooled_e > 0:
        stat, cells = stat + (pooled_o - pooled_e) ** 2 / pooled_e, cells + 1
    return stat, cells - 1, float(chi2.sf(stat, cells - 1))


def two_sample(a: Counter, b: Counter) -> tuple[float, int, float]:
    """Two samples of one law? A contingency chi-square; outcomes seen under 5 times in both
    together pooled."""
    from scipy.stats import chi2_contingency
    keys = sorted(set(a) | set(b))
    big = [k for k in keys if a[k] + b[k] >= 5]
    rest = [k for k in keys if a[k] + b[k] < 5]
    table = [[a[k] for k in big], [b[k] for k in big]]
    if rest:
        table[0].append(sum(a[k] for k in rest))
        table[1].append(sum(b[k] for k in rest))
    stat, p, dof, _ = chi2_contingency(table)
    return float(stat), int(dof), float(p)


def law_trial(name: str, pipe, speculative: bool, law: dict) -> tuple[float, float, float]:
    """(p alone vs exact, p inside vs exact, p alone vs inside) of the first two tokens."""
    alone, inside = Counter(), Counter()
    for seed in range(10_000, 10_000 + N):
        alone[tuple(rows(pipe, seed, speculative, False)[:2])] += 1
        inside[tuple(rows(pipe, seed, speculative, True)[:2])] += 1
    p_alone, p_inside = chi_square(alone, law)[2], chi_square(inside, law)[2]
    stat, dof, p_two = two_sample(alone, inside)
    print(f"{name}, first two tokens of {N} requests: against the exact law p = {p_alone:.3g} "
          f"alone, p = {p_inside:.3g} inside the batch; alone against inside: chi-square "
          f"{stat:.1f} on {dof} dof, p = {p_two:.3g}")
    for k in sorted(set(alone.most_common(3) + inside.most_common(3)), key=lambda kv: -kv[1]):
        key = k[0]
        print(f"  {list(key)}: alone {alone[key]}, inside {inside[key]}, exact "
              f"{law.get(key, 0.0) * N:.1f}")
    return p_alone, p_inside, p_two


def main() -> int:
    import openvino_genai as genai
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-batch-sampled-rows-"))
    hf_target, target, draft = openvino_models(root)
    print(f"models under {root}; seeded request: prompt {PROMPT}, max_new_tokens "
          f"{MAX_NEW_TOKENS}, temperature 1.0; batch: {len(BESIDE)} greedy rows "
          f"{BESIDE}, then it; num_assistant_tokens 4; SchedulerConfig: prefix caching off")

    def pipe(draft_dir):
        options = dict(DEVICE)
        if draft_dir is not None:
            options["draft_model"] = genai.draft_model(str(draft_dir), "CPU", **DEVICE)
        return genai.ContinuousBatchingPipeline(str(target), scheduler(), "CPU", options)

    perfect = trial("draft model = the target itself", pipe(target), True)
    early = trial("draft model = the early-exit draft", pipe(draft), True)
    plain = trial("no draft", pipe(None), False)
    law = exact_law(hf_target, PROMPT, 1.0)
    perfect_law = law_trial("draft model = the target itself", pipe(target), True, law)
    plain_law = law_trial("no draft", pipe(None), False, law)
    reproduced = (perfect[0] > 0 and early[0] > 0 and perfect[1] == early[1] == 0
                  and plain == (0, 0) and min(plain_law[:2]) > 1e-3 and perfect_law[2] < 1e-6)
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
