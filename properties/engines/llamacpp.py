"""llama.cpp's `llama-server`, built from the source vendored in the `llama-cpp-python` sdist
(``make engine-llamacpp``: cmake and gcc, about 12 minutes on 2 cores; the checkpoints are
converted to GGUF in float32 by the vendored `convert_hf_to_gguf.py`, see gguf_convert.py).

Speculation with a draft model needs ``--spec-type draft-simple`` beside ``-md``: a draft model
alone loads but drafts nothing (generation_settings["speculative.types"] says "none").
``--spec-draft-p-min 0`` and ``--spec-draft-n-min 0`` make the draft propose k tokens every
round (the default p_min stops a draft early when it is unsure), so the kit's exact replay of
the acceptance applies; the last round is capped to the tokens still wanted ("capped").

Every `--spec-type` of the built version that runs on the kit's models here is a method
(issue 40): draft-simple (the draft models), ngram-simple (`ngram`), the other n-gram drafters
(ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache: what each proposes and keeps is written
beside its drafter below, from the vendored source) and synthetic acceptance
(`--spec-synth-rates`), which the engine names "benchmarking only" and lossy; draft-eagle3
with the kit's EAGLE-3 heads (a Llama layer, the only EAGLE-3 layer llama.cpp computes),
converted to GGUF by the vendored converter beside the target: `eagle3` on target layers' inputs,
`eagle3-last-layer` with the pre-final-norm state too (EAGLE3_HIDDEN below); draft-dflash with
the kit's DFlash block drafter (`dflash`, reference/heads/dflash.py, exported as
DFlashDraftModel and converted beside the target: DFLASH_HIDDEN below); draft-dspark with the
kit's DSpark drafter (`dspark`, reference/heads/dspark.py, exported as DSparkDraftModel, the same
hidden states); draft-mtp (`mtp`)
with a seeded MTP layer of the kit's target: the converter takes an MTP layer only for
architectures that declare one, so the method serves the target itself as GLM-4.5
(Glm4MoeForCausalLM, properties/export/glm_mtp.py: a dense trunk computing the Qwen3 target
exactly, the layer as model.layers.N) with the layer inside its GGUF, and the kit replays
llama.cpp's MTP convention (MTP_HIDDEN below). draft-dspark needs a DeepSeek-V4 target
(CONFORMANCE.md, "llama.cpp's other speculative paths").
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from properties.adapters.dialects import Dialect
from properties.adapters.protocol import BadResponse, Completion, Request
from properties.methods import (BOTH_PAIRS, EARLY_EXIT, LOOKUP, PERFECT, RANDOM, SMALL, HeadDraft,
                                StatefulLookup)
from properties.engines import Command, Engine, EngineMissing, Method
from properties.models import tokenizer
from properties.engines.local import engines_dir, output
from reference.hidden import HiddenStates
from reference.penalties import Formula

K = 4

# The n-gram drafters beside ngram-simple, read from the vendored source (paths under
# .engines/llamacpp/src, llama-cpp-python 0.3.36). None of them proposes exactly "what followed
# the latest earlier occurrence of the last n tokens" (a `Lookup`, which the kit replays): each
# keeps state beside the request's context, so each is a StatefulLookup and the engine's own
# per-response draft counts (timings.draft_n) show where it drafted. Their sizes are the
# smallest lookup, so that the kit's covering prompt (every token once, methods.COVER) makes
# them propose, and k drafted tokens.
#
# ngram-map-k (common/speculative.cpp:1795 common_speculative_impl_ngram_map_k, key_only;
# common/ngram-map.cpp:221 common_ngram_map_draft): the key is the last size-n tokens; it
# drafts only when the context holds 2n + m tokens (ngram-map.cpp:232), and finds the key first
# through a hash map that keeps the first position recorded for a hash and never overwrites it
# (ngram-map.cpp:263, 326, 335), so the occurrence copied is not necessarily the latest; it
# copies the size-m tokens after it, cut to the number accepted the last time this key drafted
# (ngram-map.cpp:386; set by common_ngram_map_accept, ngram-map.cpp:535): after a wholly
# rejected draft that key drafts nothing again. The map (keys, hashes, counts) is one per
# server slot (speculative.cpp:1806) and outlives requests: begin() only trims it
# (ngram-map.cpp:121).
MAP_K = StatefulLookup(
    "the m tokens after an earlier occurrence of the last n tokens (the first its hash map "
    "recorded), cut to the count accepted when that key last drafted (ngram-map-k)",
    "a key map per server slot, kept across requests")
# ngram-map-k4v (the same class, key_only false): as ngram-map-k, and it drafts only when the
# key has matched at least min-hits times (ngram-map.cpp:401) and the most frequent of up to 4
# m-token continuations seen after the key is at least twice as frequent as the others
# together (ngram-map.cpp:495); it copies the continuation at the matched occurrence, cut to
# that value's last accepted count (ngram-map.cpp:503).
MAP_K4V = StatefulLookup(
    "the m tokens after an earlier occurrence of the last n tokens, when one continuation of "
    "that key dominates its counts; cut to the count accepted last time (ngram-map-k4v)",
    "a key map with continuation counts per server slot, kept across requests")
# ngram-mod (speculative.cpp:1849 common_speculative_impl_ngram_mod; common/ngram-mod.cpp): a
# pool of 4M entries (speculative.cpp:1876) maps the hash of n-match tokens to the one token
# last seen after them (ngram-mod.cpp:27, an add overwrites); it drafts a chain, each token
# looked up from the n-match tokens before it, up to n-max, none if fewer than n-min
# (speculative.cpp:1955-1962). The pool is one for all slots and requests: every request's
# prompt is added at begin(), generated tokens only in chunks of 32 (speculative.cpp:1940), and
# the whole pool is reset after 5 rounds in a row with under a quarter accepted
# (speculative.cpp:2006-2008) or past a quarter's occupancy (speculative.cpp:1915). The engine
# warns that n-match < 16 gives poor drafts (speculative.cpp:1886); here 1, so that the kit's
# short contexts match.
MOD = StatefulLookup(
    "a chain of next tokens, each the token last seen after the n-match tokens before it "
    "(ngram-mod)",
    "one hash pool shared by every slot and request, reset on low acceptance")
# ngram-cache (speculative.cpp:2024 common_speculative_impl_ngram_cache; common/ngram-cache.cpp
# :146 common_ngram_cache_draft): n-gram statistics (1 to 4 tokens, ngram-cache.h:9-10) of the
# context; each drafted token is the most frequent follower of the longest n-gram whose counts
# pass a threshold (a 1-gram needs 2 occurrences and 66 %, a 2-gram 2 and 50 %, 3- and 4-grams 1
# and 50 %: ngram-cache.cpp:60-61), up to 8 tokens (n_draft = 8, no option: speculative.cpp
# :2191). Optional static and dynamic caches come from files (-lcs, -lcd); none here. The
# context cache is one per slot and never reset between requests (begin() is a no-op,
# speculative.cpp:2091); it learns only the tokens past the longest context the slot has seen
# (speculative.cpp:2103), and from them only the n-grams inside the new tokens themselves
# (speculative.cpp:2109-2115): a token generated one at a time adds nothing. The kit's cover
# therefore holds every token twice (repeats=2: a 1-gram needs 2 occurrences).
CACHE = StatefulLookup(
    "up to 8 tokens, each the most frequent follower of the longest 1-4 token n-gram whose "
    "counts pass the engine's thresholds (ngram-cache)",
    "n-gram counts per server slot, kept across requests", repeats=2)

# --spec-synth-rates (common/arg.cpp:4170, "benchmarking only"): the server accepts draft
# position i with probability rate_i / rate_(i-1), "at random instead of by match with the
# target" (tools/server/server-context.cpp:55-75, server_sample_and_accept_synth), and warns at
# start "synthetic speculative acceptance is enabled for benchmarking; generated output is not
# valid" (common/speculative.cpp:2732). Rates as the vLLM method's, one per draft position.
SYNTHETIC_RATES = (0.9, 0.8, 0.7, 0.6)
SYNTHETIC_WORDS = ("llama.cpp's --spec-synth-rates is \"benchmarking only\" (llama-server "
                   "--help): it accepts draft tokens \"at random instead of by match with the "
                   "target\" and warns \"synthetic speculative acceptance is enabled for "
                   "benchmarking; generated output is not valid\"")

# The hidden states llama.cpp feeds an EAGLE-3 head (common/speculative.cpp, the eagle3
# drafter's begin and process): for each of the head's three `target_layers` ids l below the
# target's depth N, the input of target layer l (llama_set_embeddings_layer_inp; the Qwen3
# graph records inpL, the residual stream entering the layer: src/models/qwen3.cpp:72), and for
# l = N the state before the final norm (llama_set_embeddings_nextn). That is reference.hidden's
# where="input" for l = 0 .. N, vLLM's convention too. Each round pairs g_j = fc(the target's
# features at j) with token j + 1 and chains the draft layer's pre-norm output (speculative.cpp:
# "at memory pos P the input pair is (token[P+1], g_embd[P])"), as reference/heads/eagle3.py
# does; the proposal is the draft sampler's top candidate, k of them with --spec-draft-p-min 0.
# Measured 2026-12-07 on the served target (N = 2): with ids (0, 1, 1) the engine's counts over
# the launcher's 4 greedy requests equal the kit's float64 replay (271 drafted / 52 accepted);
# with (0, 1, 2) they do not (444 / 3, another run 394 / 17): the Qwen3 graph never sets the
# pre-norm state that id N reads (res->t_h_nextn is set only by MTP-capable graphs), so the
# head drafts from a buffer nothing writes (tests/findings/llamacpp_eagle3_last_layer/).
EAGLE3_HIDDEN = HiddenStates((0, 1, 1), "input")
EAGLE3_LAST_HIDDEN = HiddenStates((0, 1, 2), "input")
# the trained pairs' heads (make models-heads, models-large-head) read the inputs of layers 1, 3, 5
# of the 6-layer target and 1, 4, 7 of the 8-layer one; trained as Qwen3 layers, they are served
# as Llama layers (properties/export/heads.py llama_layer: the same weights without the q/k
# norm, replayed as such)
EAGLE3_TRAINED_HIDDEN = HiddenStates((1, 3, 5), "input")
EAGLE3_TRAINED_LARGE_HIDDEN = HiddenStates((1, 4, 7), "input")
# draft-mtp (common/speculative.cpp:1331 common_speculative_impl_draft_mtp): the MTP layer lives
# in the served model itself (no -md: the draft context is created against the target model,
# speculative.cpp:2557), so the method serves the kit's target with its MTP layer exported as
# GLM-4.5 (properties/export/glm_mtp.py, the head's export folder). What it feeds the layer:
# every target decode (prefill and verify) is decoded by the MTP context too, token k paired
# with the target's h_nextn row k - 1 (speculative.cpp:1517-1528), which the GLM-4.5 graph sets
# to the final norm's output (src/models/glm4-moe.cpp: build_norm(..., output_norm), cb
# "h_nextn"): the NORMED last hidden state. The first token of each decode is paired with
# pending_h, the last kept row of the previous one (zero in a fresh slot), so t_0 gets a zero
# state at position 0 and pair (h_j, t_{j+1}) sits at position j + 1: the reference layer's
# lead=True. [enorm(e), hnorm(h)] is concatenated embedding first (glm4-moe.cpp graph_mtp,
# ggml_concat(e_norm, h_norm)); a round chains the layer's h_nextn, set after the head norm
# (recycle="normed"), and the proposal is the draft sampler's top candidate (top-k 10,
# speculative.cpp:1388). Measured 2026-12-07 on a fresh one-slot server per request: greedy ==
# target and the engine's drafted/accepted equal this replay in 6 of 6 requests, and the
# replay without the lead pair differs in all 6.
MTP_HIDDEN = HiddenStates((1,), "output", normed=True)
MTP_CONVENTION = (("order", "embedding-first"), ("recycle", "normed"), ("lead", True))
# the trained pair's MTP layer (make models-heads, reference/train_mtp.py), trained in this
# convention on the 6-layer target's normed last state; served as that target in GLM-4.5
# (glm_mtp.LAYOUTS "target-glm4moe-mtp-trained": its 6 dense layers, the layer as layer 6).
# Measured 2026-12-07 20:11 and 20:22 (runs/llamacpp-mtp-trained-trained-20261207-201128,
# -202217): greedy == target and the engine's counts equal this convention's replay in 4 of 4
# requests, 263 drafted / 118 accepted (vLLM's reading of the same weights: 2 of 4 differ);
# each judged request on a fresh slot, so the stale lead state (tests/findings/
# llamacpp_mtp_lead_state/) does not reach them
MTP_TRAINED_HIDDEN = HiddenStates((5,), "output", normed=True)
# The hidden states llama.cpp feeds a DFlash drafter (draft-dflash): the outputs of the target
# layers dflash_config.target_layer_ids names (the converter writes id + 1 as the layer whose
# input is read, conversion/qwen.py:735-738; common/speculative.cpp:1056-1059), fused by the
# head's fc and hidden_norm into the draft's KV cache; the block [newest, k masks] is decoded
# non-causally and the masks' argmaxes are the k proposals (reference/heads/dflash.py has the
# whole convention with file:line). Layer 0 only: the output of the served target's last layer
# (id 1) has no recorded layer input in the Qwen3 graph (src/models/qwen3.cpp:72 covers il < N).
# Measured 2026-12-07 (runs/llamacpp-dflash-20261207-170012, -170258): the engine's counts over
# the launcher's 4 greedy requests equal the kit's float64 replay, 274 drafted / 50 accepted.
DFLASH_HIDDEN = HiddenStates((0,), "output")
# the trained pair's DFlash drafter (make models-heads, reference/train_dflash.py): the outputs
# of its 6-layer target's layers 0, 2, 4 (the converter writes 1, 3, 5, layer inputs the Qwen3
# graph records; never 5, the last: tests/findings/llamacpp_dflash_last_layer/), its own lm_head
DFLASH_TRAINED_HIDDEN = HiddenStates((0, 2, 4), "output")

METHODS = {m.name: m for m in (
    Method("draft-early-exit", "draft model (draft-simple): the target's first layers (an early exit)",
           EARLY_EXIT, K, pairs=BOTH_PAIRS),
    Method("draft-random", "draft model (draft-simple): an independent random model",
           RANDOM, K),
    Method("perfect-draft", "draft model (draft-simple): the target itself", PERFECT, K),
    Method("ngram", "n-gram drafting from the context (ngram-simple)", LOOKUP, K),
    Method("draft-small", "draft model (draft-simple): the trained pair's small draft "
                          "(--models trained or trained-large)", SMALL, K, pairs=BOTH_PAIRS),
    Method("ngram-map-k", "n-gram drafting from a key map (ngram-map-k, one-token key)",
           MAP_K, K),
    Method("ngram-map-k4v", "n-gram drafting from a key map with continuation counts "
                            "(ngram-map-k4v, one-token key)", MAP_K4V, K),
    Method("ngram-mod", "n-gram drafting from a hash pool shared by all requests (ngram-mod, "
                        "one-token match)", MOD, K),
    Method("ngram-cache", "n-gram drafting from context statistics (ngram-cache, up to 8 "
                          "tokens)", CACHE, 8),
    Method("draft-early-exit-synthetic",
           f"draft model (draft-simple): the early exit, synthetic acceptance "
           f"(--spec-synth-rates {','.join(map(str, SYNTHETIC_RATES))}): lossy by design",
           EARLY_EXIT, K, lossy=SYNTHETIC_WORDS),
    Method("eagle3", "EAGLE-3 head (draft-eagle3; seeded random init, a Llama layer) reading "
                     "the inputs of target layers 0, 1, 1",
           HeadDraft("eagle3", "head-eagle3-llama", EAGLE3_HIDDEN, qk_norm=False, replays=True), K),
    # the same head with the draft's top-k sampled on the CPU (--no-spec-draft-backend-sampling):
    # the default attaches it to the draft graph as a backend sampler, and requests starting
    # together abort the server (tests/findings/llamacpp_eagle3_sampled_abort/), which hides
    # every sampled law; this method is the engine's own workaround, so those laws are judged
    Method("eagle3-cpu-draft-sampling", "EAGLE-3 head as `eagle3`, the draft's sampler on the "
                                        "CPU (--no-spec-draft-backend-sampling)",
           HeadDraft("eagle3", "head-eagle3-llama", EAGLE3_HIDDEN, qk_norm=False, replays=True),
           K),
    Method("eagle3-last-layer", "EAGLE-3 head (draft-eagle3; seeded random init, a Llama layer) "
                                "reading the inputs of target layers 0, 1 and the pre-final-norm "
                                "state (aux id 2, the target's depth)",
           HeadDraft("eagle3", "head-eagle3-llama-last", EAGLE3_LAST_HIDDEN, qk_norm=False,
                     replays=True), K),
    Method("mtp", "MTP (draft-mtp): the served target with one MTP layer (seeded random init, "
                  "eh_proj fitted), exported as GLM-4.5 (Glm4MoeForCausalLM) with the layer "
                  "inside the target's GGUF; reads the normed last hidden state",
           HeadDraft("mtp", "target-glm4moe-mtp", MTP_HIDDEN, replays=True,
                     options=MTP_CONVENTION), K),
    Method("eagle3-trained", "EAGLE-3: the trained pair's head in a Llama layer (--models "
                             "trained)",
           HeadDraft("eagle3", "head-eagle3-llama-trained", EAGLE3_TRAINED_HIDDEN,
                     trained_only=True, qk_norm=False), K, pairs=("trained",)),
    Method("mtp-trained", "MTP (draft-mtp): the trained pair's target with its trained MTP "
                          "layer (--models trained), exported as GLM-4.5 with the layer inside "
                          "the target's GGUF",
           HeadDraft("mtp", "target-glm4moe-mtp-trained", MTP_TRAINED_HIDDEN, trained_only=True,
                     options=MTP_CONVENTION), K, pairs=("trained",)),
    # Measured 2026-12-07 20:34 (runs/llamacpp-dflash-trained-trained-20261207-203414):
    # CONFORMANT, greedy == target, 392 drafted / 83 accepted = the exact replay request by
    # request (101/20, 94/22, 96/21, 101/20), 1.76 tokens per target call, speed-up 0.34x
    Method("dflash-trained", "DFlash block drafter (draft-dflash): the trained pair's drafter "
                             "(--models trained), reading the outputs of target layers 0, 2, 4",
           HeadDraft("dflash", "head-dflash-trained", DFLASH_TRAINED_HIDDEN, trained_only=True),
           K, pairs=("trained",)),
    Method("eagle3-trained-large", "EAGLE-3: the weight-bound pair's trained head in a Llama "
                                   "layer (--models trained-large)",
           HeadDraft("eagle3", "head-eagle3-llama-trained-large", EAGLE3_TRAINED_LARGE_HIDDEN,
                     trained_only=True, qk_norm=False), K, pairs=("trained-large",)),
    Method("dflash", "DFlash block drafter (draft-dflash; seeded random init, its own fitted "
                     "lm_head, a block of the newest token and 4 masks) reading the output of "
                     "target layer 0",
           HeadDraft("dflash", "head-dflash", DFLASH_HIDDEN, replays=True), K),
    # DSpark (draft-dspark): the DFlash drafter's layers plus a Markov head, over an
    # anchor-first block of k tokens whose every row is read (reference/heads/dspark.py).
    # Measured 2026-12-07 (runs/llamacpp-dspark-20261207-180132, -180610): the engine's counts
    # over the launcher's 4 greedy requests equal the kit's float64 replay, 293 drafted / 44
    # accepted
    Method("dspark", "DSpark block drafter (draft-dspark; seeded random init, the target's "
                     "lm_head, its Markov head fitted, an anchor-first block of the newest "
                     "token and 3 masks) reading the output of target layer 0",
           HeadDraft("dspark", "head-dspark", DFLASH_HIDDEN, replays=True), K),
)}
# the --spec-* options of each method that drafts from the context (a draft model's are built
# in spec_options)
CONTEXT_OPTIONS = {
    # ngram-simple's defaults (a 12-token lookup, a 48-token draft) never match in the kit's
    # short contexts, so it would draft nothing: look up one token, draft k
    "ngram": ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
              "--spec-ngram-simple-size-m", str(K), "--spec-draft-n-max", str(K)),
    "ngram-map-k": ("--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "1",
                    "--spec-ngram-map-k-size-m", str(K), "--spec-ngram-map-k-min-hits", "1"),
    "ngram-map-k4v": ("--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "1",
                      "--spec-ngram-map-k4v-size-m", str(K),
                      "--spec-ngram-map-k4v-min-hits", "1"),
    "ngram-mod": ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1",
                  "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(K)),
    # nothing to size: n-gram lengths 1-4 and 8 drafted tokens are fixed in the source
    "ngram-cache": ("--spec-type", "ngram-cache"),
}
# the methods whose draft sampler runs on the CPU, not in the draft's graph (see METHODS)
CPU_DRAFT_SAMPLING = ("eagle3-cpu-draft-sampling",)
# server slots: requests answered concurrently, as llama-server's default (auto) gives on a
# small machine; the served_batch family compares answers inside a batch with answers alone
SLOTS = 4


@dataclass(frozen=True)
class Environment:
    server: Path
    source: Path


# as a user types it where llama.cpp is built (the recipes)
RECIPE = Environment(Path("llama-server"), Path("LLAMA_CPP_SOURCE"))


@dataclass(frozen=True)
class LlamaCpp(Dialect):
    """llama-server's own /completion (at the server's root): token-id prompt, tokens back,
    one completion per request, stops as strings (one character per kit token), and the
    engine's draft statistics in each response (timings.draft_n, timings.draft_n_accepted).

    llama.cpp gives a BPE vocabulary without an end-of-sequence token the default id 11,
    which is one of the kit's ordinary tokens; `ignore_eos` would forbid it outright. So the
    request leaves it on, and a completion that stopped there (stop_type "eos") is continued
    by a new request whose prompt is the prompt and the tokens so far: by the chain rule the
    continuation is drawn from the right conditional law, and a greedy one is the same argmax
    sequence. Seeds of continuations derive from the request's."""

    name: str = "llama.cpp"
    path: str = "/completion"
    at_root: bool = True
    per_response: bool = True
    # draft-simple proposes the draft's top candidate (common/speculative.cpp), and the target
    # keeps it while its own sample agrees (common_sampler_sample_and_accept_n): P(accept) = p(x)
    draft_proposals: str = "greedy"
    # common_sampler_sample_and_accept_n (common/sampling.cpp:694) stops at an end-of-generation
    # id: "do not accept draft tokens after an EOG ... a trailing EOG is still accepted"; the
    # kit's continued requests stop at id 11 (EOS_ID), so their rounds are replayed so
    eos_stops_acceptance: bool = True

    def body(self, req: Request, model) -> dict:
        body = {"prompt": list(req.prompt), "n_predict": req.max_tokens,
                "temperature": req.sampling.temperature, "top_k": req.sampling.top_k,
                "top_p": req.sampling.top_p, "stream": False}
        body.update(self.neutral)
        if req.sampling.stop_ids:
            body["stop"] = [tokenizer.decode([t]) for t in req.sampling.stop_ids]
        if req.sampling.seed is not None:
            body["seed"] = req.sampling.seed
        body.update(self.shaping(req.sampling))
        if req.sampling.stop_strings:   # beside the stop ids' one-character strings
            body["stop"] = body.get("stop", []) + list(req.sampling.stop_strings)
        return body

    def shaping(self, s) -> dict:
        """Penalties, min_p, logit_bias and n_probs in llama-server's names
        (tools/server/server-schema.cpp). The penalties and min_p are samplers of the chain,
        which the kit names: penalties first, min_p right after temperature, as vLLM orders
        them (FORMULA below); the window is the whole history."""
        body = {}
        if s.penalized:
            body.update(repeat_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
                        frequency_penalty=s.frequency_penalty, repeat_last_n=PENALTY_WINDOW)
        if s.min_p:
            body["min_p"] = s.min_p
        if s.penalized or s.min_p:
            body["samplers"] = ["penalties", "temperature", "min_p", "top_k", "top_p"]
        if s.logit_bias:
            body["logit_bias"] = [[t, b] for t, b in s.logit_bias]
        if s.logprobs is not None:
            # n_probs 0 returns no probabilities at all: ask for one at least
            body["n_probs"] = max(s.logprobs, 1)
        return body

    def complete(self, client, req: Request) -> list[Completion]:
        """One completion, continued past llama.cpp's end-of-sequence id (see above). The
        continuation is sound only if a piece that stopped at end of sequence ends with that
        id and holds it nowhere else: an engine that emitted tokens after an end of sequence
        (say, the rest of an accepted block) is reported, never stitched over."""
        tokens, drafted, accepted, part, pieces = (), 0, 0, req, ()
        probs, text = (), ""
        while True:
            (got,) = self.read(client.post(self.body(part, client.model)), part, client.where())
            eos_problem = end_of_sequence_problem(got)
            if eos_problem:
                raise BadResponse(f"{client.where()}: {eos_problem} (request "
                                  f"{self.body(part, client.model)})")
            tokens += got.tokens
            pieces += (len(got.tokens),)
            probs += got.logprobs or ()
            text += got.text or ""
            drafted += got.drafted or 0
            accepted += got.accepted or 0
            stopped_by_request = bool(tokens) and tokens[-1] in req.sampling.stop_ids
            if (got.finish_reason != "eos" or len(tokens) >= req.max_tokens
                    or stopped_by_request or not got.tokens):
                reason = got.finish_reason
                if reason == "eos":   # id 11 is no stop of the kit's: only the length ended it
                    reason = "stop" if stopped_by_request else "length"
                return [Completion(tokens, reason, drafted, accepted,
                                   pieces if len(pieces) > 1 else (),
                                   probs if req.sampling.logprobs is not None else None, text)]
            seed = (None if req.sampling.seed is None
                    else (req.sampling.seed * 1_000_003 + len(tokens)) % 2**31)
            part = replace(req, prompt=tuple(req.prompt) + tokens,
                           max_tokens=req.max_tokens - len(tokens),
                           sampling=replace(req.sampling, seed=seed))

    def choices(self, answer, where: str) -> list:
        if not isinstance(answer, dict) or "content" not in answer:
            raise BadResponse(f"{where}: no content in {str(answer)[:300]}")
        return [answer]

    def read_choice(self, choice: dict, req: Request, where: str) -> Completion:
        ids = choice.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                for t in ids):
            raise BadResponse(f"{where}: no token list in {str(choice)[:300]} (return_tokens)")
        tokens = tuple(ids)
        stop_type = choice.get("stop_type")
        word = choice.get("stopping_word") or ""
        if stop_type == "word" and word:
            stop = tokenizer.encode(word)
            # the stop word's token is kept at the end of `tokens` or not, depending on the
            # version; the kit's convention keeps it
            if len(stop) == 1 and not (tokens and tokens[-1] == stop[0]):
                tokens = tokens + tuple(stop)
        reason = {"word": "stop", "limit": "length"}.get(stop_type, stop_type)
        timings = choice.get("timings") or {}
        drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        if drafted is None and isinstance(timings, dict) and "predicted_n" in timings:
            drafted, accepted = 0, 0    # llama-server omits them when nothing was drafted
        text = choice.get("content") if isinstance(choice.get("content"), str) else None
        return Completion(tokens, reason, drafted, accepted,
                          logprobs=llamacpp_logprobs(choice.get("completion_probabilities"),
                                                     where), text=text)


def llamacpp_logprobs(entries, where: str) -> tuple | None:
    """`completion_probabilities` (n_probs > 0, post_sampling_probs off: tools/server/
    server-task.cpp probs_vector_to_json): per token {id, logprob, top_logprobs: [{id,
    logprob}]} as Completion.logprobs; None when absent."""
    if not isinstance(entries, list):
        return None
    out = []
    for e in entries:
        if not isinstance(e, dict) or "logprob" not in e:
            raise BadResponse(f"{where}: a completion_probabilities entry without logprob: "
                              f"{str(e)[:200]} (post_sampling_probs must be off)")
        tops = tuple((int(t["id"]), float(t["logprob"])) for t in e.get("top_logprobs") or ())
        out.append((float(e["logprob"]), tops))
    return tuple(out)


# Its sampling formula, from its vendored source (src/):
#   * order: common/sampling.cpp common_sampler_init: the logit-bias sampler first, then the
#     chain in the request's `samplers` order, then dist. The kit names the chain: penalties,
#     temperature, min_p, top_k, top_p (properties/engines/llamacpp.py).
#   * penalties: src/llama-sampler.cpp llama_sampler_penalties_apply: logit <= 0 multiplied,
#     else divided by repeat_penalty; then count * frequency_penalty + (count > 0) *
#     presence_penalty subtracted, count over the last repeat_last_n tokens the sampler accepted:
#     the prompt (tools/server/server-context.cpp, the slot's sampler init accepts every prompt
#     token) and the output. The kit sends repeat_last_n = PENALTY_WINDOW, more than any kit
#     context, so the whole history counts.
#   * min_p: llama_sampler_min_p_apply: logit >= max logit + log(min_p) kept (p >= min_p * p_max).
#   * logprobs: n_probs; tools/server/server-context.cpp populate_token_probs with
#     post_sampling_probs false (the default): softmax of the raw logits
#     (get_token_probabilities), before the chain.
#   * stop strings: `stop`; the text is cut at the stop word (stop_type "word").
# repeat_last_n the kit sends with a penalty (its context is 2048): the whole history
PENALTY_WINDOW = 2048
FORMULA = Formula("llama.cpp", repetition_sees="prompt+output", counts_see="prompt+output",
                  window=PENALTY_WINDOW)

DIALECT = LlamaCpp(
    formula=FORMULA,
    # llama-server's defaults are top_k 40, top_p 0.95, min_p 0.05, temperature 0.8 and a
    # sampler chain that applies temperature last; the kit names every setting and puts the
    # chain in the conventional order (temperature, then top-k, then top-p).
    neutral={"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 0,
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
             "xtc_probability": 0.0, "top_n_sigma": -1.0, "mirostat": 0,
             "dynatemp_range": 0.0, "ignore_eos": False, "cache_prompt": False,
             "return_tokens": True, "n_probs": 0,
             "samplers": ["temperature", "top_k", "top_p"]},
    stop_in_ids=None, stop_in_text=False, honours_n=False,
    notes=("stops are strings (one character per kit token); the stop word is cut from the text",
           "draft statistics per response: timings.draft_n, timings.draft_n_accepted",
           "a BPE vocabulary without an end-of-sequence token gets llama.cpp's default, id 11, "
           "and ignore_eos would forbid that token (a -inf bias): the kit leaves ignore_eos "
           "off and continues a completion that stopped at id 11 by a new request from the "
           "prefix (the chain rule keeps the law and the greedy output exact)"))


# llama.cpp's end-of-sequence id for a BPE vocabulary that names none (see LlamaCpp)
EOS_ID = 11


def end_of_sequence_problem(piece: Completion) -> str | None:
    """What is wrong with one piece's end of sequence, if anything: llama-server with
    ignore_eos off must stop right after emitting EOS_ID, and say so (stop_type "eos")."""
    tokens = list(piece.tokens)
    if EOS_ID in tokens[:-1]:
        i = tokens.index(EOS_ID)
        return (f"the engine went on past its end-of-sequence id {EOS_ID} at position {i}: "
                f"{tokens[i + 1:][:8]} follow it (tokens {tokens})")
    if piece.finish_reason == "eos" and (not tokens or tokens[-1] != EOS_ID):
        return (f"the answer says it stopped at end of sequence (stop_type 'eos') but its last "
                f"token is {tokens[-1] if tokens else 'none'}, not the end-of-sequence id "
                f"{EOS_ID} (tokens {tokens})")
    return None


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


# the head methods' drafters, and the export folders of the served ones (the recipes convert
# those; properties/export/heads.py writes them)
HEAD_DRAFTS = [m.drafter for m in METHODS.values() if isinstance(m.drafter, HeadDraft)]
HEADS = tuple(sorted({d.head for d in HEAD_DRAFTS if not d.trained_only}))
# the heads exported as whole models (an MTP layer inside its target): converted alone, and
# served as the model itself (-m) instead of beside the target (-md)
WHOLE_MODELS = tuple(sorted({d.head for d in HEAD_DRAFTS if d.kind == "mtp"}))


def prepare_commands(env: Environment | None, export_dir,
                     drafts=("draft-early-exit", "draft-random"), heads=HEADS) -> list:
    """(what, Command) converting the target, the drafts and the heads to GGUF (float32),
    beside the export, with the vendored convert_hf_to_gguf.py (driven by gguf_convert.py); a
    head's conversion reads the target's folder for the tokenizer and the target's depth
    (--target-model-dir)."""
    python = sys.executable if env is not None else "python"
    env = env or RECIPE
    root = Path(export_dir)
    gguf = root / "gguf"
    driver = Path(__file__).with_name("gguf_convert.py")
    models = [(f"convert {name} to GGUF (float32, the vendored convert_hf_to_gguf.py)",
               Command([python, driver, env.source, root / name, gguf / f"{name}.gguf"]))
              for name in ("target",) + tuple(drafts)]
    return models + [(f"convert the head {name} to GGUF (float32, its target beside it)",
                      Command([python, driver, env.source, root / name, gguf / f"{name}.gguf"]
                              + ([] if name in WHOLE_MODELS else [root / "target"])))
                     for name in heads]


def prepare(env: Environment, export_dir, log) -> None:
    """GGUF (float32) files of the target, the drafts and the heads, beside the export."""
    (Path(export_dir) / "gguf").mkdir(exist_ok=True)
    # the drafts and heads the export holds (the trained pair's run exports only the draft it
    # uses; the launcher exports a head method's head alone)
    drafts = tuple(d for d in ("draft-early-exit", "draft-random", "draft-small")
                   if (Path(export_dir) / d / "config.json").exists())
    heads = tuple(sorted({d.head for d in HEAD_DRAFTS
                          if (Path(export_dir) / d.head / "config.json").exists()}))
    for what, step in prepare_commands(env, export_dir, drafts, heads):
        if Path(step.argv[4]).exists():     # [python, driver, source, model, outfile, ...]
            continue
        done = subprocess.run([str(a) for a in step.argv], capture_output=True, text=True)
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed (log {log}):\n{done.stderr[-2000:]}")


def command(env: Environment | None, export_dir, method: Method | None, port: int) -> Command:
    gguf = Path(export_dir) / "gguf"
    argv = [(env or RECIPE).server, "-m", gguf / f"{served_model(method)}.gguf",
            "--host", "127.0.0.1",
            "--port", str(port), "-c", "2048", "-np", str(SLOTS), "-t", "1", "--no-webui",
            # the KV cache in float32, as the exported weights: its default f16 cache (and the
            # flash-attention path that comes with it) moves logprobs by up to 1.5e-3, past
            # the kit's float32 tolerances (measured 2026-12-03; f32 brings it to 1e-5)
            "-fa", "off", "-ctk", "f32", "-ctv", "f32"]
    # no server-wide --seed: a request without a seed must draw a fresh one (as by default),
    # or concurrent unseeded requests would share one stream of random numbers
    return Command(argv + spec_options(method, gguf), health="/health")


def served_model(method: Method | None) -> str:
    """The export folder (and GGUF name) the server of `method` loads as its model: the
    target, or for an MTP method the target with its MTP layer (WHOLE_MODELS)."""
    if method is not None and getattr(method.drafter, "kind", None) == "mtp":
        return method.drafter.head
    return "target"


# the --spec-type of each head kind llama.cpp computes (a draft model's is draft-simple)
HEAD_SPEC_TYPES = {"eagle3": "draft-eagle3", "mtp": "draft-mtp", "dflash": "draft-dflash",
                   "dspark": "draft-dspark"}


def spec_options(method: Method | None, gguf) -> list:
    """The options that make `method` speculate (none for the baseline): a context drafter's
    from CONTEXT_OPTIONS (another lookup method: ngram-simple sized as `ngram`, with its k);
    a draft model's -md and draft-simple (a head's: draft-eagle3), every round k tokens
    (--spec-draft-p-min 0 keeps a head drafting however unsure, too); a mode the engine names lossy
    is its synthetic acceptance (--spec-synth-rates, one rate per draft position)."""
    if method is None:
        return []
    if method.name in CONTEXT_OPTIONS:
        return list(CONTEXT_OPTIONS[method.name])
    if method.drafter.lookup:
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
                "--spec-ngram-simple-size-m", str(method.k), "--spec-draft-n-max", str(method.k)]
    head = isinstance(method.drafter, HeadDraft)
    kind = HEAD_SPEC_TYPES[method.drafter.kind] if head else "draft-simple"
    # an MTP layer is inside -m's model (served_model): no -md
    draft = ([] if head and method.drafter.kind == "mtp"
             else ["-md", Path(gguf) / f"{method.drafter.export}.gguf"])
    # the draft's KV cache in float32 as the target's (command): its default is float16 apart
    # from the target's, and with it the target drafting for itself rejected a proposal whose
    # float64 top-two gap is 4.7e-4 (prompt [2, 2, 2], max_tokens 6: 3 of 4 accepted; 4 of 4
    # with -ctkd/-ctvd f32, 2026-12-07)
    argv = draft + ["--spec-type", kind,
                    "--spec-draft-n-max", str(method.k), "--spec-draft-n-min", "0",
                    "--spec-draft-p-min", "0", "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]
    if method.name in CPU_DRAFT_SAMPLING:
        argv.append("--no-spec-draft-backend-sampling")
    if method.lossy is not None:
        if len(SYNTHETIC_RATES) != method.k:
            raise ValueError(f"method {method.name}: --spec-synth-rates takes one rate per draft "
                             f"position ({method.k}), SYNTHETIC_RATES has {len(SYNTHETIC_RATES)}")
        argv += ["--spec-synth-rates", ",".join(map(str, SYNTHETIC_RATES))]
    return argv


ENGINE = Engine(
    name="llamacpp", title="llama.cpp llama-server (from llama-cpp-python's vendored source)",
    setup="make engine-llamacpp", validated=("llama-cpp-python 0.3.36",), methods=METHODS,
    dialect=DIALECT, find=find, version=version, command=command, prepare=prepare,
    prepare_commands=prepare_commands,
    start_timeout=120.0, schedule="capped")

