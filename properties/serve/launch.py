"""Starting and stopping a local ``transformers serve`` on a free port (for the kit's tests and
its `transformers` engine).

The server runs with one torch thread (OMP_NUM_THREADS=1): the served models are tiny, and on
a small shared machine several threads per op cost far more in synchronization than they save
(a 30x slowdown measured here under load). Start and stop are properties.serve.server's:
bounded, with the log's tail quoted when the server does not come up.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from properties.serve.server import Command, LaunchError, Server, free_port  # noqa: F401


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


class TransformersServer(Server):
    """``with TransformersServer(model_dir) as server: server.url`` (http://127.0.0.1:PORT/v1)."""

    def __init__(self, model_dir, start_timeout: float = 180.0):
        self.model_dir = Path(model_dir)
        super().__init__("transformers-serve", lambda port: serve_command(self.model_dir, port),
                         tempfile.mkdtemp(prefix="kit-transformers-serve-"),
                         start_timeout=start_timeout)

    def start(self) -> "TransformersServer":
        reason = serve_available()
        if reason:
            raise LaunchError(reason)
        if not (self.model_dir / "config.json").is_file():
            raise LaunchError(f"{self.model_dir} holds no checkpoint (config.json); export one "
                              f"with python -m properties.serve export DIR")
        return super().start()
