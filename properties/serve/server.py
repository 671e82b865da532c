"""One engine server as a child process: start on a free port, wait for health, stop, restart.

The kit owns a server's life. Everything is bounded: the start waits at most `start_timeout`
seconds for the health path (and fails at once, quoting the log's tail, when the process
exits first), a stop escalates from SIGTERM to SIGKILL on the whole process group (engines
such as vLLM fork workers that must not outlive the run), and the log is kept in the run's
directory. `alive()` tells the client whether a failed request met a dead server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path



class LaunchError(RuntimeError):
    """The server could not be started; the message says why (with its log's tail)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Something listens on the port (connections of a stopped server in TIME_WAIT do not
    count: servers bind with SO_REUSEADDR, and so does this probe)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class Server:
    """``Server(name, make_command, log_dir)``: make_command(port) -> Command."""

    def __init__(self, name: str, make_command, log_dir, *, start_timeout: float = 300.0,
                 port: int | None = None):
        self.name = name
        self.make_command = make_command
        self.log_dir = Path(log_dir)
        self.start_timeout = start_timeout
        self.fixed_port = port
        self.port = None
        self.process = None
        self.starts = 0
        self.log_path = None
        self.command = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-chars:]
        except (OSError, TypeError):
            return ""

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.command.health}",
                                        timeout=5) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def start(self) -> "Server":
        if self.fixed_port is not None and port_in_use(self.fixed_port):
            raise LaunchError(f"{self.name}: port {self.fixed_port} is in use; stop what holds "
                              f"it or choose another port")
        self.port = self.fixed_port or free_port()
        self.command = self.make_command(self.port)
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        suffix = "" if self.starts == 1 else f".restart{self.starts - 1}"
        self.log_path = self.log_dir / f"{self.name}{suffix}.log"
        env = dict(os.environ, **{k: str(v) for k, v in self.command.env.items()})
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(map(str, self.command.argv)) + "\n").encode())
            log.flush()
            self.process = subprocess.Popen(
                [str(a) for a in self.command.argv], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, cwd=self.command.cwd, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.process = None
                raise LaunchError(f"{self.name} server exited with code {code} before answering "
                                  f"{self.command.health} (log {self.log_path}); its tail:\n"
                                  f"{self.log_tail()}")
            if self._healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise LaunchError(f"{self.name} server did not answer {self.command.health} within "
                          f"{self.start_timeout:g} s (log {self.log_path}); its tail:\n"
                          f"{self.log_tail()}")

    def alive(self) -> bool:
        """The process runs and answers its health path."""
        return self.process is not None and self.process.poll() is None and self._healthy()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:  # workers of the group that outlived their parent
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def restart(self) -> "Server":
        """Stop and start again on the same port (the clients keep their URL)."""
        port = self.port
        self.stop()
        fixed, self.fixed_port = self.fixed_port, port
        try:
            deadline = time.monotonic() + 30
            while port_in_use(port) and time.monotonic() < deadline:
                time.sleep(0.5)
            return self.start()
        finally:
            self.fixed_port = fixed

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
