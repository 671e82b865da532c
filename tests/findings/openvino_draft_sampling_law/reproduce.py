"""OpenVINO GenAI 2026.4.1: with a draft model and sampling, the speculated tokens are not
distributed as the target's sampling: with an independent draft they follow the draft. The
first token (the prefill's, never speculated) is exact. Standalone: the engine's Python API,
models built with transformers (../tiny.py, ../openvino_tiny.py), scipy for the tests; no
import of the conformance kit.

    python reproduce.py

Each pipeline samples N requests of 3 tokens (seeds 0..N-1): the first token comes from the
prefill, the second is the one draft token the last round proposes (the draft pauses at
max_new_tokens - 1), the third the target's. The first two tokens are tested against their
exact joint law (float64, transformers, from the checkpoint converted), cells with an expected
count below 5 pooled. Pipelines: without a draft; with the target's early-exit draft; with an
independent random draft (the early-exit draft of a second tiny target). All with prefix
caching off, so that tests/findings/openvino_draft_prefix_cache cannot interfere.
Exit status 0 when the finding reproduces: the pipeline without a draft passes (p > 1e-3) and
the one with the independent draft fails (p < 1e-6).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import (DEVICE, add_special_token, config, convert_command, exact_law,  # noqa: E402
                           ids, openvino_models, tiny_models, versions)

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
TEMPERATURE = 1.0
N = 1000


def pipeline(target, draft):
    import openvino_genai as genai
    s = genai.SchedulerConfig()
    s.max_num_batched_tokens = 2**63 - 1     # LLMPipeline's default, prefix caching off
    s.enable_prefix_caching = False
    options = dict(DEVICE, scheduler_config=s)
    if draft is not None:
        options["draft_model"] = genai.draft_model(str(draft), "CPU", **DEVICE)
    return genai.LLMPipeline(str(target), "CPU", **options)


def sample(pipe, speculative: bool) -> tuple[Counter, int, int]:
    pairs, drafted, accepted = Counter(), 0, 0
    for seed in range(N):
        fields = {"do_sample": True, "temperature": TEMPERATURE, "top_p": 1.0, "rng_seed": seed}
        if speculative:
            fields["num_assistant_tokens"] = 4
        result = pipe.generate(ids(PROMPT), config(pipe, 3, **fields))
        tokens = [int(t) for t in result.tokens[0]]
        pairs[tuple(tokens[:2])] += 1
        if speculative:
            m = result.extended_perf_metrics
            drafted += m.get_num_draft_tokens()
            accepted += m.get_num_accepted_tokens()
    return pairs, drafted, accepted


def chi_square(observed: Counter, law: dict) -> tuple[float, int, float]:
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


def independent_draft(root: Path) -> Path:
    """A 1-layer random model unrelated to the target: the early-exit draft of another target."""
    _, other = tiny_models(root / "other-hf", seed=2)
    add_special_token(other)
    out = root / "ir" / "independent-draft"
    done = subprocess.run(convert_command(other, out), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"optimum-cli failed on {other}:\n{done.stderr[-3000:]}")
    return out


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-draft-law-"))
    hf_target, target, draft = openvino_models(root)
    other = independent_draft(root)
    law = exact_law(hf_target, PROMPT, TEMPERATURE)
    print(f"models under {root}; prompt {PROMPT}, temperature {TEMPERATURE}, max_new_tokens 3, "
          f"{N} seeds per pipeline; the first two tokens against their exact joint law")
    p_values = {}
    for name, d in (("no draft", None), ("early-exit draft", draft),
                    ("independent draft", other)):
        pairs, drafted, accepted = sample(pipeline(target, d), d is not None)
        stat, dof, p = chi_square(pairs, law)
        p_values[name] = p
        top = ", ".join(f"{k}: {v} (exact {law.get(k, 0.0) * N:.1f})"
                        for k, v in pairs.most_common(4))
        counts = f"; reported drafted {drafted}, accepted {accepted}" if d is not None else ""
        print(f"{name}: chi-square {stat:.1f} on {dof} dof, p = {p:.3g}{counts}\n  most "
              f"frequent: {top}")
    reproduced = p_values["no draft"] > 1e-3 and p_values["independent draft"] < 1e-6
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
