"""llama.cpp llama-server: under speculative decoding, `n_probs` reports logprob 0.0 (and no
top logprobs) for every token that comes out of a verification step, instead of the target's
logprob. Standalone: plain HTTP, the model built with transformers and converted with
llama.cpp's own convert_hf_to_gguf.py; no import of the conformance kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # builds the tiny checkpoint, converts it to GGUF (float32), starts llama-server
        # without and then with n-gram speculation, sends the same requests to both and
        # compares every returned logprob with the checkpoint's float64 log-softmax
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoint and target.gguf under DIR, prints the server command
        # lines and the requests (to run by hand)

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Run it with a Python that
has torch, transformers, numpy and safetensors (what convert_hf_to_gguf.py needs). Exit status
0 when the finding reproduces: every logprob of the server without speculation is within
1e-3 of the exact one, and the speculating server returns 0.0 where the exact logprob is not.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the tiny model, its GGUF and llama-server's start, stop and requests: shared by the llama.cpp
# reproductions (llamacpp_tiny.py, beside this folder; no kit imports)
from llamacpp_tiny import (NEUTRAL, curl_line, free_port, post, prepare, server_argv, start,
                           stop)  # noqa: E402

TOLERANCE = 1e-3
SLOTS = 4
NGRAM_FLAGS = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
               "--spec-ngram-simple-size-m", "4", "--spec-draft-n-max", "4"]
# prompts that repeat themselves, so that the n-gram lookup finds matches and drafts
REQUESTS = [dict(NEUTRAL, prompt=prompt, n_predict=12, n_probs=2, temperature=t, seed=9)
            for prompt, t in (([8, 1, 7, 3, 8, 1, 7, 3], 1.0), ([8, 1, 7, 3, 8, 1, 7, 3], 0.0),
                              ([5, 6, 5, 6, 5, 6], 1.0), ([5, 6, 5, 6, 5, 6], 0.0),
                              ([1, 2, 3, 1, 2, 3, 1, 2, 3], 1.0))]


# --------------------------------------------------------------------------- exact logprobs

class Exact:
    """The checkpoint's log-softmax in float64 (the logprobs llama-server reports with
    post_sampling_probs off: the target's raw distribution, before any sampler)."""

    def __init__(self, target: Path):
        import torch
        from transformers import Qwen3ForCausalLM
        self.torch = torch
        self.model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float64).eval()

    def logprobs(self, prompt: list, tokens: list) -> list:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([prompt + tokens])).logits[0]
        table = self.torch.log_softmax(logits, -1)
        return [float(table[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def check(name: str, url: str, exact: Exact) -> tuple[int, int, int]:
    """(positions, positions off by more than TOLERANCE, of those the ones reported as 0.0)"""
    positions = wrong = zero = 0
    for body in REQUESTS:
        answer = post(url, body)
        tokens = answer["tokens"]
        entries = answer["completion_probabilities"]
        got = [e["logprob"] for e in entries]
        tops = [len(e.get("top_logprobs") or []) for e in entries]
        want = exact.logprobs(body["prompt"], tokens)
        timings = answer.get("timings") or {}
        off = [i for i, (g, w) in enumerate(zip(got, want)) if abs(g - w) > TOLERANCE]
        positions += len(tokens)
        wrong += len(off)
        zero += sum(got[i] == 0.0 for i in off)
        print(f"  prompt {body['prompt']}, temperature {body['temperature']}: "
              f"drafted {timings.get('draft_n', 0)}, accepted {timings.get('draft_n_accepted', 0)}"
              f"\n    tokens           {tokens}"
              f"\n    returned logprob {[round(g, 4) for g in got]}"
              f"\n    exact (float64)  {[round(w, 4) for w in want]}"
              f"\n    top_logprobs     {tops} entries (n_probs {body['n_probs']})"
              f"\n    off by > {TOLERANCE}: positions {off}"
              + (" (all returned as 0.0)" if off and all(got[i] == 0.0 for i in off) else ""))
    print(f"  {name}: {wrong} of {positions} logprobs off, {zero} of them 0.0")
    return positions, wrong, zero


# --------------------------------------------------------------------------- main

def main() -> int:
    args, server, root, target, gguf = prepare(__doc__, "llama-lp-")
    print(f"checkpoint {target}, GGUF {gguf}")
    if args.models:
        for name, spec in (("without speculation", []), ("with n-gram speculation", NGRAM_FLAGS)):
            print(f"{name}:\n  {shlex.join(server_argv(server, gguf, 8080, spec, SLOTS))}")
        print("requests:\n  " + "\n  ".join(curl_line(b) for b in REQUESTS))
        return 0
    exact = Exact(target)
    result = {}
    for name, spec in (("baseline (no speculation)", False), ("n-gram speculation", True)):
        argv = server_argv(server, gguf, free_port(), NGRAM_FLAGS if spec else [], SLOTS)
        print(f"--- {name}\n    server: {shlex.join(argv)}")
        process, url = start(argv, root / f"server-{'ngram' if spec else 'plain'}.log")
        try:
            result[spec] = check(name, url, exact)
        finally:
            stop(process)
    _, base_wrong, _ = result[False]
    _, spec_wrong, spec_zero = result[True]
    reproduced = base_wrong == 0 and spec_wrong > 0 and spec_zero == spec_wrong
    print("REPRODUCED: the speculating server returns logprob 0.0 where the target's is not; "
          "the plain server's logprobs are exact" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
