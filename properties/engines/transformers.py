"""`transformers serve` (the project's own .venv, extra [serve]): speculation is per request
(prompt lookup through generation_config), so its baseline is the same server without it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from properties.adapters import dialects
from properties.engines import Command, Engine, EngineMissing, Method

def serve_available() -> str | None:
    """None when transformers serve can run here, else the reason it cannot."""
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError as exc:
        return f"transformers is not installed ({exc}); pip install '.[hf,serve]'"
    if not is_serve_available():
        return ("transformers serve needs fastapi, uvicorn, pydantic and openai: "
                "pip install '.[serve]'")
    return None


def _command() -> list[str]:
    script = Path(sys.executable).parent / "transformers"
    if script.exists():
        return [str(script)]
    found = shutil.which("transformers")
    if found:
        return [found]
    return [sys.executable, "-c", "from transformers.cli.transformers import main; main()"]


def serve_command(model_dir, port: int) -> Command:
    """The command line of `transformers serve` for `model_dir` on `port` (float32, CPU)."""
    return Command(_command() + ["serve", str(model_dir), "--host", "127.0.0.1", "--port",
                                 str(port), "--device", "cpu", "--dtype", "float32",
                                 "--log-level", "warning"],
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "TOKENIZERS_PARALLELISM": "false"}, health="/health")


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
