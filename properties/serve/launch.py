"""Starting and stopping a local ``transformers serve`` on a free port (for the kit's tests).

The server runs as a child process with one torch thread (OMP_NUM_THREADS=1): the served
models are tiny, and on a small shared machine several threads per op cost far more in
synchronization than they save (a 30x slowdown measured here under load). Everything is
bounded: the start waits at most `start_timeout` seconds for /health, and the stop escalates
from terminate to kill.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


class LaunchError(RuntimeError):
    """The server could not be started; the message says why (with its log's tail)."""


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    script = Path(sys.executable).parent / "transformers"
    if script.exists():
        return [str(script)]
    found = shutil.which("transformers")
    if found:
        return [found]
    return [sys.executable, "-c", "from transformers.cli.transformers import main; main()"]


class TransformersServer:
    """``with TransformersServer(model_dir) as server: server.url`` (http://127.0.0.1:PORT/v1)."""

    def __init__(self, model_dir, start_timeout: float = 180.0):
        self.model_dir = Path(model_dir)
        self.start_timeout = start_timeout
        self.port = None
        self.process = None
        self.log_path = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-chars:]
        except (OSError, TypeError):
            return ""

    def start(self) -> "TransformersServer":
        reason = serve_available()
        if reason:
            raise LaunchError(reason)
        if not (self.model_dir / "config.json").is_file():
            raise LaunchError(f"{self.model_dir} holds no checkpoint (config.json); export one "
                              f"with python -m properties.serve export DIR")
        self.port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false")
        log = tempfile.NamedTemporaryFile("wb", prefix="kit-transformers-serve-", suffix=".log",
                                          delete=False)
        self.log_path = log.name
        self.process = subprocess.Popen(
            _command() + ["serve", str(self.model_dir), "--host", "127.0.0.1", "--port",
                          str(self.port), "--device", "cpu", "--dtype", "float32",
                          "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.process = None
                raise LaunchError(f"transformers serve exited with code {code} before "
                                  f"answering:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise LaunchError(f"transformers serve did not answer /health within "
                          f"{self.start_timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
