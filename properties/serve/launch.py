"""Starting and stopping a local ``transformers serve`` on a free port (for the kit's tests and
its `transformers` engine).

The server runs with one torch thread (OMP_NUM_THREADS=1): the served models are tiny, and on
a small shared machine several threads per op cost far more in synchronization than they save
(a 30x slowdown measured here under load). Start and stop are properties.serve.server's:
bounded, with the log's tail quoted when the server does not come up.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from properties.engines.transformers import serve_available, serve_command
from properties.serve.server import LaunchError, Server, free_port  # noqa: F401


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
