"""onnxruntime-genai (Microsoft's generation API over ONNX Runtime), driven through its Python
API in its own environment (``make engine-onnxruntime-genai``: .engines/onnxruntime-genai,
pip's onnxruntime-genai 0.18.0 with onnx and onnx_ir for its model builder, about 1 minute).

Its model builder (``python -m onnxruntime_genai.models.builder -i SRC -o OUT -p fp32 -e cpu``)
runs with the project's torch and transformers and the engine's packages on PYTHONPATH
(`prepare`). Speculation with a draft model is a target folder whose genai_config.json names a
draft (``model.draft``: the draft's decoder block, its file in a subfolder: the loader refuses
``..`` in paths) and ``"speculative": {"max_draft_tokens": k}``; n-gram drafting is
`GeneratorParams.set_speculative_options(ngram_size=, max_draft_tokens=)`. Its counts come
from `Generator.get_speculative_stats()` (rounds, draft_tokens_proposed, draft_tokens_accepted)
per request. One sequence per generator: batch size 1, so no batch forms (concurrency 1).
Its first round drafts from the prompt (the target's prefill verifies it), and a round drafts
at most the tokens still wanted: the "prompt" schedule (properties/acceptance.py; measured
2026-12-03 with the target as its own draft: max_tokens 1..13 give 1, 2, 3, 4, 4, 5, ...
proposed tokens in 1, 1, 1, 1, 1, 2, ... rounds).

The builder needs an end-of-sequence id in config.json, and at run time it must be a token of
the vocabulary; the kit's models have none, so the last token of the vocabulary is declared
one. The engine stops there (leaving that id out of its sequence: the session puts it back, as
the token drawn), and the session continues a completion that stopped at it with a
new generator from the prompt and the tokens so far (as llama.cpp's dialect does with a new
request): by the chain rule the continuation has the right conditional law, a greedy one is the
same argmax sequence, and the pieces are reported so that the kit's exact replay of the
counters follows them. A request's stop ids other than that one are matched by the session on
the tokens the engine emits (the API has no stop ids): the output is cut after the first.

The trained pair's small draft has head size 24, which onnxruntime-genai's CPU attention
refuses (it needs multiples of 16, found on this machine 2026-12-03): the conversion step
refuses such a model, naming its shape.

What else 0.18.0 offers (issue 40; read 2026-12-07 from the installed package: the builder's
Python under onnxruntime_genai/models/, the bindings' docstrings, the runtime's own messages in
libonnxruntime-genai.so, and tried on the kit's target):

- caller-supplied drafts: the Engine API (``og.Engine(model)``, ``engine.create_request()``,
  ``request.begin_turn``, ``engine.run``) takes a request's drafts with
  ``Request.set_draft_tokens`` ("Propose speculative draft tokens for the next decode
  operation"), up to ``Engine.max_draft_tokens_per_proposal()`` ("zero when unsupported").
  Verifying them needs the dynamic-batching Engine, built with
  ``--extra_options use_paged_attention=true`` (builders/base.py make_attention_init), which
  the builder refuses on a CPU: "PagedAttention (use_paged_attention=true) requires CUDA with
  FP16/BF16 or WebGPU with FP16, not (cpu, FLOAT)" (FLOAT16 likewise). On the CPU build the
  Engine answers max_draft_tokens_per_proposal() 0 and set_draft_tokens "This engine does not
  support speculative draft verification." (also with "speculative": {"max_draft_tokens": 4}
  in genai_config.json): the method `caller-drafts`, refused, with the GPU recipe.
- MTP: an Engine-hosted head needs dynamic batching too ("An Engine-hosted MTP head requires
  dynamic batching"), and the builder writes an MTP graph (``model.mtp``; ``og.MtpGenerator``
  drives it outside the Engine) only for Qwen3.5 checkpoints that declare
  ``mtp_num_hidden_layers`` > 0 (builders/qwen.py Qwen35MoEModel, Qwen35Model with
  get_mtp_model_class, builders/mtp.py MTPModel): the kit's Qwen3 targets have no MTP layer.
- DFlash 2 and DSpark block drafters (builder options dflash2_path, dspark_path;
  builders/dflash2.py, dspark.py; ``model.dflash2`` / ``model.dspark``): Qwen3.5 builders only
  (Qwen35MoEModel.block_drafter_options), "Requires use_paged_attention=true", and the runtime
  says "An Engine-hosted DFlash 2 drafter requires dynamic batching": not on a CPU.
- EAGLE, EAGLE-3, Medusa: not offered in 0.18.0. The runtime names none of them; the builder's
  ``aux_hidden_state_layers`` output (the residual streams entering the named layers) is
  documented for "a speculative block drafter such as EAGLE3 or DFlash", and only DFlash 2 and
  DSpark read it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from properties.methods import BOTH_PAIRS, EARLY_EXIT, LOOKUP, PERFECT, RANDOM, SMALL, Scripted
from properties.engines import Command, Engine, EngineMissing, Method, python_api
from properties.engines.local import engines_dir

VERSION = "0.18.0"
K = 4
# the shortest n-gram its lookup takes ("NGramLookup requires ngram_size >= 2"): the kit's
# contexts are short, and a longer one would rarely match
NGRAM = 2
# the head sizes its CPU attention takes
HEAD_MULTIPLE = 16
# the engine's words on this CPU (2026-12-07, 0.18.0), and where the path runs instead
CALLER_DRAFTS_REFUSED = (
    "onnxruntime-genai's Engine verifies caller drafts only with dynamic batching, whose "
    "PagedAttention build the model builder refuses here: \"PagedAttention "
    "(use_paged_attention=true) requires CUDA with FP16/BF16 or WebGPU with FP16, not (cpu, "
    "FLOAT)\"; on the CPU build Engine.max_draft_tokens_per_proposal() is 0 and "
    "Request.set_draft_tokens answers \"This engine does not support speculative draft "
    "verification.\" GPU recipe: pip install onnxruntime-genai-cuda==0.18.0; python -m "
    "onnxruntime_genai.models.builder -i DIR/target -o OUT -p fp16 -e cuda --extra_options "
    "use_paged_attention=true max_draft_tokens=4; then og.Engine(og.Model(OUT)), a request's "
    "begin_turn, one engine.run (the prefill), request.set_draft_tokens(drafts) before each "
    "later run, and Engine.get_speculative_stats() for the counts")
METHODS = {m.name: m for m in (
    Method("draft-early-exit", "draft model: the target's first layers (an early exit)", EARLY_EXIT, K,
           pairs=BOTH_PAIRS),
    Method("draft-random", "draft model: an independent random model", RANDOM, K),
    Method("perfect-draft", "draft model: the target itself", PERFECT, K),
    Method("ngram", f"n-gram drafting from the context (ngram_size {NGRAM})", LOOKUP, K),
    # a trained pair's small draft: refused with --models trained (its head size is 24), not
    # with --models trained-large (head size 32)
    Method("draft-small", "draft model: a trained pair's small draft "
                          "(--models trained or trained-large)",
           SMALL, K, pairs=BOTH_PAIRS),
    # the kit's scripted drafts through the Engine's caller-supplied drafts: refused here (the
    # module's docstring); the worker asks the engine again at every start
    Method("caller-drafts", "Request.set_draft_tokens: the kit's scripted drafts, right for the "
                            "first j proposals then wrong (the Engine API)",
           Scripted("right-then-wrong"), K, proposals="greedy", refused=CALLER_DRAFTS_REFUSED),
)}
FOLDER = "onnxruntime-genai"     # its converted models, beside the export


@dataclass(frozen=True)
class Environment:
    python: Path


RECIPE = Environment(Path("python"))    # as a user types it in the engine's environment


# ----------------------------------------------------------------- the engine, in its process

class Session:
    """One onnxruntime-genai model (a target, with or without a draft) behind the kit's worker
    (properties/engines/inprocess.py): compiled alone in the engine's environment."""

    PARAMS = ()

    def __init__(self, config):
        import onnxruntime_genai as og
        self.og = og
        self.model = og.Model(config["model"])
        self.vocab, self.eos = config["vocab_size"], config["eos"]
        self.k, self.ngram = config.get("k"), config.get("ngram")
        if config.get("caller_drafts"):
            self.caller_drafts()

    def caller_drafts(self):
        """Ask the Engine API to take one caller draft on this model, as a user would (a turn,
        its prefill, then Request.set_draft_tokens): where it refuses, its own exception ends
        the worker's start; where it takes it, the start fails saying so, since this worker
        drives the Generator API only (a newer engine to look at again)."""
        import numpy as np
        og = self.og
        engine = og.Engine(self.model)
        most = engine.max_draft_tokens_per_proposal()
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(4)
        request.begin_turn(np.array([0, 1], dtype=np.int32), turn)
        engine.run(engine.create_event_buffer(16))     # the prefill: then ready to decode
        request.set_draft_tokens(np.array([0], dtype=np.int32))
        raise RuntimeError(f"onnxruntime-genai took a caller draft (max_draft_tokens_per_proposal"
                           f" {most}): the kit's worker does not drive its Engine API yet")

    def generate(self, prompt, params):
        """Pieces until max_tokens, a stop id, or an end of sequence asked as a stop id."""
        want, stops = params["max_tokens"], set(params["stop_token_ids"])
        out, pieces = [], []
        totals = {"drafted": 0, "accepted": 0, "rounds": 0}
        while len(out) < want:
            seed = params["seed"]
            if seed is not None and pieces:     # a continuation draws with a seed of its own
                seed = (int(seed) * 1_000_003 + len(pieces)) % 2**31
            piece, stats = self.piece(prompt + out, want - len(out), params, seed)
            for key in totals:
                totals[key] += stats[key]
            hit = next((i for i, t in enumerate(piece) if t in stops), None)
            if hit is not None:
                piece = piece[:hit + 1]
            out += piece
            pieces.append(len(piece))
            if hit is not None:
                return out, "stop", dict(totals, pieces=pieces)
            if piece[-1:] != [self.eos]:
                break
        finish = "length" if len(out) >= want else "stop"
        return out, finish, dict(totals, pieces=pieces)

    def piece(self, prefix, wanted, params, seed):
        """The engine's tokens after `prefix` (at most `wanted`) and its draft counts."""
        import numpy as np
        og = self.og
        p = og.GeneratorParams(self.model)
        search = {"max_length": len(prefix) + wanted, "batch_size": 1, "min_length": 0,
                  "do_sample": params["temperature"] > 0, "repetition_penalty": 1.0,
                  "random_seed": -1 if seed is None else int(seed)}
        if params["temperature"] > 0:
            search.update(temperature=params["temperature"],
                          top_k=params["top_k"] or self.vocab, top_p=params["top_p"])
        p.set_search_options(**search)
        if self.ngram:
            p.set_speculative_options(ngram_size=self.ngram, max_draft_tokens=self.k)
        generator = og.Generator(self.model, p)
        generator.append_tokens(np.array(prefix, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        tokens = [int(t) for t in generator.get_sequence(0)][len(prefix):][:wanted]
        if len(tokens) < wanted:
            # done short of max_length: it drew its end-of-sequence id, which it leaves out of
            # the sequence (recorded: tests/recorded/onnxruntime-genai.json)
            tokens.append(self.eos)
        s = generator.get_speculative_stats()
        return tokens, {"drafted": int(s["draft_tokens_proposed"]),
                        "accepted": int(s["draft_tokens_accepted"]), "rounds": int(s["rounds"])}


# ----------------------------------------------------------------- the kit's side

def find() -> Environment:
    python = engines_dir() / FOLDER / "bin" / "python"
    if not python.exists():
        raise EngineMissing(f"onnxruntime-genai is not installed ({python}): run `make "
                            f"engine-onnxruntime-genai` (its own environment, about 1 minute)")
    return Environment(python)


def version(env: Environment) -> str:
    site = site_packages(env)
    found = glob.glob(str(Path(site) / "onnxruntime_genai-*.dist-info"))
    if not found:
        raise EngineMissing(f"no onnxruntime_genai in {site}: run `make engine-onnxruntime-genai`")
    return "onnxruntime-genai " + Path(found[0]).name.removesuffix(".dist-info").split("-", 1)[1]


def site_packages(env: Environment | None) -> str:
    if env is None:
        return f".engines/{FOLDER}/lib/python3.11/site-packages"
    found = glob.glob(str(env.python.parent.parent / "lib" / "python*" / "site-packages"))
    if not found:
        raise EngineMissing(f"{env.python.parent.parent} holds no site-packages")
    return found[0]


def models_dir(export_dir) -> Path:
    return Path(export_dir) / FOLDER


def folder(method: Method | None) -> str:
    """The converted folder a server loads: the target, or the target paired with a draft."""
    if method is None or method.drafter.export is None:
        return "target"
    return f"spec-{method.drafter.export}"


def prepare_commands(env: Environment | None, export_dir,
                     drafts=("draft-early-exit", "draft-random")) -> list:
    """(what, Command): each model converted by the builder (float32, CPU), then the target
    paired with each draft (and with itself, the perfect draft) in a folder of its own."""
    python = sys.executable if env is not None else "python"
    out = models_dir(export_dir)
    site = site_packages(env)
    steps = [(f"convert {name} with onnxruntime-genai's model builder (float32, CPU)",
              Command([python, "-m", "properties.engines.onnxruntime_genai", "convert",
                       Path(export_dir) / name, out / name, "--engine-site", site]))
             for name in ("target",) + tuple(drafts)]
    for draft in ("target",) + tuple(drafts):
        steps.append((f"pair the target with {draft} (max_draft_tokens {K})",
                      Command([python, "-m", "properties.engines.onnxruntime_genai", "pair",
                               out / "target", out / draft, out / f"spec-{draft}",
                               "--k", str(K)])))
    return steps


def prepare(env: Environment, export_dir, log) -> None:
    """The converted models and the speculative folders, beside the export."""
    # the drafts the export holds (the trained pair's run exports only the draft it uses)
    drafts = tuple(d for d in ("draft-early-exit", "draft-random", "draft-small")
                   if (Path(export_dir) / d / "config.json").exists())
    for what, step in prepare_commands(env, export_dir, drafts):
        made = Path(step.argv[5] if step.argv[3] == "convert" else step.argv[6])
        if (made / "genai_config.json").exists():
            continue
        done = subprocess.run([str(a) for a in step.argv], capture_output=True, text=True)
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(f"$ {step.shell()}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed (log {log}):\n{done.stderr[-2000:]}")


def command(env: Environment | None, export_dir, method: Method | None, port: int) -> Command:
    config = json.loads((Path(export_dir) / "target" / "config.json").read_text()) \
        if (Path(export_dir) / "target" / "config.json").exists() else {"vocab_size": 0}
    session = {"model": str(models_dir(export_dir) / folder(method)),
               "vocab_size": config["vocab_size"], "eos": eos_id(config),
               "k": None if method is None else method.k,
               "ngram": NGRAM if method is not None and method.drafter.lookup else None,
               # the kit's own drafts go through the Engine API (refused here: Session)
               "caller_drafts": method is not None and isinstance(method.drafter, Scripted)}
    return python_api.worker((env or RECIPE).python, Path(__file__).resolve(), session, port,
                             env={"OMP_NUM_THREADS": "1"})


def eos_id(config: dict) -> int:
    """The end-of-sequence id the converted models carry: the checkpoint's, else the last
    token of the vocabulary (the kit's models name none)."""
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else int(config["vocab_size"]) - 1


# ----------------------------------------------------------------- the conversion steps

def head_size(config: dict) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def convert(source, out, engine_site) -> None:
    """The builder on a copy of `source` whose config names an end-of-sequence id; refused
    (SystemExit naming the shape) for a head size the engine's attention cannot run."""
    source, out = Path(source), Path(out)
    config = json.loads((source / "config.json").read_text())
    size = head_size(config)
    if size % HEAD_MULTIPLE:
        raise SystemExit(f"{source.name}: head size {size} (hidden_size {config['hidden_size']}"
                         f", {config['num_attention_heads']} heads) is refused by "
                         f"onnxruntime-genai's CPU attention, which needs a multiple of "
                         f"{HEAD_MULTIPLE}: this model cannot be served by it")
    staged = out.parent / f".{out.name}-source"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(source, staged)
    config["eos_token_id"] = eos_id(config)
    (staged / "config.json").write_text(json.dumps(config, indent=2))
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                           str(staged), "-o", str(out), "-p", "fp32", "-e", "cpu"],
                          env=dict(os.environ, PYTHONPATH=str(engine_site),
                                   OMP_NUM_THREADS="1"), capture_output=True, text=True)
    shutil.rmtree(staged, ignore_errors=True)
    sys.stdout.write(done.stdout[-3000:])
    if done.returncode != 0:
        raise SystemExit(f"the builder failed on {source}:\n{done.stderr[-3000:]}")
    genai = json.loads((out / "genai_config.json").read_text())
    # one thread per session: the kit's machine is shared, and the speed-up compares like
    genai["model"]["decoder"]["session_options"]["intra_op_num_threads"] = 1
    # the builder makes the padding id the end-of-sequence id when the checkpoint names none,
    # and after a prompt ending with the padding id the runtime gives the logits of the prompt
    # without it: every continuation past an end of sequence would be wrong
    # (tests/findings/onnxruntime_genai_pad_mask/). An id outside the vocabulary is no
    # token a prompt holds.
    genai["model"]["pad_token_id"] = int(config["vocab_size"])
    (out / "genai_config.json").write_text(json.dumps(genai, indent=2))


def pair(target, draft, out, k: int) -> None:
    """The target's folder with `draft` in a subfolder, named as its draft, k per round."""
    target, draft, out = Path(target), Path(draft), Path(out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(target, out)
    shutil.copytree(draft, out / "draft")
    genai = json.loads((out / "genai_config.json").read_text())
    block = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    block["filename"] = "draft/" + block["filename"]
    genai["model"]["draft"] = block
    genai["speculative"] = {"max_draft_tokens": k}
    (out / "genai_config.json").write_text(json.dumps(genai, indent=2))


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m properties.engines.onnxruntime_genai")
    steps = parser.add_subparsers(dest="step", required=True)
    c = steps.add_parser("convert", help="a checkpoint to an onnxruntime-genai folder")
    c.add_argument("source")
    c.add_argument("out")
    c.add_argument("--engine-site", required=True, help="the engine's site-packages")
    p = steps.add_parser("pair", help="a target folder naming a draft")
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("out")
    p.add_argument("--k", type=int, default=K)
    args = parser.parse_args(argv)
    if args.step == "convert":
        convert(args.source, args.out, args.engine_site)
    else:
        pair(args.target, args.draft, args.out, args.k)
    return 0


ENGINE = Engine(
    name="onnxruntime-genai", title="onnxruntime-genai (its Python API, in the kit's worker)",
    setup="make engine-onnxruntime-genai", validated=(f"onnxruntime-genai {VERSION}",),
    methods=METHODS, dialect=python_api.InProcess(name="onnxruntime-genai"), find=find,
    version=version, command=command, prepare=prepare, prepare_commands=prepare_commands,
    start_timeout=120.0, schedule="prompt", concurrency=1,
    head_sizes=(f"onnxruntime-genai's CPU attention needs head_dim a multiple of {HEAD_MULTIPLE}",
                lambda d: d % HEAD_MULTIPLE == 0))


if __name__ == "__main__":
    raise SystemExit(main())
