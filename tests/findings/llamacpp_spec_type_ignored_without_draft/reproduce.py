"""llama.cpp llama-server: `--spec-type draft-eagle3`, `draft-dflash` and `draft-dspark`
without a draft model (`-md`) are accepted and silently ignored: the server starts, answers,
never drafts, and logs nothing about it. The neighbouring types say what is wrong:
`draft-simple` without `-md` logs "failed to initialize speculative decoding context:
draft-simple requires a draft context" (and serves without speculation), `draft-mtp` on a
model without MTP layers refuses to start ("failed to create MTP context"). Standalone: plain
HTTP, the model built with transformers and converted with llama.cpp's own
convert_hf_to_gguf.py; no import of the conformance kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # builds the tiny checkpoint, converts it to GGUF (float32), starts llama-server with
        # each --spec-type in turn (no -md), sends a greedy request on a repeating prompt,
        # and prints whether it started, what it drafted and every log line about speculation
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoint and target.gguf under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Exit status 0 when the
finding reproduces: draft-eagle3, draft-dflash and draft-dspark each start, answer, draft
nothing and log no line naming speculation, the draft or the type, while draft-simple logs its
error and draft-mtp refuses to start.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import (counts, free_port, greedy, healthy, post, prepare, server_argv,
                           stop)  # noqa: E402

SILENT = ("draft-eagle3", "draft-dflash", "draft-dspark")
SAID = ("draft-simple", "draft-mtp")
PROMPT = [5, 6, 5, 6, 5, 6, 5, 6]
# what a log line about speculation names ("specul", not "spec": "special_eos_id")
WORDS = ("specul", "draft", "eagle", "dflash", "dspark", "mtp")


def try_type(server, gguf: Path, root: Path, kind: str) -> dict:
    """Start llama-server with --spec-type KIND alone: whether it answered, its draft counts
    on one greedy request, and the log lines that name speculation."""
    argv = server_argv(server, gguf, free_port(), ["--spec-type", kind])
    log = root / f"server-{kind}.log"
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    started, drafted = False, None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if healthy(url):
                started = True
                drafted = counts(post(url, greedy(PROMPT, 16)))
                break
            time.sleep(0.5)
    finally:
        stop(process)
    lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines()
             if any(w in line.lower() for w in WORDS)]
    said = "".join(f"\n      {line}" for line in lines) or " none"
    print(f"--- --spec-type {kind}\n    server: {shlex.join(argv)}\n    started and answered: "
          f"{started}; (drafted, accepted): {drafted}\n    log lines naming speculation:{said}")
    return {"started": started, "drafted": drafted, "lines": lines}


def main() -> int:
    args, server, root, _, gguf = prepare(__doc__, "llama-types-")
    if args.models:
        for kind in SILENT + SAID:
            print(f"{kind}:\n  {shlex.join(server_argv(server, gguf, 8080, ['--spec-type', kind]))}")
        return 0
    seen = {kind: try_type(server, gguf, root, kind) for kind in SILENT + SAID}
    silent = all(seen[k]["started"] and seen[k]["drafted"] == (0, 0) and not seen[k]["lines"]
                 for k in SILENT)
    simple_says = any("draft-simple requires a draft context" in line
                      for line in seen["draft-simple"]["lines"])
    mtp_refuses = not seen["draft-mtp"]["started"] and any(
        "MTP" in line for line in seen["draft-mtp"]["lines"])
    print(f"{', '.join(SILENT)}: started, drafted nothing, said nothing: {silent}\n"
          f"draft-simple says why it does not speculate: {simple_says}\n"
          f"draft-mtp refuses to start, saying why: {mtp_refuses}")
    reproduced = silent and simple_says and mtp_refuses
    print("REPRODUCED: three --spec-type values are accepted and silently ignored without a "
          "draft model" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
