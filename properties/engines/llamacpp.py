"""llama.cpp's `llama-server`, built from the source vendored in the `llama-cpp-python` sdist
(``make engine-llamacpp``: cmake and gcc, about 12 minutes on 2 cores; the checkpoints are
converted to GGUF in float32 by the vendored `convert_hf_to_gguf.py`, see gguf_convert.py).

Speculation with a draft model needs ``--spec-type draft-simple`` beside ``-md``: a draft model
alone loads but drafts nothing (generation_settings["speculative.types"] says "none").
``--spec-draft-p-min 0`` and ``--spec-draft-n-min 0`` make the draft propose k tokens every
round (the default p_min stops a draft early when it is unsure), so the kit's exact replay of
the acceptance applies; the last round is capped to the tokens still wanted ("capped").
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from properties.adapters import dialects
from properties.engines import Command, Engine, EngineMissing, Method
from properties.engines.local import engines_dir, output

K = 4
METHODS = {m.name: m for m in (
    Method("draft-early-exit", "draft model (draft-simple): the target's first layer",
           "draft-early-exit", K),
    Method("draft-random", "draft model (draft-simple): an independent random model",
           "draft-random", K),
    Method("perfect-draft", "draft model (draft-simple): the target itself", "perfect", K),
    Method("ngram", "n-gram drafting from the context (ngram-simple)", "ngram", K),
)}
DRAFT_FILES = {"draft-early-exit": "draft-early-exit", "draft-random": "draft-random",
               "perfect": "target"}


@dataclass(frozen=True)
class Environment:
    server: Path
    source: Path


def find() -> Environment:
    root = engines_dir() / "llamacpp"
    server, source = root / "build" / "bin" / "llama-server", root / "src"
    if not server.exists() or not (source / "convert_hf_to_gguf.py").exists():
        raise EngineMissing(f"llama.cpp is not built ({server}): run `make engine-llamacpp` "
                            f"(builds llama-server from the llama-cpp-python sdist, about 12 "
                            f"minutes on 2 cores)")
    return Environment(server, source)


def version(env: Environment) -> str:
    # the vendored source has no git commit; the sdist's version names the llama.cpp it holds
    stamp = env.source.parent / "VERSION"
    if stamp.exists():
        return stamp.read_text().strip()
    return output([env.server, "--version"]).splitlines()[0]


def prepare(env: Environment, export_dir, log) -> None:
    """GGUF (float32) files of the target and the drafts, beside the export."""
    gguf = Path(export_dir) / "gguf"
    gguf.mkdir(exist_ok=True)
    driver = Path(__file__).with_name("gguf_convert.py")
    for name in ("target", "draft-early-exit", "draft-random"):
        out = gguf / f"{name}.gguf"
        if out.exists():
            continue
        done = subprocess.run([sys.executable, str(driver), str(env.source),
                               str(Path(export_dir) / name), str(out)],
                              capture_output=True, text=True)
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"converting {name} to GGUF failed (log {log}):\n"
                               f"{done.stderr[-2000:]}")


def command(env: Environment, export_dir, method: Method | None, port: int) -> Command:
    gguf = Path(export_dir) / "gguf"
    argv = [env.server, "-m", gguf / "target.gguf", "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", "1", "-t", "1", "--no-webui", "--seed", "0"]
    if method is not None and method.draft == "ngram":
        argv += ["--spec-type", "ngram-simple", "--spec-draft-n-max", str(method.k)]
    elif method is not None:
        argv += ["-md", gguf / f"{DRAFT_FILES[method.draft]}.gguf", "--spec-type", "draft-simple",
                 "--spec-draft-n-max", str(method.k), "--spec-draft-n-min", "0",
                 "--spec-draft-p-min", "0", "-td", "1"]
    return Command(argv, health="/health")


ENGINE = Engine(
    name="llamacpp", title="llama.cpp llama-server (from llama-cpp-python's vendored source)",
    setup="make engine-llamacpp", validated=("llama-cpp-python 0.3.36",), methods=METHODS,
    dialect=dialects.LLAMACPP, find=find, version=version, command=command, prepare=prepare,
    start_timeout=120.0, schedule="capped")

