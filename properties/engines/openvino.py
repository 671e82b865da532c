"""OpenVINO GenAI (Intel's generation API over the OpenVINO runtime), driven through its Python
API in its own environment (``make engine-openvino``: .engines/openvino, openvino-genai
2026.4.1.0 with optimum-intel 2.2.0 for the conversion, transformers < 5.6, torch 2.13.0+cpu;
about 2 minutes and 1.6 GB).

Conversion (`prepare`): ``optimum-cli export openvino --model DIR --task
text-generation-with-past --weight-format fp32 OUT`` per model, 20 to 40 s each. The kit's
32-token tokenizer (a byte-level BPE with no merges and no added token) does not convert
("Incorrect number of inputs passed to BPETokenizer", openvino-tokenizers 2026.4.1), and a
speculative pipeline will not start without a tokenizer even when it is fed ids. With one added
special token at id vocab_size it converts and maps every id to itself (checked on this
machine, 2026-12-03): so each model is converted from a staged copy of its export whose
tokenizer has that token, and the export itself (what every other engine loads) is unchanged.
A tokenizer that already has an added token (the trained pair's) is staged as it is.

At run time: token ids in and out through an ``ov.Tensor``. The checkpoints name no
end-of-sequence id, and the engine refuses the null one ("'stop_token_ids' must be non-negative
... -1"): the session sets the end-of-sequence id to vocab_size, which no model can emit, and a
request's stop ids as ``stop_token_ids``. Speculation with a draft model is
``LLMPipeline(target, "CPU", draft_model=draft_model(draft, "CPU"))`` with
``num_assistant_tokens``; prompt lookup is ``LLMPipeline(target, "CPU", prompt_lookup=True)``
with ``num_assistant_tokens`` and ``max_ngram_size``. Both run on the continuous-batching
(paged attention) pipeline, whose SchedulerConfig users leave at LLMPipeline's default
(src/cpp/src/utils.cpp get_latency_oriented_scheduler_config: prefix caching on, the batched
tokens unlimited); the `-no-prefix-caching` methods set ``enable_prefix_caching`` off.
Inference and the KV cache in float32, as the exported weights: the CPU plugin's default KV
cache is u8 and moved a 4-token sequence's log-probability by 2e-4 (measured 2026-12-03;
float32 brings it within 1e-6 of the kit's float64 law).

Batches: LLMPipeline takes one generation config per call, so requests in flight together
(up to CONCURRENCY, gathered by the worker) go to one ``ContinuousBatchingPipeline.generate``
call with one GenerationConfig per row (greedy and sampled rows mixed, each its own seed), built
with the same models, draft or prompt lookup, device settings and SchedulerConfig as the
method's LLMPipeline (which is itself that pipeline behind an adapter,
src/cpp/src/llm/pipeline_continuous_batching_adapter.hpp); a request alone keeps LLMPipeline.

EAGLE-3 (issue 40), read from openvino.genai's source (src/cpp/src/speculative_decoding/:
eagle3_model_transforms.cpp, continuous_batching/eagle3_strategy.cpp; the tree of 2026-08-21,
whose eagle3_model_transforms.cpp the 2026.4.1 wheel's messages cite line for line: 35, 57, 72,
314) and optimum-intel 2.2.0's exporter:

- the draft is a ``LlamaForCausalLMEagle3`` checkpoint converted by ``optimum-cli export
  openvino --task text-generation-with-past --trust-remote-code`` (optimum-intel loads it
  through its own model_patcher.LlamaEagle3ForCausalLM, a Llama layer: no q/k norm, so the kit
  exports a qk_norm=False head; without --trust-remote-code it loads a plain LlamaForCausalLM
  and fails). The exporter marks the IR ``eagle3_mode`` in its rt_info, and LLMPipeline(target,
  "CPU", draft_model=draft_model(head, "CPU")) then runs the head on the continuous-batching
  pipeline (Eagle3DecodingImpl; the stateful one needs an NPU). A checkpoint without ``d2t``
  (a head over the whole vocabulary, the kit's) converts with whatever memory the missing
  buffer held ("model.d2t | MISSING", then garbage in the IR's d2t constant, seen 2026-12-07):
  the staged copy adds d2t = 0 (target id - draft id) and t2d.
- which hidden states: ``hidden_layers_list`` holds exactly three decoder-layer ids ("Eagle3 is
  expected to provide exactly three layers for extraction"); for each id L the target's graph
  gives the first residual Add in ``layers.L/`` whose second input is a MatMul of a Multiply
  (is_hidden_state_residual_node): the MLP's residual, that is layer L's residual output,
  before any norm (reference.hidden's where="output"; vLLM's and llama.cpp's ids name a layer's
  input, so L = their id - 1). Measured so on the trained target (below). Concatenated in the
  list's order, the head's fc is moved into the target's graph (move_fc_from_draft_to_main) and
  the head chains its own layer's residual output (the "midlayer" Add), as the reference does.
  Without a list, a target of 10 or more layers gets (2, N / 2, N - 3); a smaller one is refused.
  The Python API cannot pass the list: a Python list of ints becomes a vector of int64
  (src/python/py_utils.cpp) and the check wants int32 ("hidden_layers_list must be a vector of
  int32_t values"), so the kit writes it into the converted head's rt_info, which draft_model()
  reads (apply_eagle3_rt_info) as a vector of int.
- the kit's served target has two layers, so two layer outputs: no three distinct ids exist and
  the method `eagle3` is refused (the engine's words in it). `eagle3-deep` (and
  `-no-prefix-caching`) serves a 4-layer variant of it instead (properties/models/served.py
  VARIANTS, target and baseline alike) with its own seeded head reading layer outputs 0, 1, 2,
  so the served families judge this path. The trained target has six:
  `eagle3-trained` serves the trained head (a Qwen3 layer) in a Llama layer, its q/k norm
  dropped (properties/export/heads.py llama_layer), reading the inputs of layers 1, 3, 5 =
  hidden_layers_list [0, 2, 4].

Counts: ``extended_perf_metrics`` per generate call (``get_num_draft_tokens``,
``get_num_accepted_tokens``), the whole call's in a batch (every row of a batch carries the
same metrics), so the kit reads them as engine-wide totals around its requests, as a server's
counters; none for prompt lookup, whose speculation the kit shows by its own lookup replay
(properties/speculation.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from properties.adapters.dialects import read_prometheus
from properties import methods
from properties.engines import Command, Engine, EngineMissing, Method, inprocess, python_api
from properties.engines import llamacpp
from properties.engines.local import engines_dir, output
from properties.methods import HeadDraft
from reference.hidden import HiddenStates

VERSION = "2026.4.1.0"
K = 4
# prompt lookup: the longest n-gram of the context it matches (it tries shorter ones after)
NGRAM = 3
FOLDER = "openvino"          # converted models, beside the export
STAGED = "openvino-source"   # the staged copies they are converted from
# requests answered together: rows of one ContinuousBatchingPipeline call (Session.BATCH)
CONCURRENCY = 8
# the SchedulerConfig variants: None is LLMPipeline's default (what users run)
DEFAULT, NO_PREFIX_CACHING = None, {"enable_prefix_caching": False}


@dataclass(frozen=True)
class OpenVINOMethod(Method):
    scheduler: dict | None = None
    # EAGLE-3's tree drafting: (tree_depth, branching_factor) in each request's GenerationConfig,
    # k (num_assistant_tokens) the tree's nodes sent to verification; () drafts a chain. Greedy
    # only: "Tree search (EAGLE) is incompatible with do_sample=true" (generation_config.cpp:366
    # of the 2026-08-21 tree; :378 in the 2026.4.1.0 wheel's message)
    tree: tuple = ()


def _methods() -> dict:
    base = (("draft-early-exit", "draft model: the target's first layers (an early exit)", methods.EARLY_EXIT),
            ("draft-random", "draft model: an independent random model", methods.RANDOM),
            ("perfect-draft", "draft model: the target itself", methods.PERFECT),
            ("prompt-lookup", f"prompt lookup (max_ngram_size {NGRAM})",
             methods.Lookup(1, NGRAM)),
            ("draft-small", "draft model: a trained pair's small draft "
                            "(--models trained or trained-large)",
             methods.SMALL))
    found = {}
    for name, description, draft in base:
        # the drafts a trained pair has also run on both pairs (make engines)
        pairs = methods.BOTH_PAIRS if draft in (methods.EARLY_EXIT, methods.SMALL) else ()
        found[name] = OpenVINOMethod(name, description + " (default SchedulerConfig)", draft, K,
                                     pairs=pairs)
        found[f"{name}-no-prefix-caching"] = OpenVINOMethod(
            f"{name}-no-prefix-caching", description + " (SchedulerConfig: prefix caching off)",
            draft, K, scheduler=NO_PREFIX_CACHING, pairs=pairs)
    return found


# the trained head's convention (reference/trained/eagle3: the inputs of layers 1, 3, 5 of the
# 6-layer trained target), which OpenVINO reads as hidden_layers_list [0, 2, 4]
EAGLE3_TRAINED_HIDDEN = HiddenStates((1, 3, 5), "input")
# the weight-bound pair's head (reference/trained-large/eagle3: the inputs of layers 1, 4, 7 of
# its 8-layer target), read as hidden_layers_list [0, 3, 6]
EAGLE3_TRAINED_LARGE_HIDDEN = HiddenStates((1, 4, 7), "input")
# the kit's served Llama-layer head for the 2-layer target: llama.cpp's (one export folder holds
# one head, and any head of that target is refused here alike: _head_methods), without its
# replays flag, which was measured on llama.cpp
SERVED_LLAMA_HEAD = replace(llamacpp.METHODS["eagle3"].drafter, replays=False)
# the engine's words when the 2-layer served target is asked for any three layers (run here
# 2026-12-07 on 2026.4.1.0, rt_info hidden_layers_list set as the kit sets it)
EAGLE3_REFUSED = (
    "OpenVINO GenAI reads exactly three distinct decoder-layer outputs of the target, and the "
    "kit's served target has two layers: with the served head's layers it answers \"Check "
    "'residual_outputs.size() == patterns.size()' failed at ... eagle3_model_transforms.cpp:314: "
    "Number of extracted hidden states does not match the requested number.\" (the same for "
    "[0, 1, 1]; with [0, 1]: \"Eagle3 is expected to provide exactly three layers for "
    "extraction\"; with no list: \"num_decoder_layers must be at least 10 for automatic hidden "
    "layer selection, got: 2\"). Not a GPU matter: it runs on this CPU with a target of three "
    "or more layers, as eagle3-trained does (--models trained)")


# a head for the deeper variant of the served target (properties/models/served.py VARIANTS:
# 4 layers), made as the served heads are (seeded random, its readout fitted; a Llama layer):
# it reads the inputs of layers 1, 2, 3, three distinct layer outputs, hidden_layers_list
# [0, 1, 2]; its run serves that target, as the baseline too
DEEP_HIDDEN = HiddenStates((1, 2, 3), "input")
DEEP_HEAD = HeadDraft("eagle3", "head-eagle3-llama-deep", DEEP_HIDDEN, qk_norm=False,
                      target="target-deep")
# EAGLE-3's tree (tree_depth, branching_factor): the draft runs 3 steps keeping the 2 best
# children per layer, 2 * 2 * 2 + 2 = 10 candidates, of which the best K are verified
# (generation_config.hpp:628-632)
TREE = (3, 2)


def _head_methods() -> dict:
    """EAGLE-3 through optimum-intel's Llama-layer head (qk_norm False), chain drafting (the
    default: tree_depth 0). replays: not set, since the engine's counts were not
    all equal to the exact replay: measured 2026-12-07 on the trained target, 4 greedy requests
    of 32 tokens, k 4, hidden_layers_list [0, 2, 4]: (58, 14), (40, 19), (44, 18), (68, 12)
    drafted / accepted where the replay with the inputs of layers 1, 3, 5 gives (59, 15),
    (41, 20), (45, 19), (68, 12): three of four one drafted and one accepted short, finding 5's
    signature (the last round left out, tests/findings/openvino_draft_counts), the fourth
    equal. With [1, 3, 5] the engine's counts followed the replay with the outputs of layers
    1, 3, 5 instead (three of four equal, the fourth finding 5's): ids name layer outputs. The
    launcher's runs (48 tokens): eagle3-trained 313 / 102 against the exact 314 / 103, prompt 3
    finding 5's; eagle3-trained-large 377 / 88 against 378 / 89, prompt 2 finding 5's."""
    return {m.name: m for m in (
        OpenVINOMethod("eagle3", f"EAGLE-3 head (seeded random init, a Llama layer: llama.cpp's "
                                 f"{SERVED_LLAMA_HEAD.head}) reading the "
                                 f"{SERVED_LLAMA_HEAD.hidden.describe()} (default SchedulerConfig)",
                       SERVED_LLAMA_HEAD, K, refused=EAGLE3_REFUSED),
        # the kit's served families on a target deep enough (issue 40), under both
        # SchedulerConfigs, as the draft models
        OpenVINOMethod("eagle3-deep", "EAGLE-3 head (seeded random init, a Llama layer) of the "
                                      "4-layer variant of the served target (target-deep), "
                                      "reading its layer outputs 0, 1, 2 (default "
                                      "SchedulerConfig)", DEEP_HEAD, K),
        OpenVINOMethod("eagle3-deep-no-prefix-caching",
                       "EAGLE-3 head (seeded random init, a Llama layer) of the 4-layer variant "
                       "of the served target (target-deep), reading its layer outputs 0, 1, 2 "
                       "(SchedulerConfig: prefix caching off)", DEEP_HEAD, K,
                       scheduler=NO_PREFIX_CACHING),
        # its tree drafting: greedy requests only (a sampled one is refused, see TREE)
        OpenVINOMethod("eagle3-deep-tree", f"EAGLE-3 tree drafting (tree_depth {TREE[0]}, "
                                           f"branching_factor {TREE[1]}, {K} nodes verified) "
                                           f"with the eagle3-deep head; greedy only (default "
                                           f"SchedulerConfig)", DEEP_HEAD, K, tree=TREE),
        OpenVINOMethod("eagle3-trained", "EAGLE-3: the trained head in a Llama layer (q/k norm "
                                         "dropped) on the trained target's layer outputs 0, 2, "
                                         "4 (--models trained; default SchedulerConfig)",
                       HeadDraft("eagle3", "head-eagle3-llama-trained", EAGLE3_TRAINED_HIDDEN,
                                 trained_only=True, qk_norm=False), K, pairs=("trained",)),
        # the weight-bound pair's head reads other layers, so it is a method of its own
        OpenVINOMethod("eagle3-trained-large",
                       "EAGLE-3: the weight-bound pair's trained head in a Llama layer (q/k norm "
                       "dropped) on its target's layer outputs 0, 3, 6 (--models trained-large; "
                       "default SchedulerConfig)",
                       HeadDraft("eagle3", "head-eagle3-llama-trained-large",
                                 EAGLE3_TRAINED_LARGE_HIDDEN, trained_only=True, qk_norm=False),
                       K, pairs=("trained-large",)),
    )}


METHODS = _methods() | _head_methods()
# the heads the methods load, by export folder
HEADS = tuple(sorted({m.drafter.head for m in METHODS.values()
                      if isinstance(m.drafter, HeadDraft)}))


def openvino_layers(hidden: HiddenStates) -> tuple:
    """The hidden_layers_list that makes OpenVINO GenAI feed a head the states `hidden` names:
    its id L is layer L's residual output (where="output" layer L, where="input" layer L + 1).
    The input of layer 0 (the embeddings) has no id: it maps to -1, which the engine refuses
    as it refuses any id it does not find in the graph."""
    if not isinstance(hidden, HiddenStates) or hidden.normed:
        raise ValueError(f"openvino_layers: hidden={hidden!r}: OpenVINO GenAI feeds un-normed "
                         f"layer outputs, a reference.hidden.HiddenStates with normed=False")
    shift = 1 if hidden.where == "input" else 0
    return tuple(layer - shift for layer in hidden.layers)


@dataclass(frozen=True)
class Environment:
    python: Path


RECIPE = Environment(Path("python"))    # as a user types it in the engine's environment


# ----------------------------------------------------------------- the engine, in its process

class Session:
    """One LLMPipeline (a target, with a draft model, prompt lookup or neither) behind the kit's
    worker (properties/engines/inprocess.py): compiled alone in the engine's environment."""

    PARAMS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p", "stop")
    BATCH = 8   # rows per ContinuousBatchingPipeline call (the engine file's CONCURRENCY)

    def __init__(self, config):
        self.settings = config
        self.pipe, self.batcher = self.build(), self.build(batched=True)
        self.eos, self.k, self.ngram = int(config["eos"]), config.get("k"), config.get("ngram")
        self.lookup = bool(config.get("prompt_lookup"))
        self.tree = tuple(config.get("tree") or ())
        self.speculates = bool(config.get("draft")) or self.lookup
        # the engine's counts, as it reports them per generate call (per request alone, per
        # call in a batch), added up: the worker's /metrics
        self.counts = {"drafted": 0, "accepted": 0}

    def build(self, batched=False):
        """The LLMPipeline that answers a request alone, or (`batched`) the
        ContinuousBatchingPipeline that answers a batch: the same models, draft or prompt
        lookup, device settings and SchedulerConfig."""
        import openvino_genai as genai
        config = self.settings
        # float32 inference and KV cache, as the exported weights (see the module's docstring)
        device = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        options = dict(device)
        scheduler = genai.SchedulerConfig()
        # LLMPipeline's own default, then the method's change (utils.cpp
        # get_latency_oriented_scheduler_config: unlimited batched tokens, prefix caching)
        scheduler.max_num_batched_tokens = 2**63 - 1
        scheduler.enable_prefix_caching = True
        for key, value in (config.get("scheduler") or {}).items():
            setattr(scheduler, key, value)
        if config.get("scheduler") is not None:
            options["scheduler_config"] = scheduler
        if config.get("draft"):
            options["draft_model"] = genai.draft_model(config["draft"], "CPU", **device)
        if config.get("prompt_lookup"):
            options["prompt_lookup"] = True
        if batched:
            options.pop("scheduler_config", None)
            return genai.ContinuousBatchingPipeline(config["target"], scheduler, "CPU", options)
        return genai.LLMPipeline(config["target"], "CPU", **options)

    def counters(self):
        return dict(self.counts)

    def config(self, params, batched=False):
        import os
        c = (self.batcher.get_config() if batched else self.pipe.get_generation_config())
        # an end-of-sequence id no model emits (the checkpoints name none, and -1 is refused);
        # the request's stop ids are the only ones (ContinuousBatchingPipeline checks that they
        # hold the end-of-sequence id, which no model emits: it is added there)
        c.set_eos_token_id(self.eos)
        stops = set(int(t) for t in params["stop_token_ids"])
        c.stop_token_ids = stops | {self.eos} if batched else stops
        c.ignore_eos = not stops
        c.max_new_tokens = int(params["max_tokens"])
        c.min_new_tokens = 0
        sampled = params["temperature"] > 0
        c.do_sample = sampled
        if sampled:
            c.temperature = float(params["temperature"])
            c.top_p = float(params["top_p"])
            if params["top_k"]:
                c.top_k = int(params["top_k"])
        # a request without a seed draws a fresh one (the config's default seed is a constant)
        seed = params["seed"]
        c.rng_seed = int(seed) if seed is not None else int.from_bytes(os.urandom(4), "little")
        for key in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p"):
            if key in params:
                setattr(c, key, float(params[key]))
        if params.get("stop"):
            c.stop_strings = set(params["stop"])
        if self.speculates:
            c.num_assistant_tokens = int(self.k)
        if self.tree:   # a sampled request is refused in the engine's words (validate)
            c.tree_depth, c.branching_factor = (int(v) for v in self.tree)
        if self.lookup:
            c.max_ngram_size = int(self.ngram)
        return c

    def generate(self, prompt, params):
        import numpy as np
        import openvino as ov
        c = self.config(params)
        try:
            result = self.pipe.generate(ov.Tensor(np.array([prompt], dtype=np.int64)), c)
        except RuntimeError:
            # after a failed request a speculative pipeline drafts nothing more, silently
            # (tests/findings/openvino_draft_prefix_cache): the failure is answered, and
            # a new pipeline serves the next request, as a server that died is restarted
            self.pipe = self.build()
            raise
        ids = [int(t) for t in result.tokens[0]]
        finish = self.finish(ids, params)
        if not self.speculates:
            return ids, finish, None
        if self.lookup:   # no counts: the kit's lookup replay shows the speculation
            return ids, finish, None
        stats = self.counted(result.extended_perf_metrics)
        return ids, finish, stats

    def generate_batch(self, prompts, params_list):
        """The rows in one ContinuousBatchingPipeline.generate call, each with its own
        GenerationConfig (greedy and sampled rows, each its own rng_seed). Its
        extended_perf_metrics are the call's, the same for every row
        (fast_draft_strategy.hpp generate_common: each result gets the pipeline's metrics of
        the call): so a row carries no counts of its own, and the call's counts go to the
        engine-wide totals."""
        import numpy as np
        import openvino as ov
        configs = [self.config(p, batched=True) for p in params_list]
        try:
            results = self.batcher.generate(
                [ov.Tensor(np.array([p], dtype=np.int64)) for p in prompts], configs)
        except RuntimeError:
            # as in generate: a pipeline whose request failed is not trusted with the next
            self.batcher = self.build(batched=True)
            raise
        rows = []
        for result, params in zip(results, params_list):
            ids = [int(t) for t in result.m_generation_ids[0]]
            rows.append((ids, self.finish(ids, params), None))
        if self.speculates and not self.lookup and results:
            self.counted(results[0].extended_perf_metrics)
        return rows

    def finish(self, ids, params):
        stops = set(params["stop_token_ids"])
        # short of max_tokens: a stop id (kept at the end) or a stop string (cut) ended it
        stopped = len(ids) < params["max_tokens"] or (bool(ids) and ids[-1] in stops)
        return "stop" if stopped else "length"

    def counted(self, metrics):
        """One generate call's counts, added to the engine-wide totals."""
        stats = {"drafted": int(metrics.get_num_draft_tokens()),
                 "accepted": int(metrics.get_num_accepted_tokens())}
        for key in self.counts:
            self.counts[key] += stats[key]
        return stats



# ----------------------------------------------------------------- the kit's side

@dataclass(frozen=True)
class OpenVINO(python_api.InProcess):
    """The worker's answers for an LLMPipeline (a request alone) or a
    ContinuousBatchingPipeline (a batch): a matched stop string's tokens are cut from the
    output (include_stop_str_in_output is false by default), and no per-token
    log-probabilities or logit bias exist in its GenerationConfig. The engine counts per
    generate call, and a batch is one call: a request's counts are read as the difference of
    the worker's engine-wide totals around it (per_response False, as for a server's /metrics;
    the engine counts no rounds). `counted` False (prompt lookup): the engine reports no draft
    counts."""

    name: str = "openvino"
    counted: bool = True
    per_response: bool = False

    def counters(self, client):
        if not self.counted:
            return None
        return read_prometheus(client, (inprocess.DRAFTED,), (inprocess.ACCEPTED,))

    def counters_missing(self, client):
        if self.counted:
            return super().counters_missing(client)
        return (f"cannot judge: {client.url} ({self.name}, prompt lookup) reports no draft "
                f"counts (extended_perf_metrics has none for prompt lookup)")


DIALECT = OpenVINO(
    stop_string_in_ids=False,
    unsupported={"logit_bias": "GenerationConfig has no logit bias",
                 "logprobs": "EncodedResults carries one score per sequence (the sum of its "
                             "log-probabilities), no per-token log-probabilities"},
    notes=("token ids in and out through ov.Tensor; a request alone: LLMPipeline.generate; "
           f"requests in flight together: one ContinuousBatchingPipeline.generate call (at "
           f"most {CONCURRENCY} rows, each its own GenerationConfig)",
           "a matched stop id ends the output (kept); a matched stop string is cut",
           "draft counts per generate call: extended_perf_metrics, the whole call's in a batch "
           "(none for prompt lookup); read as engine-wide totals"))
LOOKUP = replace(DIALECT, counted=False)


def dialects(method):
    return LOOKUP if method is not None and method.drafter.lookup else DIALECT


def find() -> Environment:
    python = engines_dir() / FOLDER / "bin" / "python"
    if not python.exists():
        raise EngineMissing(f"OpenVINO GenAI is not installed ({python}): run `make "
                            f"engine-openvino` (its own environment, about 2 minutes)")
    return Environment(python)


def version(env: Environment) -> str:
    return "openvino-genai " + output([env.python, "-c", "from importlib.metadata import "
                                       "version; print(version('openvino-genai'))"])


def converted(export_dir) -> Path:
    return Path(export_dir) / FOLDER


def drafts_of(export_dir) -> tuple:
    """The draft models of an export (the kit's or the trained pair's), by folder."""
    return tuple(sorted(p.name for p in Path(export_dir).iterdir()
                        if p.name.startswith("draft-") and (p / "config.json").exists()))


def prepare_commands(env: Environment | None, export_dir, drafts=None, heads=None) -> list:
    """(what, Command): each model staged with a tokenizer that converts, then converted by
    optimum-cli (float32 weights); a head's conversion loads optimum-intel's EAGLE-3 class
    (--trust-remote-code), then its IR gets the hidden_layers_list it reads."""
    return [step for name in models_of(export_dir, drafts, heads)
            for step in model_commands(env, export_dir, name)]


def models_of(export_dir, drafts=None, heads=None) -> tuple:
    """The folders of an export that a run converts: the target, the drafts and the heads of
    this engine's methods the export holds (all of them for a recipe without an export)."""
    root = Path(export_dir)
    if drafts is None:
        drafts = drafts_of(root) if root.exists() else ("draft-early-exit", "draft-random")
    if heads is None:
        heads = (tuple(h for h in HEADS if (root / h / "config.json").exists())
                 if root.exists() else tuple(h for h in HEADS if h in SERVED_HEADS))
    return ("target",) + tuple(drafts) + tuple(heads)


# the heads of the kit's served target (not a trained pair's, nor a deeper variant's): what a
# recipe without an export lists
SERVED_HEADS = tuple(sorted({m.drafter.head for m in METHODS.values()
                             if isinstance(m.drafter, HeadDraft) and not m.drafter.trained_only
                             and m.drafter.target == "target"}))


def head_of(name: str) -> HeadDraft | None:
    """The HeadDraft a head folder holds (None: a model, not a head)."""
    return next((m.drafter for m in METHODS.values()
                 if isinstance(m.drafter, HeadDraft) and m.drafter.head == name), None)


def model_commands(env: Environment | None, export_dir, name: str) -> list:
    """(what, Command) that make converted(export_dir)/name from the export's folder `name`."""
    kit = sys.executable if env is not None else "python"
    python = (env or RECIPE).python
    cli = python.parent / "optimum-cli" if env is not None else Path("optimum-cli")
    root = Path(export_dir)
    staged, out, head = root / STAGED / name, converted(root) / name, head_of(name)
    stage_argv = [kit, "-m", "properties.engines.openvino", "stage", root / name, staged]
    convert_argv = [cli, "export", "openvino", "--model", staged, "--task",
                    "text-generation-with-past", "--weight-format", "fp32", out]
    if head is None:
        return [(f"stage {name} with a tokenizer OpenVINO converts", Command(stage_argv)),
                (f"convert {name} to OpenVINO IR (optimum-cli, float32)",
                 Command(convert_argv, env={"OMP_NUM_THREADS": "1"}))]
    layers = " ".join(map(str, openvino_layers(head.hidden)))
    return [(f"stage the head {name} (d2t and t2d written, the target's tokenizer beside it)",
             Command(stage_argv + ["--tokenizer-from", root / "target"])),
            (f"convert the head {name} to OpenVINO IR (optimum-cli, float32; optimum-intel's "
             f"LlamaEagle3ForCausalLM, loaded as remote code)",
             Command(convert_argv[:-1] + ["--trust-remote-code", out],
                     env={"OMP_NUM_THREADS": "1"})),
            (f"write hidden_layers_list [{layers}] into the head's rt_info (the Python API "
             f"cannot pass it)",
             Command([python, "-c", SET_LAYERS, out, layers], env={"OMP_NUM_THREADS": "1"}))]


def prepare(env: Environment, export_dir, log) -> None:
    """The converted models, beside the export. A conversion is kept under the engine's
    environment by the digest of the exported files it was made from, and reused: the kit's
    exports are the same bits every run, and converting takes minutes on 2 cores."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    root = Path(export_dir)
    for name in models_of(root):
        steps = model_commands(env, root, name)
        out = converted(root) / name
        extra = ((root / "target" / "tokenizer.json").read_bytes(),) if head_of(name) else ()
        cache = env.python.parent.parent / "converted" / digest(root / name, *extra)
        if not (cache / "openvino_tokenizer.xml").exists():
            for what, part in steps:
                done = subprocess.run([str(a) for a in part.argv], capture_output=True,
                                      text=True, env={**os.environ, **part.env})
                with open(log, "a") as f:
                    f.write(f"$ {part.shell()}\n{done.stdout}{done.stderr}")
                if done.returncode != 0:
                    raise RuntimeError(f"{what} failed (log {log}):\n{done.stderr[-2000:]}")
            if not (out / "openvino_tokenizer.xml").exists():
                raise RuntimeError(f"{steps[1][0]}: optimum-cli wrote no openvino_tokenizer.xml "
                                   f"(the tokenizer did not convert; log {log})")
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(out, cache)
        elif not out.exists():
            shutil.copytree(cache, out)
            with open(log, "a") as f:
                f.write(f"{name}: the conversion of these exported bits, from {cache}\n")


def digest(model_dir, *extra: bytes) -> str:
    """sha256 of an exported model's files (names and bytes), with the kit's staging step and
    `extra` bytes (a head's: the target's tokenizer staged beside it)."""
    source = Path(__file__).read_bytes()
    h = hashlib.sha256(source[source.index(b"def stage("):source.index(b"def main(")])
    for item in sorted(Path(model_dir).iterdir()):
        if item.is_file():
            h.update(item.name.encode() + b"\0" + item.read_bytes())
    for part in extra:
        h.update(b"\0" + part)
    return h.hexdigest()[:32]


def command(env: Environment | None, export_dir, method, port: int) -> Command:
    root = converted(export_dir)
    config_file = Path(export_dir) / "target" / "config.json"
    vocab = json.loads(config_file.read_text())["vocab_size"] if config_file.exists() else 0
    session = {"target": str(root / "target"), "eos": vocab, "k": None, "draft": None,
               "prompt_lookup": False, "ngram": None,
               "scheduler": getattr(method, "scheduler", None),
               "tree": list(getattr(method, "tree", ()))}
    if method is not None:
        session["k"] = method.k
        if method.drafter.lookup:
            session.update(prompt_lookup=True, ngram=NGRAM)
        else:
            session["draft"] = str(root / method.drafter.export)
    return python_api.worker((env or RECIPE).python, Path(__file__).resolve(), session, port,
                             env={"OMP_NUM_THREADS": "1"})


# ----------------------------------------------------------------- the staging step

def stage(source, out, tokenizer_from=None) -> None:
    """A copy of export `source` (its files linked) whose tokenizer converts: the same
    tokenizer plus one added special token at id vocab_size when it has no added token. A head
    (`tokenizer_from`: the target's export, whose tokenizer the head has none of) gets that
    tokenizer, and its weights with d2t and t2d written (stage_head)."""
    from tokenizers import AddedToken, Tokenizer
    source, out = Path(source).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = Path(tokenizer_from).resolve() if tokenizer_from is not None else source
    if tokenizer_from is not None:
        stage_head(source, out)
        for item in tokenizer_dir.iterdir():
            if item.name in TOKENIZER_FILES and not (out / item.name).exists():
                os.symlink(item, out / item.name)
    for item in source.iterdir():
        target = out / item.name
        if item.name != "tokenizer.json" and not target.exists():
            os.symlink(item, target)
    if (out / "tokenizer.json").is_symlink():
        (out / "tokenizer.json").unlink()
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    if not tokenizer.get_added_tokens_decoder():
        size = tokenizer.get_vocab_size()
        tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True,
                                                 normalized=False)])
        if tokenizer.token_to_id("<|endoftext|>") != size:
            raise SystemExit(f"{source}: the added token did not get id {size}")
    tokenizer.save(str(out / "tokenizer.json"))


# the tokenizer's files a head is staged with, from the target's export
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def stage_head(source, out) -> None:
    """The head's weights in `out`/model.safetensors with the buffers optimum-intel's
    LlamaEagle3Model loads: d2t (target id - draft id; 0 over the whole vocabulary) and t2d
    (True where a target id is in the draft vocabulary). Left out, they are not initialized
    (optimum-intel reports "model.d2t | MISSING") and the IR's d2t is whatever memory held."""
    import torch
    from safetensors.torch import load_file, save_file
    config = json.loads((Path(source) / "config.json").read_text())
    if config.get("architectures") != ["LlamaForCausalLMEagle3"]:
        raise SystemExit(f"stage: {source} is no LlamaForCausalLMEagle3 head (architectures "
                         f"{config.get('architectures')}): optimum-intel converts only that "
                         f"EAGLE-3 layer")
    state = load_file(str(Path(source) / "model.safetensors"))
    vocab, draft = int(config["vocab_size"]), int(config["draft_vocab_size"])
    d2t = state.setdefault("d2t", torch.zeros(draft, dtype=torch.int64))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[d2t + torch.arange(draft)] = True
    state["t2d"] = t2d
    save_file(state, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})


# run by the engine's Python on a converted head: hidden_layers_list (argv[2], ids separated by
# spaces) into the IR's rt_info, read back by draft_model() as a vector of int; saved beside
# and moved over the IR, whose weights the read model still maps
SET_LAYERS = """
import os, sys, openvino as ov
folder, layers = sys.argv[1], sys.argv[2]
model = ov.Core().read_model(os.path.join(folder, "openvino_model.xml"))
model.set_rt_info(layers, ["hidden_layers_list"])
ov.save_model(model, os.path.join(folder, "layers.xml"), compress_to_fp16=False)
del model
for ext in (".xml", ".bin"):
    os.replace(os.path.join(folder, "layers" + ext), os.path.join(folder, "openvino_model" + ext))
"""


def main(argv) -> int:
    args = list(argv)
    tokenizer_from = None
    if "--tokenizer-from" in args:
        at = args.index("--tokenizer-from")
        if at + 1 >= len(args):
            print("--tokenizer-from needs the target's export folder")
            return 2
        tokenizer_from = args[at + 1]
        del args[at:at + 2]
    if len(args) != 3 or args[0] != "stage":
        print("python -m properties.engines.openvino stage EXPORTED_MODEL STAGED_COPY "
              "[--tokenizer-from TARGET_EXPORT]")
        return 2
    stage(args[1], args[2], tokenizer_from)
    return 0


ENGINE = Engine(
    name="openvino", title=f"OpenVINO GenAI LLMPipeline ({VERSION}, Python API)",
    setup="make engine-openvino", validated=(f"openvino-genai {VERSION}",), methods=METHODS,
    dialect=DIALECT, dialects=dialects, find=find, version=version, command=command,
    prepare=prepare, prepare_commands=prepare_commands, start_timeout=120.0,
    schedule="capped", concurrency=CONCURRENCY)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
