"""GPU recipes: the kit against vLLM (draft model and n-gram speculation) and SGLang, each
started from the exported checkpoints with the recipe's command (properties/export/recipes.py)
next to a baseline without speculation. Marked `gpu`: they skip, with the reason, without a
CUDA device or without the server installed.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from properties.export import kit as export
from properties.export import recipes

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 600


def _needs(module: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module} installed (pip install {module})")


def _start(command: str, port: int, log: Path):
    process = subprocess.Popen(shlex.split(command), stdout=log.open("wb"),
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{command} exited with {process.returncode}:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(2)
    process.terminate()
    pytest.fail(f"{command} did not answer within {START_TIMEOUT} s")


def _kit(server: str, what: str, tmp_path: Path, extra=()):
    commands = recipes.recipes(tmp_path)[server]
    processes = [_start(commands["speculation off (the baseline)"], recipes.BASELINE_PORT,
                        tmp_path / "baseline.log"),
                 _start(commands[what], recipes.PORT, tmp_path / "speculative.log")]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "properties/",
             f"--impl=openai:http://127.0.0.1:{recipes.PORT}/v1",
             f"--baseline=http://127.0.0.1:{recipes.BASELINE_PORT}/v1", "-p", "no:cacheprovider",
             "-q", *extra], cwd=ROOT, capture_output=True, text=True, timeout=1800,
            env=dict(os.environ))
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=60)


@pytest.fixture
def exported(tmp_path):
    export.export(tmp_path)
    return tmp_path


@pytest.mark.parametrize("what", ["draft model (early exit)", "draft model (independent random draft)",
                                  "n-gram (prompt lookup)"])
def test_vllm(exported, what):
    _needs("vllm")
    _kit("vllm", what, exported)


def test_vllm_perfect_draft(exported):
    _needs("vllm")
    _kit("vllm", "perfect draft (the target drafts for itself; pass --served-draft=perfect)",
         exported, extra=("--served-draft=perfect",))


@pytest.mark.parametrize("what", ["draft model (early exit)", "n-gram (prompt lookup)"])
def test_sglang(exported, what):
    _needs("sglang")
    _kit("sglang", what, exported)
