"""SGLang: needs a GPU, and cannot be installed on the machines this kit runs on. The recipe
is printed (``python -m properties.serve recipes DIR``); `run` refuses it with that reason."""

from __future__ import annotations

from pathlib import Path

from properties.adapters.dialects import Dialect
from properties.methods import EARLY_EXIT, LOOKUP
from properties.engines import Command, Engine, EngineMissing, Method

K = 4
METHODS = {m.name: m for m in (
    Method("draft-early-exit", "STANDALONE draft model", EARLY_EXIT, K),
    Method("ngram", "NGRAM", LOOKUP, K),
)}
DIALECT = Dialect("sglang", honours_n=True)


def find():
    raise EngineMissing("SGLang needs a CUDA GPU and is not installable here; serve it by the "
                        "printed recipe (python -m properties.serve recipes DIR) and point the "
                        "kit at it: pytest properties/ --impl=openai:URL --baseline=URL "
                        "--served-engine=sglang")


def command(env, export_dir, method: Method | None, port: int) -> Command:
    root = Path(export_dir)
    argv = ["python", "-m", "sglang.launch_server", "--model-path", root / "target",
            "--dtype", "float32", "--context-length", "2048", "--port", str(port)]
    if method is not None and method.drafter.lookup:
        argv += ["--speculative-algorithm", "NGRAM",
                 "--speculative-num-draft-tokens", str(method.k + 1)]
    elif method is not None:
        argv += ["--speculative-algorithm", "STANDALONE",
                 "--speculative-draft-model-path", root / method.drafter.export,
                 "--speculative-num-steps", str(method.k), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(method.k + 1)]
    return Command(argv, health="/health")


ENGINE = Engine(
    name="sglang", title="SGLang (GPU only: recipe)", setup="a CUDA machine",
    validated=(), methods=METHODS, dialect=DIALECT, find=find, version=lambda env: "?",
    command=command, runnable=False)
