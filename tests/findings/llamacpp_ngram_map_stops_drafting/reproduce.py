"""llama.cpp llama-server: ngram-map-k and ngram-map-k4v stop drafting. A key whose draft was
wholly rejected drafts nothing ever again (the draft is cut to the count accepted the last
time that key drafted, which is then 0), and the key map is one per server slot, kept across
requests: the same request, sent again to an idle server, drafts nothing where it first
drafted. ngram-simple with the same sizes drafts the same every time. The output is right
throughout (greedy, the same as without speculation): what is lost is the speculation.
Standalone: plain HTTP, the model built with transformers and converted with llama.cpp's own
convert_hf_to_gguf.py; no import of the conformance kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # builds the tiny checkpoint, converts it to GGUF (float32), starts llama-server
        # (one slot) without speculation, then with ngram-simple, ngram-map-k and
        # ngram-map-k4v (one at a time, each freshly started), sends each the same greedy
        # requests three times and prints the draft counts of every answer
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoint and target.gguf under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Run it with a Python that
has torch, transformers and safetensors. Exit status 0 when the finding reproduces: for each
of ngram-map-k and ngram-map-k4v some request drafts on its first send and nothing on a later
identical send, while ngram-simple drafts the same on every send, and every answer equals the
plain server's.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import (counts, curl_line, free_port, greedy, post, prepare, server_argv,
                           start, stop)  # noqa: E402

# one token looked up, four drafted: the sizes at which the lookups match in short contexts
SPECS = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
                     "--spec-ngram-simple-size-m", "4"],
    "ngram-map-k": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "1",
                    "--spec-ngram-map-k-size-m", "4", "--spec-ngram-map-k-min-hits", "1"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "1",
                      "--spec-ngram-map-k4v-size-m", "4", "--spec-ngram-map-k4v-min-hits", "1"],
}
# every token once after a first one (which the lookups skip), then 24: the greedy output
# begins 24, 24, 24, 24, where a lookup of 24 finds the prompt's 24 (followed by 31, 6, 13,
# 20: wrong) and, once the output holds it, 24 itself (right); and all 32 tokens in order,
# whose output repeats 0 and 23
PERMUTATION = [0] + [(7 * i + 3) % 32 for i in range(32)]
PROMPTS = [PERMUTATION + [24], list(range(32))]
SENDS = 3
TOKENS = 24


def run(server, gguf: Path, root: Path, spec: str) -> dict:
    """{prompt index: [(tokens, drafted, accepted) per send]} from a freshly started server."""
    argv = server_argv(server, gguf, free_port(), SPECS[spec])
    print(f"--- {spec}\n    server: {shlex.join(argv)}")
    process, url = start(argv, root / f"server-{spec}.log")
    out = {}
    try:
        for i, prompt in enumerate(PROMPTS):
            out[i] = []
            for send in range(SENDS):
                answer = post(url, greedy(prompt, TOKENS))
                drafted, accepted = counts(answer)
                out[i].append((answer["tokens"], drafted, accepted))
                print(f"    prompt #{i}, send {send + 1}: drafted {drafted:3d}, accepted "
                      f"{accepted:3d}; tokens {answer['tokens']}")
    finally:
        stop(process)
    return out


def main() -> int:
    args, server, root, _, gguf = prepare(__doc__, "llama-map-")
    if args.models:
        for spec in SPECS:
            print(f"{spec}:\n  {shlex.join(server_argv(server, gguf, 8080, SPECS[spec]))}")
        print("requests (each sent three times):\n  "
              + "\n  ".join(curl_line(greedy(p, TOKENS)) for p in PROMPTS))
        return 0
    results = {spec: run(server, gguf, root, spec) for spec in SPECS}
    plain = {i: sends[0][0] for i, sends in results["none"].items()}
    same_output = all(tokens == plain[i] for spec in results for i, sends in results[spec].items()
                      for tokens, _, _ in sends)
    steady = all(len({(d, a) for _, d, a in sends}) == 1 and sends[0][1] > 0
                 for sends in results["ngram-simple"].values())
    stops = {spec: [i for i, sends in results[spec].items()
                    if sends[0][1] > 0 and any(d == 0 for _, d, _ in sends[1:])]
             for spec in ("ngram-map-k", "ngram-map-k4v")}
    print(f"every answer equals the plain server's: {same_output}")
    print(f"ngram-simple drafts the same on every send, and drafts: {steady}")
    for spec, prompts in stops.items():
        print(f"{spec}: prompts drafted on the first send and not at all on a later one: "
              f"{['#%d' % i for i in prompts] or 'none'}")
    reproduced = same_output and steady and all(stops.values())
    print("REPRODUCED: ngram-map-k and ngram-map-k4v stop drafting for good where ngram-simple "
          "goes on" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
