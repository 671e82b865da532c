"""`transformers serve` (the project's own .venv, extra [serve]): speculation is per request
(prompt lookup through generation_config), so its baseline is the same server without it."""

from __future__ import annotations

from pathlib import Path

from properties.serve import dialects
from properties.serve.engines import Engine, EngineMissing, Method
from properties.serve.launch import serve_available, serve_command

METHODS = {"prompt-lookup": Method("prompt-lookup", "prompt lookup, 4 tokens (per request)",
                                   "ngram")}


def find():
    reason = serve_available()
    if reason:
        raise EngineMissing(f"transformers serve cannot run: {reason}")
    return None


def version(env) -> str:
    import transformers
    return transformers.__version__


def command(env, export_dir, method, port):
    return serve_command(Path(export_dir) / "target", port)


ENGINE = Engine(
    name="transformers", title="transformers serve", setup="make (the project's .venv)",
    validated=(), methods=METHODS, dialect=dialects.TRANSFORMERS, find=find, version=version,
    command=command, start_timeout=180.0,
    # the kit turns prompt lookup on per request (the served client's generation_config)
    kit_args=("--served-generation-config", '{"prompt_lookup_num_tokens": 4}'))
