"""Shared by the standalone llama.cpp reproductions in this folder (none imports the
conformance kit): the tiny checkpoint of `tiny.py` converted to GGUF (float32) by llama.cpp's
own convert_hf_to_gguf.py, and llama-server started, asked and stopped from a script.

The conversion runs in a process of its own (`python llamacpp_tiny.py --convert SRC MODEL
OUT`): the tokenizer (32 one-character BPE tokens, no merges) needs three things said to the
converter: its pre-tokenizer hash is unknown (take "default": no split), it has no
tokenizer.model (answer the sentencepiece attempt as a missing file), and llama.cpp's loader
wants a merges key that GGUF cannot store empty (write one merge that no token-id prompt uses).
An EAGLE-3 head converts the same way with its target's folder after OUT (`head_gguf`: the
converter's --target-model-dir, where the head's tokenizer and target depth are read).
"""

from __future__ import annotations

import argparse
import tempfile
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import free_port, healthy, tiny_models  # noqa: E402

# a float32 KV cache without flash attention: the plain server's output then matches float64
# to about 1e-5 (with the default float16 cache, to about 1.5e-3)
EXACT_FLAGS = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]
# every sampling setting named, so that only temperature acts; no prompt cache reuse
NEUTRAL = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
           "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "mirostat": 0,
           "dynatemp_range": 0.0, "samplers": ["temperature", "top_k", "top_p"],
           "cache_prompt": False, "return_tokens": True, "stream": False}


def convert_in_this_process(source: Path, model: Path, outfile: Path,
                            target: Path | None = None) -> None:
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import runpy

    import gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"

    def sentencepiece_missing(self, *args, **kwargs):
        raise FileNotFoundError(str(model / "tokenizer.model"))

    base.TextModel._set_vocab_sentencepiece = sentencepiece_missing
    # a GLM-4.5 checkpoint (llamacpp_mtp_lead_state/): its vocabulary step looks up GLM's own
    # special tokens ("[gMASK]", ...), which the tiny tokenizer has not; give it Qwen3's step
    from conversion import glm
    glm.Glm4MoeModel.set_vocab = base.TextModel._set_vocab_gpt2
    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def with_one_merge(self, gw, quiet: bool = False):
        if not self.merges:
            gw.add_token_merges(["a b"])
        return add_to_gguf(self, gw, quiet=quiet)

    gguf.SpecialVocab.add_to_gguf = with_one_merge
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outtype", "f32", "--outfile", str(outfile)]
    if target is not None:   # an EAGLE-3 head: the converter reads the target's tokenizer and depth
        sys.argv += ["--target-model-dir", str(target)]
    runpy.run_path(str(source / "convert_hf_to_gguf.py"), run_name="__main__")


def tiny_gguf(source: Path, root: Path) -> tuple[Path, Path]:
    """(checkpoint, GGUF) of tiny.py's target, written under `root`."""
    target, _ = tiny_models(root)
    gguf = root / "target.gguf"
    if not gguf.exists():
        log = root / "convert.log"
        with open(log, "wb") as out:
            done = subprocess.run([sys.executable, __file__, "--convert", str(source),
                                   str(target), str(gguf)], stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not gguf.exists():
            sys.exit(f"converting {target} to GGUF failed; see {log}")
    return target, gguf


def head_gguf(source: Path, head: Path, target: Path, gguf: Path) -> Path:
    """Convert an EAGLE-3 head's checkpoint `head` (beside its `target`) to `gguf` (float32)."""
    if not gguf.exists():
        log = gguf.with_suffix(".log")
        with open(log, "wb") as out:
            done = subprocess.run([sys.executable, __file__, "--convert", str(source), str(head),
                                   str(gguf), str(target)], stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not gguf.exists():
            sys.exit(f"converting {head} to GGUF failed; see {log}")
    return gguf


def server_argv(server, gguf: Path, port: int, spec: list, slots: int = 1) -> list:
    return [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", str(slots), "-t", "1", "--no-webui"] + EXACT_FLAGS + list(spec)


def start(argv: list, log: Path):
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
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


def greedy(prompt, n: int) -> dict:
    return dict(NEUTRAL, prompt=list(prompt), n_predict=n, temperature=0.0)


def counts(answer: dict) -> tuple[int, int]:
    """(drafted, accepted) of one answer (llama-server omits them when nothing was drafted)."""
    timings = answer.get("timings") or {}
    return timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)


def curl_line(body: dict, url: str = "http://127.0.0.1:8080") -> str:
    return (f"curl -sS {url}/completion -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body))}")


def version(server) -> str:
    done = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def prepare(doc: str, prefix: str):
    """A reproduction's command line (--llama-server, --llama-src, --models) and its tiny GGUF:
    (args, llama-server, folder, checkpoint, GGUF); the server's version printed."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
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
    root = Path(args.models or tempfile.mkdtemp(prefix=prefix)).resolve()
    root.mkdir(parents=True, exist_ok=True)
    target, gguf = tiny_gguf(source, root)
    print(f"llama-server: {version(server)}\nGGUF {gguf}")
    return args, server, root, target, gguf


__all__ = ["EXACT_FLAGS", "NEUTRAL", "counts", "curl_line", "free_port", "greedy", "head_gguf",
           "healthy", "post", "prepare", "server_argv", "start", "stop", "tiny_gguf", "version"]


# --convert SRC MODEL OUT [TARGET]: TARGET for an EAGLE-3 head (the converter's --target-model-dir)
if __name__ == "__main__" and len(sys.argv) in (5, 6) and sys.argv[1] == "--convert":
    convert_in_this_process(*(Path(a) for a in sys.argv[2:]))
