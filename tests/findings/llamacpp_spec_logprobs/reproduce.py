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

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import free_port, healthy, tiny_models

TOLERANCE = 1e-3
# llama-server's defaults plus a float32 KV cache without flash attention: with the default
# float16 cache the plain server's logprobs are off by up to ~1.5e-3 from float64, with these
# flags by ~1e-5; they change nothing about the finding (see README.md)
EXACT_FLAGS = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]
NGRAM_FLAGS = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
               "--spec-ngram-simple-size-m", "4", "--spec-draft-n-max", "4"]
# every sampling setting named, so that only temperature (and top_k/top_p, neutral) act
NEUTRAL = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
           "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "mirostat": 0,
           "dynatemp_range": 0.0, "samplers": ["temperature", "top_k", "top_p"],
           "cache_prompt": False, "return_tokens": True, "stream": False}
# prompts that repeat themselves, so that the n-gram lookup finds matches and drafts
REQUESTS = [dict(NEUTRAL, prompt=prompt, n_predict=12, n_probs=2, temperature=t, seed=9)
            for prompt, t in (([8, 1, 7, 3, 8, 1, 7, 3], 1.0), ([8, 1, 7, 3, 8, 1, 7, 3], 0.0),
                              ([5, 6, 5, 6, 5, 6], 1.0), ([5, 6, 5, 6, 5, 6], 0.0),
                              ([1, 2, 3, 1, 2, 3, 1, 2, 3], 1.0))]


# --------------------------------------------------------------------------- conversion

def convert_in_this_process(source: Path, model: Path, outfile: Path) -> None:
    """Run llama.cpp's convert_hf_to_gguf.py on the tiny checkpoint. Its tokenizer (32
    one-character BPE tokens, no merges) needs three things said to the converter: its
    pre-tokenizer hash is unknown (take "default": no split), it has no tokenizer.model
    (answer the sentencepiece attempt as a missing file), and llama.cpp's loader wants a
    merges key that GGUF cannot store empty (write one merge that no token id prompt uses)."""
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import runpy

    import gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"

    def sentencepiece_missing(self, *args, **kwargs):
        raise FileNotFoundError(str(model / "tokenizer.model"))

    base.TextModel._set_vocab_sentencepiece = sentencepiece_missing
    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def with_one_merge(self, gw, quiet: bool = False):
        if not self.merges:
            gw.add_token_merges(["a b"])
        return add_to_gguf(self, gw, quiet=quiet)

    gguf.SpecialVocab.add_to_gguf = with_one_merge
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outtype", "f32", "--outfile", str(outfile)]
    runpy.run_path(str(source / "convert_hf_to_gguf.py"), run_name="__main__")


def convert(source: Path, model: Path, outfile: Path, log: Path) -> None:
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, __file__, "--convert", str(source), str(model),
                               str(outfile)], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not outfile.exists():
        sys.exit(f"converting {model} to GGUF failed; see {log}")


# --------------------------------------------------------------------------- server

def server_argv(server, gguf: Path, port: int, speculate: bool) -> list:
    argv = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", "4", "-t", "1", "--no-webui"] + EXACT_FLAGS
    return argv + NGRAM_FLAGS if speculate else argv


def start(argv: list, log: Path):
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    with open(log, "wb") as out:
        process = subprocess.Popen(["nice", "-n", "5"] + argv, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"llama-server exited before answering; see {log}")
        if healthy(url):
            return process, url
        time.sleep(0.5)
    stop(process)
    sys.exit(f"llama-server did not answer /health within 120 s; see {log}")


def stop(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        sys.exit(f"HTTP {exc.code}: {exc.read().decode()[:500]}")


def curl_line(body: dict, url: str = "http://127.0.0.1:8080") -> str:
    return (f"curl -sS {url}/completion -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body))}")


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
    if len(sys.argv) == 5 and sys.argv[1] == "--convert":   # the conversion's own process
        convert_in_this_process(*(Path(a) for a in sys.argv[2:]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                        help="llama-server binary (or LLAMA_SERVER)")
    parser.add_argument("--llama-src", default=os.environ.get("LLAMA_CPP_SOURCE"),
                        help="llama.cpp source tree with convert_hf_to_gguf.py and gguf-py "
                             "(or LLAMA_CPP_SOURCE)")
    parser.add_argument("--models", metavar="DIR",
                        help="only write the checkpoint and GGUF under DIR and print commands")
    args = parser.parse_args()
    if not args.llama_server or not args.llama_src:
        parser.error("give --llama-server and --llama-src (or LLAMA_SERVER, LLAMA_CPP_SOURCE)")
    server, source = Path(args.llama_server).resolve(), Path(args.llama_src).resolve()
    root = (Path(args.models) if args.models else Path(tempfile.mkdtemp(prefix="llama-lp-")))
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    target, _ = tiny_models(root)
    gguf = root / "target.gguf"
    convert(source, target, gguf, root / "convert.log")
    version = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    print(f"llama-server: {(version.stdout + version.stderr).strip().splitlines()[0]}")
    print(f"checkpoint {target}, GGUF {gguf}")
    if args.models:
        for name, spec in (("without speculation", False), ("with n-gram speculation", True)):
            print(f"{name}:\n  {shlex.join(server_argv(server, gguf, 8080, spec))}")
        print("requests:\n  " + "\n  ".join(curl_line(b) for b in REQUESTS))
        return 0
    exact = Exact(target)
    result = {}
    for name, spec in (("baseline (no speculation)", False), ("n-gram speculation", True)):
        argv = server_argv(server, gguf, free_port(), spec)
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
