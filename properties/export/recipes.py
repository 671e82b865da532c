"""The command lines that serve the exported models, per engine and speculation method, and
the kit's command line for each: printed by ``python -m properties.serve export DIR`` and
``recipes DIR``.

Each line comes from the engine's own file (properties/engines/): its `command(...)`, the one
the launcher (``python -m properties.serve run``) starts, given no environment so that it reads
as a user types it where the engine is installed (`python` of vLLM's environment,
`llama-server`, `transformers`), with its environment variables; its `prepare_commands`
(llama.cpp's GGUF conversion); and the dialect's options for a run by hand. Every server
computes in float32 here: the kit's sampling check then sees no dtype deviation worth the
name (CONFORMANCE.md, served engines).
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from properties import engines, methods

PORT = 8000
BASELINE_PORT = 8001


def kit_line(engine, method, port: int = PORT, baseline_port: int = BASELINE_PORT) -> str:
    """The kit's command line by hand against the servers of `method` and the baseline."""
    options = [f"--impl=openai:http://127.0.0.1:{port}/v1",
               f"--baseline=http://127.0.0.1:{baseline_port}/v1",
               f"--served-engine={engine.name}", f"--served-draft={methods.option_of(method.drafter)}",
               f"--served-k={method.k}"]
    options += engine.dialect_for(method).kit_options()
    return "python -m pytest properties/ " + " ".join(shlex.quote(o) for o in options)


def recipes(directory, names=None) -> dict[str, dict[str, str]]:
    """engine title -> {what: shell line}; `directory` is the export root."""
    out = {}
    for name in names or engines.available():
        engine = engines.get(name)
        if not engine.recipe:
            continue
        lines = {}
        for what, step in (engine.prepare_commands(None, directory)
                           if engine.prepare_commands else ()):
            lines[what] = step.shell()
        lines["speculation off (the baseline)"] = engine.command(
            None, directory, None, BASELINE_PORT).shell()
        for method in engine.methods.values():
            lines[f"{method.name}: {method.description}"] = engine.command(
                None, directory, method, PORT).shell()
            also = (f" (or all at once: python -m properties.serve run {name} {method.name})"
                    if engine.runnable else "")
            lines[f"kit, {method.name}{also}"] = kit_line(engine, method)
        out[f"{engine.title} [{name}]"] = lines
    return out


def describe(directory, names=None) -> str:
    lines = []
    for server, commands in recipes(directory, names).items():
        lines.append(f"# {server}")
        for what, command in commands.items():
            lines.append(f"#   {what}:")
            lines.append(f"{command}")
        lines.append("")
    return "\n".join(lines)


# the trained pair's drafts, served with the kit's engines' command lines, each as the draft
# model of the engines' draft-model method
DRAFT_METHOD = "draft-early-exit"
TRAINED_DRAFTS = {methods.SMALL: "the small trained draft", methods.EARLY_EXIT: "early exit"}


def describe_trained(directory, models: str = "trained") -> str:
    """Serving commands for the trained export of the pair `models` names (trained: the
    committed pair; trained-large: the weight-bound one; speed and acceptance only: the kit's
    law checks need the kit's own export), from the engines' own command lines: each trained
    draft as the draft model of the draft-model method, for every engine that runs here and
    has one. The commands are the same for both pairs (same folders); only the heading differs."""
    root = Path(directory)
    pair = "the trained pair" if models == "trained" else f"the {models} pair"
    lines = [f"# {pair}: time speculation on models where it pays (served law checks "
             "use `export DIR` without --models)"]
    for name in engines.available():
        engine = engines.get(name)
        if not (engine.recipe and engine.runnable and DRAFT_METHOD in engine.methods):
            continue
        method = engine.method(DRAFT_METHOD)
        lines.append(f"# {engine.title}")
        for what, step in (engine.prepare_commands(None, root, tuple(d.export for d in TRAINED_DRAFTS))
                           if engine.prepare_commands else ()):
            lines += [f"#   {what}:", step.shell()]
        lines += ["#   speculation off (the baseline):",
                  engine.command(None, root, None, BASELINE_PORT).shell()]
        for draft, description in TRAINED_DRAFTS.items():
            chosen = replace(method, description=description, drafter=draft)
            lines += [f"#   draft model ({description}):",
                      engine.command(None, root, chosen, PORT).shell()]
    lines.append("")
    return "\n".join(lines)
