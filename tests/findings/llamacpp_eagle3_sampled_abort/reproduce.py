"""llama.cpp llama-server with `--spec-type draft-eagle3` and `-np 4` aborts (the whole process
dies) on ONE /completion request with three prompts, on a fresh server:
`get_sub_batch: failed to add token 1088854405 at index 0` (the token id is the bit pattern of a
float, 7.206). The EAGLE-3 drafter reads its first draft candidates for slot 1 from the
backend-sampling output buffer, where they have been overwritten by slot 2's top-k logits.
Controls, the same request each: with `--no-spec-draft-backend-sampling`, with `--spec-type
draft-simple` and a draft model, and with the three prompts sent one after another, the server
survives. Standalone: plain HTTP, no import of the conformance kit.

    python reproduce.py --llama-server PATH --target target.gguf --head head-eagle3.gguf \
        [--draft draft.gguf] [--runs 2]

LLAMA_SERVER may stand for --llama-server. --draft (any small draft model for the target,
here the kit's early exit) adds the draft-simple control. Exit status 0 when the finding
reproduces: every fresh eagle3 server dies with the abort line on the request (greedy, and
once sampled), and every control survives it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import struct
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import curl_line, free_port, server_argv, start, stop, version  # noqa: E402

# the kit's eagle3 serving flags: K = 4, every round drafts K tokens (n-min 0, p-min 0)
EAGLE3 = ["--spec-type", "draft-eagle3", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
          "--spec-draft-p-min", "0", "-td", "1"]
# three prompts in one request: the server starts them in one loop iteration on slots 3, 2, 1
# (a fresh server hands out free slots from the highest id), so the first draft round drafts
# for slots 1, 2 and 3 in one batch of the draft context
PROMPTS = [[22, 23], [5], [1, 2, 3, 4]]
GREEDY = {"prompt": PROMPTS, "n_predict": 4, "temperature": 0.0, "cache_prompt": False,
          "return_tokens": True}
SAMPLED = dict(GREEDY, temperature=1.0, seed=7)
ABORT = re.compile(r"get_sub_batch: failed to add token (-?\d+) at index (\d+) .*")


def send(url: str, body: dict) -> str:
    """POST one body; a short account of the answer, or of how the connection failed."""
    request = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            data = json.loads(answer.read())
        rows = data if isinstance(data, list) else [data]
        return "answered: " + "; ".join(f"tokens {r.get('tokens')}" for r in rows)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode()[:200]}"
    except (OSError, ValueError) as exc:   # the server died with the request in flight
        return f"no answer ({type(exc).__name__}: {exc})"


def trial(server, args, root: Path, name: str, spec: list, bodies: list) -> dict:
    """A fresh llama-server with `spec`; `bodies` sent one after another; whether it died."""
    argv = server_argv(server, Path(args.target), free_port(), spec, slots=4)
    log = root / (re.sub(r"\W+", "-", name).strip("-") + ".log")
    process, url = start(argv, log)
    try:
        answers = [send(url, body) for body in bodies]
        deadline = time.monotonic() + 5    # the abort prints a backtrace before the exit
        while process.poll() is None and time.monotonic() < deadline:
            if "no answer" not in answers[-1]:
                break
            time.sleep(0.2)
        died = process.poll() is not None
    finally:
        stop(process)
    text = log.read_text(errors="replace")
    match = ABORT.search(text)
    print(f"--- {name}\n    server: {shlex.join(argv)}\n    log: {log}")
    for body, answer in zip(bodies, answers):
        print(f"    {curl_line(body, url)}\n      -> {answer}")
    if match:
        token = int(match.group(1))
        as_float = struct.unpack("<f", struct.pack("<i", token))[0]
        print(f"    log: {match.group(0).strip()}\n    token {token} = 0x{token & 0xffffffff:08x}"
              f", as float32 bits {as_float:.4f}")
    print(f"    server process died: {died}")
    return {"died": died, "abort": bool(match)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    parser.add_argument("--target", required=True, help="the target model's GGUF")
    parser.add_argument("--head", required=True, help="the EAGLE-3 head's GGUF")
    parser.add_argument("--draft", help="a draft model's GGUF for the draft-simple control")
    parser.add_argument("--runs", type=int, default=2, help="fresh eagle3 servers (default 2)")
    parser.add_argument("--logs", help="folder for the server logs (default: a temporary one)")
    args = parser.parse_args()
    if not args.llama_server:
        parser.error("give --llama-server (or LLAMA_SERVER)")
    server = Path(args.llama_server).resolve()
    root = Path(args.logs or tempfile.mkdtemp(prefix="llama-eagle3-abort-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    print(f"llama-server: {version(server)}\ntarget {args.target}\nhead {args.head}")
    head = ["-md", str(Path(args.head).resolve())]

    bad = [trial(server, args, root, f"eagle3, run {i + 1}", head + EAGLE3, [GREEDY])
           for i in range(args.runs)]
    bad.append(trial(server, args, root, "eagle3, the request sampled", head + EAGLE3, [SAMPLED]))
    # controls: the same request (or prompts) where the server should survive
    good = [trial(server, args, root, "control: eagle3 --no-spec-draft-backend-sampling",
                  head + EAGLE3 + ["--no-spec-draft-backend-sampling"], [GREEDY]),
            trial(server, args, root, "control: eagle3, the three prompts one after another",
                  head + EAGLE3, [dict(GREEDY, prompt=p) for p in PROMPTS])]
    if args.draft:
        simple = ["-md", str(Path(args.draft).resolve()), "--spec-type", "draft-simple"] + EAGLE3[2:]
        good.append(trial(server, args, root, "control: draft-simple with a draft model",
                          simple, [GREEDY]))
    else:
        print("--- control draft-simple skipped (no --draft)")
    killed = sum(t["died"] and t["abort"] for t in bad)
    survived = sum(not t["died"] for t in good)
    print(f"eagle3 servers aborted: {killed} of {len(bad)}; controls survived: {survived} of "
          f"{len(good)}")
    reproduced = killed == len(bad) and survived == len(good)
    print("REPRODUCED: llama-server --spec-type draft-eagle3 aborts on one three-prompt request "
          "(a draft candidate read from an overwritten backend-sampling buffer)" if reproduced
          else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
