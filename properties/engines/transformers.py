"""`transformers serve` (the project's own .venv, extra [serve]): speculation is per request
(prompt lookup through generation_config), so its baseline is the same server without it."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field, replace
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

    def body(self, req, model) -> dict:
        sampling = req.sampling.temperature > 0
        config = {"do_sample": sampling, "max_new_tokens": req.max_tokens, "min_new_tokens": 0,
                  "eos_token_id": list(req.sampling.stop_ids) or None,
                  "top_k": req.sampling.top_k, "top_p": req.sampling.top_p}
        if sampling:
            config["temperature"] = req.sampling.temperature
        config.update(self.shaping(req.sampling))
        config.update(self.generation_config)
        body = {"model": model, "prompt": tokenizer.decode(req.prompt),
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


METHODS = {"prompt-lookup": Method("prompt-lookup", "prompt lookup, 4 tokens (per request)",
                                   methods.LOOKUP)}


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
    """Prompt lookup is turned on per request (generation_config): the baseline is the same
    server asked without it."""
    return DIALECT.with_generation_config(LOOKUP) if method is not None else DIALECT


ENGINE = Engine(
    name="transformers", title="transformers serve", setup="make (the project's .venv)",
    validated=(), methods=METHODS, dialect=DIALECT, find=find, version=version,
    command=command, dialects=dialects, start_timeout=180.0)
