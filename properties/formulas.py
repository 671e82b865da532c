"""Each engine's formula for penalties, min_p and logit_bias (reference.penalties.Formula),
read from the engine's own source, and what it refuses or ignores under speculation.

vLLM 0.32.0 (site-packages/vllm/):
  * order: v1/sample/sampler.py, class Sampler (docstring and apply_logits_processors): the
    logit-bias processor (non-argmax-invariant) runs before apply_penalties; sample() applies
    temperature, then the argmax-invariant processors (min_p), then top-k and top-p.
  * penalties: model_executor/layers/utils.py apply_penalties: the repetition penalty on
    tokens in prompt or output (_custom_ops.apply_repetition_penalties_torch: logit > 0
    divided, else multiplied); frequency times the output's counts and presence times its
    mask subtracted ("we follow the definition in OpenAI API"): output tokens only.
  * min_p: v1/sample/logits_processor/builtin.py MinPLogitsProcessor.apply: on the tempered
    softmax, p < min_p * p_max set to -inf.
  * under speculation: sampling_params.py SamplingParams._validate_spec_decode refuses
    min_p > 0 and any logit_bias ("not yet supported with speculative decoding", a 400);
    v1/sample/logits_processor/__init__.py build_logitsprocs loads neither processor when a
    speculative config is set. Penalties are applied at every draft position with the draft
    prefix as history (v1/sample/rejection_sampler.py RejectionSampler.apply_logits_processors,
    _combine_outputs_with_spec_tokens).
  * logprobs: v1/sample/sampler.py Sampler.forward, logprobs_mode "raw_logprobs" by default:
    log_softmax of the raw logits, before penalties and temperature (the rejection sampler
    returns them from raw_target_logits).
  * stop strings: v1/engine/detokenizer.py update / check_stop_strings: token_ids keep the
    tokens through the one completing the stop string; the text is cut before it
    (include_stop_str_in_output false, which the kit sends).

llama.cpp (vendored source, src/):
  * order: common/sampling.cpp common_sampler_init: the logit-bias sampler first, then the
    chain in the request's `samplers` order, then dist. The kit names the chain: penalties,
    temperature, min_p, top_k, top_p (properties/engines/llamacpp.py).
  * penalties: src/llama-sampler.cpp llama_sampler_penalties_apply: logit <= 0 multiplied,
    else divided by repeat_penalty; then count * frequency_penalty + (count > 0) *
    presence_penalty subtracted, count over the last repeat_last_n tokens the sampler accepted:
    the prompt (tools/server/server-context.cpp, the slot's sampler init accepts every prompt
    token) and the output. The kit sends repeat_last_n = PENALTY_WINDOW, more than any kit
    context, so the whole history counts.
  * min_p: llama_sampler_min_p_apply: logit >= max logit + log(min_p) kept (p >= min_p * p_max).
  * logprobs: n_probs; tools/server/server-context.cpp populate_token_probs with
    post_sampling_probs false (the default): softmax of the raw logits
    (get_token_probabilities), before the chain.
  * stop strings: `stop`; the text is cut at the stop word (stop_type "word").

transformers serve 5.24 (generation/utils.py GenerationMixin._get_logits_processor):
  SequenceBiasLogitsProcessor (sequence_bias), then RepetitionPenaltyLogitsProcessor over
  input_ids (prompt and output); for sampling TemperatureLogitsWarper, TopK, TopP, then
  MinPLogitsWarper (min_p after top-p). No presence or frequency penalty (cli/serving/
  completion.py maps frequency_penalty to repetition_penalty = 1 + f, not the OpenAI meaning,
  and lists presence_penalty, logprobs and n as unused fields, ignored with a warning): the kit
  sends none of those to it.
"""

from __future__ import annotations

from reference.penalties import OPENAI, Formula

# repeat_last_n the kit sends llama.cpp with a penalty (its context is 2048): the whole history
PENALTY_WINDOW = 2048

VLLM = Formula("vllm", repetition_sees="prompt+output", counts_see="output")
LLAMACPP = Formula("llama.cpp", repetition_sees="prompt+output", counts_see="prompt+output",
                   window=PENALTY_WINDOW)
TRANSFORMERS = Formula("transformers", repetition_sees="prompt+output", counts_see=None,
                       min_p_after_top_p=True)

# dialect name -> formula; an engine not named here is judged against its baseline server
# (an unknown OpenAI-compatible server, "openai", may be any engine: it has none)
BY_DIALECT = {"vllm": VLLM, "llama.cpp": LLAMACPP, "transformers": TRANSFORMERS,
              "fake": OPENAI}

# what an engine refuses under speculation (from its source, above): parameter -> where
REFUSED = {
    "vllm": {"min_p": "sampling_params.py SamplingParams._validate_spec_decode",
             "logit_bias": "sampling_params.py SamplingParams._validate_spec_decode"},
}
# what an engine's API cannot take at all (the kit sends nothing it would silently ignore)
UNSUPPORTED = {
    "transformers": {"presence_penalty": "no such processor in transformers",
                     "frequency_penalty": "served as repetition_penalty = 1 + f, not the "
                                          "OpenAI penalty",
                     "logprobs": "an unused field of /v1/completions (ignored)"},
}


def for_dialect(name: str) -> Formula | None:
    """The formula of the engine behind a dialect, or None where the kit knows none."""
    return BY_DIALECT.get(name)


def unsupported(name: str, params) -> str | None:
    """Why the engine behind dialect `name` cannot be asked for `params`, or None."""
    missing = UNSUPPORTED.get(name, {})
    asked = {"presence_penalty": params.presence_penalty != 0,
             "frequency_penalty": params.frequency_penalty != 0,
             "logprobs": params.logprobs is not None}
    for param, why in missing.items():
        if asked.get(param):
            return f"{name} takes no {param}: {why}"
    return None
