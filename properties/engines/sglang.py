"""SGLang: needs a GPU, and cannot be installed on the machines this kit runs on. The recipe
is printed (``python -m properties.serve recipes DIR``); `run` refuses it with that reason."""

from __future__ import annotations

from properties.adapters import dialects
from properties.engines import Engine, EngineMissing, Method

METHODS = {m.name: m for m in (
    Method("draft-early-exit", "STANDALONE draft model", "draft-early-exit"),
    Method("ngram", "NGRAM", "ngram"),
)}


def find():
    raise EngineMissing("SGLang needs a CUDA GPU and is not installable here; serve it by the "
                        "printed recipe (python -m properties.serve recipes DIR) and point the "
                        "kit at it: pytest properties/ --impl=openai:URL --baseline=URL "
                        "--served-engine=sglang")


ENGINE = Engine(
    name="sglang", title="SGLang (GPU only: recipe)", setup="a CUDA machine",
    validated=(), methods=METHODS, dialect=dialects.Dialect("sglang", "openai", honours_n=True),
    find=find, version=lambda env: "?", command=None, runnable=False)
