"""The command lines that serve the exported models, per server, speculation on and off.

Flags are the servers' documented ones (transformers `serve --help`; vLLM's
`--speculative-config`; SGLang's `--speculative-*` options; llama.cpp's `llama-server
--model-draft`). Every server computes in float32 here (`--dtype float32` and equivalents):
the kit's sampling check then sees no dtype deviation worth the name (CONFORMANCE.md, served
engines). Only the transformers recipe is run on this project's CI; the GPU ones run under
``pytest -m gpu`` where the server is installed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

K = 4  # speculative tokens per round in every recipe
PORT = 8000
BASELINE_PORT = 8001


def _q(path) -> str:
    return shlex.quote(str(path))


def recipes(directory) -> dict[str, dict[str, str]]:
    """server -> {what: command}; `directory` is the export root."""
    root = Path(directory)
    target, early, random = root / "target", root / "draft-early-exit", root / "draft-random"
    vllm = f"vllm serve {_q(target)} --dtype float32 --max-model-len 2048 --seed 0"
    sglang = (f"python -m sglang.launch_server --model-path {_q(target)} --dtype float32 "
              f"--context-length 2048")
    gguf = root / "gguf"
    return {
        "transformers": {
            "serve (speculation is per request)":
                f"transformers serve {_q(target)} --dtype float32 --device cpu --port {PORT}",
            "kit, prompt lookup on (baseline: the same server without it)":
                f"python -m pytest properties/ --impl=openai:http://127.0.0.1:{PORT}/v1 "
                f"--baseline=http://127.0.0.1:{PORT}/v1 --served-api=transformers "
                f"--served-generation-config='{{\"prompt_lookup_num_tokens\": {K}}}'",
        },
        "vllm": {
            "speculation off (the baseline)": f"{vllm} --port {BASELINE_PORT}",
            "draft model (early exit)":
                f"{vllm} --port {PORT} --speculative-config "
                f"'{{\"model\": \"{early}\", \"num_speculative_tokens\": {K}}}'",
            "draft model (independent random draft)":
                f"{vllm} --port {PORT} --speculative-config "
                f"'{{\"model\": \"{random}\", \"num_speculative_tokens\": {K}}}'",
            "perfect draft (the target drafts for itself; pass --served-draft=perfect)":
                f"{vllm} --port {PORT} --speculative-config "
                f"'{{\"model\": \"{target}\", \"num_speculative_tokens\": {K}}}'",
            "n-gram (prompt lookup)":
                f"{vllm} --port {PORT} --speculative-config "
                f"'{{\"method\": \"ngram\", \"num_speculative_tokens\": {K}, "
                f"\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}}'",
            "kit": f"python -m pytest properties/ --impl=openai:http://127.0.0.1:{PORT}/v1 "
                   f"--baseline=http://127.0.0.1:{BASELINE_PORT}/v1",
        },
        "sglang": {
            "speculation off (the baseline)": f"{sglang} --port {BASELINE_PORT}",
            "draft model (early exit)":
                f"{sglang} --port {PORT} --speculative-algorithm STANDALONE "
                f"--speculative-draft-model-path {_q(early)} --speculative-num-steps {K} "
                f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {K + 1}",
            "n-gram (prompt lookup)":
                f"{sglang} --port {PORT} --speculative-algorithm NGRAM "
                f"--speculative-num-draft-tokens {K + 1}",
            "kit": f"python -m pytest properties/ --impl=openai:http://127.0.0.1:{PORT}/v1 "
                   f"--baseline=http://127.0.0.1:{BASELINE_PORT}/v1",
        },
        "llama.cpp": {
            "convert to GGUF (float32)":
                f"python convert_hf_to_gguf.py {_q(target)} --outtype f32 --outfile "
                f"{_q(gguf / 'target.gguf')} && python convert_hf_to_gguf.py {_q(early)} "
                f"--outtype f32 --outfile {_q(gguf / 'draft-early-exit.gguf')}",
            "speculation off (the baseline)":
                f"llama-server -m {_q(gguf / 'target.gguf')} --port {BASELINE_PORT}",
            "draft model (early exit)":
                f"llama-server -m {_q(gguf / 'target.gguf')} -md "
                f"{_q(gguf / 'draft-early-exit.gguf')} --draft-max {K} --draft-min 1 "
                f"--port {PORT}",
            "kit": f"python -m pytest properties/ --impl=openai:http://127.0.0.1:{PORT}/v1 "
                   f"--baseline=http://127.0.0.1:{BASELINE_PORT}/v1",
        },
    }


def describe(directory) -> str:
    lines = []
    for server, commands in recipes(directory).items():
        lines.append(f"# {server}")
        for what, command in commands.items():
            lines.append(f"#   {what}:")
            lines.append(f"{command}")
        lines.append("")
    return "\n".join(lines)


def describe_trained(directory) -> str:
    """Serving commands for the trained export (speed and acceptance only: the kit's law checks
    need the kit's own export)."""
    root = Path(directory)
    target, small, early = root / "target", root / "draft-small", root / "draft-early-exit"
    vllm = f"vllm serve {_q(target)} --dtype float32 --max-model-len 2048 --seed 0"
    lines = ["# the trained pair: time speculation on models where it pays (served law checks "
             "use `export DIR` without --models)",
             "# vllm, speculation off (the baseline):", f"{vllm} --port {BASELINE_PORT}"]
    for name, path in (("small draft", small), ("early exit", early)):
        lines += [f"# vllm, draft model ({name}):",
                  f"{vllm} --port {PORT} --speculative-config "
                  f"'{{\"model\": \"{path}\", \"num_speculative_tokens\": {K}}}'"]
    lines += ["# llama.cpp: convert each directory with convert_hf_to_gguf.py --outtype f32, then",
              f"llama-server -m target.gguf -md draft-small.gguf --draft-max {K} --draft-min 1 "
              f"--port {PORT}", ""]
    return "\n".join(lines)
