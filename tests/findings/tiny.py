"""Shared by the standalone reproductions in this folder (none imports the conformance kit):
tiny Qwen3 checkpoints built with transformers, their exact law in float64, and a vLLM
server started and stopped from a script (every vLLM reproduction starts its servers here:
`start_vllm`, with a draft model, a --speculative-config of its own such as n-gram, or none).

The models: a 2-layer target with weights drawn at a large scale (standard deviation 0.6,
so that next-token laws are peaked, as in trained models), and its early-exit draft (the
target's first layer, then its final norm and head). Vocabulary: 32 one-character tokens.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEF"


def _config(layers: int):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=32, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=64, max_position_embeddings=2048, rope_theta=10000.0,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       tie_word_embeddings=False, initializer_range=0.6)


def tiny_models(root: Path, seed: int = 1) -> tuple[Path, Path]:
    """Write the target and its early-exit draft under `root`; return their paths."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(ALPHABET)}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    torch.manual_seed(seed)
    target = Qwen3ForCausalLM(_config(2)).float()
    with torch.no_grad():   # norms at 1, every other weight at the large scale
        for name, p in target.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.6)
    draft = Qwen3ForCausalLM(_config(1)).float()
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.1.")}
    draft.load_state_dict(state, strict=True)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(path)
        (path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        paths.append(path)
    return paths[0], paths[1]


def exact_law(target: Path, prompt, temperature: float) -> dict:
    """outcome (two tokens) -> probability under ancestral sampling at `temperature`."""
    import torch
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([list(prompt)])).logits[0, -1] / temperature, -1)
        seqs = torch.tensor([list(prompt) + [t] for t in range(32)])
        second = torch.softmax(model(seqs).logits[:, -1] / temperature, -1)
    return {(a, b): float(first[a] * second[a, b]) for a in range(32) for b in range(32)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}    # GiB of KV cache; set on top of the caller's


def server_argv(target: Path, draft: Path | dict | None, port: int,
                python: str = sys.executable, extra: tuple | list = ()) -> list:
    """The server's command line: without `draft`, the baseline; with a draft model's path,
    k = 4 draft tokens; with a dict, that --speculative-config (n-gram). `extra`: more of the
    server's options, placed before the speculative config."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
            "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "2048",
            "--seed", "0", "--host", "127.0.0.1", "--port", str(port), *extra]
    if isinstance(draft, dict):
        argv += ["--speculative-config", json.dumps(draft)]
    elif draft is not None:
        argv += ["--speculative-config",
                 json.dumps({"model": str(draft), "num_speculative_tokens": 4})]
    return argv


def shell_line(target: Path, draft: Path | dict | None, port: int = 8000,
               extra: tuple | list = ()) -> str:
    """The command line `start_vllm` runs, as typed in a shell (with `python` for its Python)."""
    env = " ".join(f"{k}={v}" for k, v in SERVER_ENV.items())
    return env + " " + shlex.join(server_argv(target, draft, port, python="python", extra=extra))


def write_models(directory: str) -> None:
    """--models DIR: write the checkpoints under DIR, print the server command lines, exit."""
    target, draft = tiny_models(Path(directory).resolve())
    print(f"wrote {target} and {draft}\nwithout speculation:\n  {shell_line(target, None)}\n"
          f"with the draft model:\n  {shell_line(target, draft)}")


def start_vllm(target: Path, draft: Path | dict | None, log: Path, extra: tuple | list = ()):
    """(process, base URL) of a vLLM server on a free port, speculating with `draft` (as in
    `server_argv`), its output in `log`."""
    port = free_port()
    argv = server_argv(target, draft, port, extra=extra)
    env = dict(os.environ, **SERVER_ENV)
    with open(log, "wb") as out:     # the server keeps its own copy of the descriptor
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"vLLM exited before answering; see {log}")
        if healthy(url):
            return process, url
        time.sleep(1)
    stop(process)
    sys.exit(f"vLLM did not answer /health within 600 s; see {log}")


def stop(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def curl_line(body: dict, model: str = "tiny", url: str = "http://127.0.0.1:8000") -> str:
    """The request `complete` sends, as a curl command line."""
    return (f"curl -sS {url}/v1/completions -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(dict(body, model=model)))}")


def complete(url: str, body: dict, model: str = "tiny") -> tuple[int, dict | str]:
    data = json.dumps(dict(body, model=model)).encode()
    request = urllib.request.Request(url + "/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
