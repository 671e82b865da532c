"""llama.cpp llama-server: ngram-cache never learns from the tokens it generates. The server
updates its context n-gram cache with the new tokens alone, without the tokens before them
(common/speculative.cpp, common_speculative_impl_ngram_cache::draft_one), so a token
generated one at a time adds no n-gram at all; and the cache is one per slot, never reset
between requests (its begin() is a no-op), so a later request learns only what lies past the
longest context the slot has seen. The output stays right (greedy, the same as without
speculation); the drafts come from the prompt's n-grams only, or another request's.
Standalone: plain HTTP, the model built with transformers and converted with llama.cpp's own
convert_hf_to_gguf.py; no import of the conformance kit.

    python reproduce.py --llama-server PATH --llama-src DIR
        # builds the tiny checkpoint, converts it to GGUF (float32), starts llama-server (one
        # slot) without speculation, then with ngram-cache (twice, freshly started each time),
        # sends greedy requests and compares the drafts with the engine's own drafting rule
        # replayed in Python on the same tokens, (a) with the cache updated as the server does
        # and (b) updated as llama.cpp's lookup example does (examples/lookup/lookup.cpp: the
        # whole history, the newest token with the n-grams before it)
    python reproduce.py --llama-server PATH --llama-src DIR --models DIR
        # only writes the checkpoint and target.gguf under DIR and prints the command lines

LLAMA_SERVER and LLAMA_CPP_SOURCE may stand for the two options. Run it with a Python that
has torch, transformers and safetensors. Exit status 0 when the finding reproduces: every
answer equals the plain server's; on the request whose prompt repeats no n-gram the server
drafts nothing, as the replay of its own update predicts, while the lookup example's update
would draft at several positions; and a request that drafts on a fresh slot drafts nothing
when the same slot has answered a longer request before.
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp_tiny import (counts, curl_line, free_port, greedy, post, prepare, server_argv,
                           start, stop)  # noqa: E402

SPEC = ["--spec-type", "ngram-cache"]
# LONG: all 32 tokens once: the prompt repeats no n-gram, the greedy output repeats 0 and 23;
# SHORT: a prompt that repeats itself, which ngram-cache drafts on in a fresh slot
LONG, SHORT = list(range(32)), [8, 1, 7, 3, 8, 1, 7, 3]
# each on a freshly started one-slot server, in this order
SEQUENCES = {"fresh slot": [SHORT], "after a longer request": [LONG, SHORT]}
TOKENS = 24

# common/ngram-cache.h, common/ngram-cache.cpp (the context cache's "lax" thresholds; no
# static or dynamic cache is given, so only they apply)
NGRAM_MIN, NGRAM_MAX, N_DRAFT = 1, 4, 8
MIN_SAMPLES = (2, 2, 1, 1)
MIN_PERCENT = (66, 50, 50, 50)


def update(cache, tokens, nnew: int) -> None:
    """common_ngram_cache_update(cache, 1, 4, tokens, nnew): for each of the last `nnew`
    positions i, every n-gram ending just before i counts tokens[i] as a follower."""
    for n in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(max(len(tokens) - nnew, n), len(tokens)):
            cache[tuple(tokens[i - n:i])][tokens[i]] += 1


def draft(cache, inp) -> list:
    """common_ngram_cache_draft with the context cache only: up to N_DRAFT tokens, each the
    most frequent follower of the longest n-gram whose counts pass the thresholds (a tie of
    counts is drafted too; which of the tied tokens depends on the map's order)."""
    out = []
    while len(out) < N_DRAFT:
        seq = list(inp) + out
        token = None
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            followers = cache.get(tuple(seq[-n:]))
            if not followers:
                continue
            total, (best, top) = sum(followers.values()), followers.most_common(1)[0]
            if total >= MIN_SAMPLES[n - 1] and 100 * top >= MIN_PERCENT[n - 1] * total:
                token = best
                break
        if token is None:
            break
        out.append(token)
    return out


def replay(prompt, output, as_server: bool) -> list:
    """The positions s (1 .. len(output) - 1) at which the engine's rule drafts after the
    prompt and output[:s], one token generated per step (the server's own path when it drafts
    nothing). as_server: the cache updated as common_speculative_impl_ngram_cache::draft_one
    does (tokens past the previous call, plus the newest, counted among themselves only);
    else as examples/lookup/lookup.cpp does (the whole history, the newest token last)."""
    cache, seen, at = defaultdict(Counter), 0, []
    for s in range(1, len(output)):
        inp = list(prompt) + list(output[:s])     # the history and the token just sampled
        if as_server:
            if seen < len(inp):
                update(cache, inp[seen:], len(inp) - seen)
                seen = len(inp)
        elif s == 1:
            update(cache, inp, len(inp))
        else:
            update(cache, inp, 1)
        if draft(cache, inp):
            at.append(s)
    return at


def main() -> int:
    args, server, root, _, gguf = prepare(__doc__, "llama-cache-")
    if args.models:
        for name, spec in (("without speculation", []), ("ngram-cache", SPEC)):
            print(f"{name}:\n  {shlex.join(server_argv(server, gguf, 8080, spec))}")
        for name, prompts in SEQUENCES.items():
            print(f"{name} (a freshly started server):\n  "
                  + "\n  ".join(curl_line(greedy(p, TOKENS)) for p in prompts))
        return 0
    runs = {}
    for name, spec, prompts in [("plain", [], [SHORT, LONG])] + [
            (f"ngram-cache, {what}", SPEC, prompts) for what, prompts in SEQUENCES.items()]:
        argv = server_argv(server, gguf, free_port(), spec)
        print(f"--- {name}\n    server: {shlex.join(argv)}")
        process, url = start(argv, root / f"server-{len(runs)}.log")
        try:
            runs[name] = [(p, post(url, greedy(p, TOKENS))) for p in prompts]
        finally:
            stop(process)
        for prompt, answer in runs[name]:
            drafted, accepted = counts(answer)
            print(f"    prompt {prompt[:8]}{'...' if len(prompt) > 8 else ''}: drafted "
                  f"{drafted:3d}, accepted {accepted:3d}; tokens {answer['tokens']}")
    plain = {tuple(p): a["tokens"] for p, a in runs["plain"]}
    same = all(a["tokens"] == plain[tuple(p)] for r in runs.values() for p, a in r)
    after = dict((tuple(p), a) for p, a in runs["ngram-cache, after a longer request"])
    long_answer = after[tuple(LONG)]
    as_server = replay(LONG, long_answer["tokens"], as_server=True)
    as_lookup = replay(LONG, long_answer["tokens"], as_server=False)
    print(f"the request {LONG[:4]}...{LONG[-1:]} (no n-gram of its prompt repeats), the "
          f"engine's drafting rule replayed on its {TOKENS} tokens:\n"
          f"    cache updated as the server does:        drafts after positions {as_server}\n"
          f"    cache updated as examples/lookup does:   drafts after positions {as_lookup}\n"
          f"    the server drafted {counts(long_answer)[0]} tokens")
    fresh = counts(runs["ngram-cache, fresh slot"][0][1])
    later = counts(after[tuple(SHORT)])
    print(f"the request {SHORT}: (drafted, accepted) {fresh} in a fresh slot, {later} after "
          f"the longer request in the same slot")
    print(f"every answer equals the plain server's: {same}")
    reproduced = (same and counts(long_answer)[0] == 0 and not as_server
                  and len(as_lookup) >= 3 and fresh[0] > 0 and later[0] == 0)
    print("REPRODUCED: the server's ngram-cache learns nothing from generated tokens, and its "
          "state outlives the request" if reproduced else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
