"""Where the engines' environments live: ``.engines/`` at the project root (made by the make
targets, never inside the project's .venv), or $KIT_ENGINES_DIR."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def engines_dir() -> Path:
    return Path(os.environ.get("KIT_ENGINES_DIR") or ROOT / ".engines")


def output(argv, timeout: float = 120.0) -> str:
    """stdout of a short command, stripped; RuntimeError with its stderr when it fails."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed with code {done.returncode}: "
                           f"{done.stderr.strip()[-1500:]}")
    return done.stdout.strip()
