"""`transformers serve` (the project's own .venv, extra [serve]): speculation is per request
(prompt lookup, or the early exit through generation_config), so its baseline is the same server
without it.

On a trained pair (`--models trained`, `trained-large`) it runs two methods: prompt lookup, and
draft-early-exit, which is transformers' own self-speculation (generation/utils.py
_get_candidate_generator: `assistant_early_exit` = N gives EarlyExitCandidateGenerator, the
target itself as the assistant with base_model.config.num_hidden_layers set to N while it
drafts: its first N layers, its final norm and its head, which is the kit's early-exit draft,
properties/models/served.py standalone_early_exit). A request names no assistant model (only a
Python object can be one), so the separately trained small draft has no run here.

It serves text only: on a trained pair the prompt goes out and the completion comes back
through the pair's byte-level BPE tokenizer (`Transformers.for_pair`), not the kit's 32-token
one. It reports no speculation counters, so a trained run's acceptance is not judged (the
trained check says so: properties/serve/trained.py)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from properties.adapters.dialects import Dialect
from reference.penalties import Formula
from properties.engines import Command, Engine, EngineMissing, Method
from properties import methods
from properties.models import tokenizer


@dataclass(frozen=True)
class Transformers(Dialect):
    """`transformers serve`'s /v1/completions: a text prompt (through the served models'
    tokenizer) and a ``generation_config`` JSON string (sampling settings, stop ids as
    ``eos_token_id``, and speculation such as ``prompt_lookup_num_tokens``); text back, no
    `n`. `generation_config` is merged into every request's: how prompt lookup is turned on."""

    name: str = "transformers"
    honours_n: bool | None = False
    generation_config: dict = field(default_factory=dict)
    # the tokenizer.json of the trained pair served (`for_pair`); None: the kit's own models,
    # whose 32-character tokenizer properties.models.tokenizer is
    pair_tokenizer: str | None = None

    def for_pair(self, models: str) -> "Transformers":
        """This dialect for the pair `models` names ("kit": itself): its texts through the
        pair's tokenizer, and an early exit at the pair's own exit layer (its manifest)."""
        if models == "kit":
            return self
        from reference.pretrained import PAIR_DIRS
        directory = Path(PAIR_DIRS[models])
        config = dict(self.generation_config)
        if "assistant_early_exit" in config:
            manifest = json.loads((directory / "manifest.json").read_text())
            config["assistant_early_exit"] = int(manifest["early_exit_layers"])
        return replace(self, pair_tokenizer=str(directory / "tokenizer.json"),
                       generation_config=config)

    def _decode(self, ids) -> str:
        return _pair_tokenizer(self.pair_tokenizer).decode(list(ids)) if self.pair_tokenizer \
            else tokenizer.decode(ids)

    def same_text(self, read, ids) -> bool:
        """Whether `read` (ids this dialect read back from a text) is the text of `ids`: on a
        trained pair the re-encoding may split a text otherwise than the model did, so the
        trained check judges the text (properties/serve/trained.py check)."""
        return bool(self.pair_tokenizer) and self._decode(read) == self._decode(ids)

    def tokens(self, choice: dict, req, where: str) -> tuple:
        """The completion text through the pair's tokenizer on a trained pair (transformers
        serve returns no ids: a BPE text is re-encoded, which gives back the generated ids
        where the model generated the tokenizer's own segmentation of the text)."""
        if not self.pair_tokenizer or not isinstance(choice.get("text"), str):
            return super().tokens(choice, req, where)
        return tuple(_pair_tokenizer(self.pair_tokenizer).encode(choice["text"]).ids)

    def body(self, req, model) -> dict:
        sampling = req.sampling.temperature > 0
        config = {"do_sample": sampling, "max_new_tokens": req.max_tokens, "min_new_tokens": 0,
                  "eos_token_id": list(req.sampling.stop_ids) or None,
                  "top_k": req.sampling.top_k, "top_p": req.sampling.top_p}
        if sampling:
            config["temperature"] = req.sampling.temperature
        config.update(self.shaping(req.sampling))
        config.update(self.generation_config)
        body = {"model": model, "prompt": self._decode(req.prompt),
                "max_tokens": req.max_tokens, "generation_config": json.dumps(config)}
        if req.sampling.seed is not None:
            body["seed"] = req.sampling.seed
        if req.sampling.stop_strings:
            # cli/serving/completion.py: `stop` becomes generation_config.stop_strings
            body["stop"] = list(req.sampling.stop_strings)
        return body

    @staticmethod
    def shaping(s) -> dict:
        """repetition_penalty, min_p and the logit bias as generation-config fields
        (generation/utils.py _get_logits_processor: sequence_bias, RepetitionPenalty, then the
        sampling warpers with MinP after TopP; FORMULA below). Presence,
        frequency and logprobs have no field here (the dialect's `unsupported`): never sent."""
        config = {}
        if s.repetition_penalty != 1.0:
            config["repetition_penalty"] = s.repetition_penalty
        if s.min_p:
            config["min_p"] = s.min_p
        if s.logit_bias:
            # one-token sequences: SequenceBiasLogitsProcessor's list form [[ids], bias]
            config["sequence_bias"] = [[[t], b] for t, b in s.logit_bias]
        return config

    def with_generation_config(self, config: dict) -> "Transformers":
        return replace(self, generation_config=dict(config))

    def kit_options(self) -> tuple:
        if not self.generation_config:
            return ()
        return (f"--served-generation-config={json.dumps(self.generation_config)}",)


# Its sampling formula, from its source:
# transformers serve 5.24 (generation/utils.py GenerationMixin._get_logits_processor):
#   SequenceBiasLogitsProcessor (sequence_bias), then RepetitionPenaltyLogitsProcessor over
#   input_ids (prompt and output); for sampling TemperatureLogitsWarper, TopK, TopP, then
#   MinPLogitsWarper (min_p after top-p). No presence or frequency penalty (cli/serving/
#   completion.py maps frequency_penalty to repetition_penalty = 1 + f, not the OpenAI meaning,
#   and lists presence_penalty, logprobs and n as unused fields, ignored with a warning): the kit
#   sends none of those to it.
FORMULA = Formula("transformers", repetition_sees="prompt+output", counts_see=None,
                  min_p_after_top_p=True)

@lru_cache(maxsize=2)
def _pair_tokenizer(path: str):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


DIALECT = Transformers(
    notes=("text only; stop ids as generation_config eos_token_id",), formula=FORMULA,
    unsupported={"presence_penalty": "no such processor in transformers",
                 "frequency_penalty": "served as repetition_penalty = 1 + f, not the OpenAI penalty",
                 "logprobs": "an unused field of /v1/completions (ignored)"})
LOOKUP = {"prompt_lookup_num_tokens": 4}

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


def _command() -> list[str]:
    script = Path(sys.executable).parent / "transformers"
    if script.exists():
        return [str(script)]
    found = shutil.which("transformers")
    if found:
        return [found]
    return [sys.executable, "-c", "from transformers.cli.transformers import main; main()"]


def serve_command(model_dir, port: int, program=None) -> Command:
    """The command line of `transformers serve` for `model_dir` on `port` (float32, CPU);
    `program`: how `transformers` is started (default: the one beside this Python)."""
    return Command(list(program or _command()) + ["serve", str(model_dir), "--host", "127.0.0.1", "--port",
                                 str(port), "--device", "cpu", "--dtype", "float32",
                                 "--log-level", "warning"],
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "TOKENIZERS_PARALLELISM": "false"}, health="/health")


# The early exit's layer count is the pair's (Transformers.for_pair reads its manifest); this
# default is the committed pair's, so that a dialect asked without a pair still speculates.
EARLY_EXIT = {"assistant_early_exit": 2}
# The early exit's assistant is the model itself, so its draft length, schedule and confidence
# stop come from the served model's own generation_config, never from the request's
# (candidate_generator.py AssistedCandidateGenerator.__init__ deep-copies
# assistant_model.generation_config): `prepare` writes them into the served target's
# generation_config.json. 4 tokens a round, every round (schedule "constant": "heuristic" grows
# and shrinks it by the last round's acceptance), and no confidence stop (utils.py
# _get_stopping_criteria adds ConfidenceCriteria only for a threshold > 0; the default 0.4 ends
# a round at the first draft token below 0.4 probability, which the kit's k=4 rounds do not).
ASSISTANT = {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
CONFIGS = {"prompt-lookup": LOOKUP, "draft-early-exit": EARLY_EXIT}

METHODS = {"prompt-lookup": Method("prompt-lookup", "prompt lookup, 4 tokens (per request)",
                                   methods.LOOKUP, pairs=methods.BOTH_PAIRS),
           # the kit's own models leave it out: only a trained pair's run serves it
           "draft-early-exit": Method(
               "draft-early-exit", "self-speculation: the target's first layers "
               "(assistant_early_exit, per request; 4 tokens a round) on a trained pair",
               methods.ModelDraft("draft-early-exit", trained_only=True), 4,
               pairs=methods.BOTH_PAIRS)}


def find():
    reason = serve_available()
    if reason:
        raise EngineMissing(f"transformers serve cannot run: {reason}")
    return _command()


def version(env) -> str:
    import transformers
    return transformers.__version__


def command(env, export_dir, method, port):
    # env: find()'s program; None (the recipes): as a user types it
    return serve_command(Path(export_dir) / "target", port, env or ["transformers"])


def dialects(method):
    """Speculation is turned on per request (generation_config): the baseline is the same
    server asked without it."""
    if method is None:
        return DIALECT
    # a method described on the command line (methods.by_option) is prompt lookup, as before
    return DIALECT.with_generation_config(CONFIGS.get(method.name, LOOKUP))


# merges a JSON object into a JSON file: the recipe's step and what `prepare` runs
MERGE = ("import json, sys; path = sys.argv[1]; config = json.load(open(path)); "
         "config.update(json.loads(sys.argv[2])); json.dump(config, open(path, \"w\"), indent=2)")


def prepare_commands(env, export_dir, drafts=()) -> list:
    """(what, Command) writing the early exit's round settings (ASSISTANT) into the served
    target's generation_config.json: requests cannot set them. The baseline never asks for an
    assistant, so they change nothing for it, nor for prompt lookup (its own request field)."""
    python = sys.executable if env is not None else "python"
    path = Path(export_dir) / "target" / "generation_config.json"
    return [("the early exit's rounds (4 tokens, constant, no confidence stop) into the served "
             "target's generation_config.json", Command([python, "-c", MERGE, path,
                                                          json.dumps(ASSISTANT)]))]


def prepare(env, export_dir, log) -> None:
    """Runs prepare_commands (the recipe's step itself), its output into `log`."""
    import subprocess
    # env None (a caller without find()'s program): still this Python, never one off PATH
    for what, step in prepare_commands(env if env is not None else [sys.executable], export_dir):
        done = subprocess.run([str(a) for a in step.argv], capture_output=True, text=True)
        Path(log).write_text(f"{what}: {step.shell()}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed (log {log}):\n{done.stderr[-2000:]}")


ENGINE = Engine(
    name="transformers", title="transformers serve", setup="make (the project's .venv)",
    validated=(), methods=METHODS, dialect=DIALECT, find=find, version=version,
    command=command, dialects=dialects, prepare=prepare,
    prepare_commands=prepare_commands, start_timeout=180.0)
