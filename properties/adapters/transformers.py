"""The kit's adapter for Hugging Face transformers: assisted generation and prompt lookup.

`--impl=transformers` checks `generate(assistant_model=...)`; `--impl=transformers-lookup`
checks `generate(prompt_lookup_num_tokens=...)`. The kit's float64 Qwen3 models are written as
HF checkpoints (`reference.checkpoint`) and loaded with `Qwen3ForCausalLM`, in float32 as users
run them; so greedy divergences at float32 near-ties are expected and reported as ties (see
`KIT_LOGIT_TOLERANCE`). transformers draws its randomness from torch's global generator: each
call seeds it from the kit's generator inside `torch.random.fork_rng`, so a run replays.

Stats: transformers returns none, but its loop reports every round to the candidate generator
(`update_candidate_strategy(input_ids, scores, num_matches)`, scores covering the proposals
plus one); the adapter records those calls on the generator instance, so `rounds` and the
accepted and proposed counts are transformers' own. Its first round scores the prompt and the
first proposals in one call: there is no separate prefill round.
"""

import hashlib
import tempfile
from collections import OrderedDict

import torch

from reference.checkpoint import save_pretrained
from reference.model import EarlyExit, Qwen3

KIT_MODEL_KINDS = {"qwen3"}
# transformers computes in float32: a greedy divergence where the float64 target's top two
# logits are closer than this is a rounding tie, reported as such (logits here are O(10),
# float32's spacing there is ~1e-6, and six layers accumulate a few hundred ulps at most).
KIT_LOGIT_TOLERANCE = 1e-4
DTYPE = torch.float32

# The kit builds fresh models for every example, from a few seeded specs: HF models are kept
# by the content of their weights, so each distinct model is written and loaded once.
_loaded: "OrderedDict[tuple, object]" = OrderedDict()
_LOADED_MAX = 64


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError("--impl=transformers needs transformers: pip install '.[hf]'") from error
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # one bar per load would bury the kit's output
    return transformers


def _qwen3(model) -> Qwen3:
    """The reference Qwen3 behind a kit model; an early-exit draft becomes a standalone model."""
    while hasattr(model, "module"):
        model = model.module
    if isinstance(model, EarlyExit):
        standalone = Qwen3(model.config).to(model.lm_head.weight.dtype)
        state = {name: t for name, t in model.target.state_dict().items()
                 if not name.startswith("model.layers.")
                 or int(name.split(".")[2]) < model.config.num_hidden_layers}
        standalone.load_state_dict(state)
        return standalone.eval()
    if not isinstance(model, Qwen3):
        raise TypeError(f"transformers can only load Qwen3-family models, got {type(model).__name__}")
    return model


def _fingerprint(model: Qwen3) -> tuple:
    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return (digest.hexdigest(),)


def hf_model(model, role="target"):
    """The HF Qwen3ForCausalLM with the same weights (one instance per role: the assistant
    must not share the target's object)."""
    qwen3 = _qwen3(model)
    key = _fingerprint(qwen3) + (role,)
    if key not in _loaded:
        with tempfile.TemporaryDirectory() as path:
            save_pretrained(qwen3, path)
            _loaded[key] = _transformers().Qwen3ForCausalLM.from_pretrained(path, dtype=DTYPE).eval()
        if len(_loaded) > _LOADED_MAX:
            _loaded.popitem(last=False)
    _loaded.move_to_end(key)
    return _loaded[key]


def _seed(generator):
    return int(torch.randint(0, 2**62, (), generator=generator)) if generator is not None else 0


def _record_rounds(hf_target, rounds):
    """Append (proposed, accepted) to `rounds` for every round of the next generate call."""
    original = type(hf_target)._get_candidate_generator

    def get_candidate_generator(*args, **kwargs):
        generator = original(hf_target, *args, **kwargs)
        update = generator.update_candidate_strategy

        def record(input_ids, scores, num_matches):
            rounds.append((scores.shape[1] - 1, int(num_matches)))
            return update(input_ids, scores, num_matches)
        generator.update_candidate_strategy = record
        return generator
    hf_target._get_candidate_generator = get_candidate_generator


def _generate(target, prompt_ids, max_new_tokens, temperature, stop_ids, generator, top_k, top_p,
              **assist):
    hf_target = hf_model(target)
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).view(1, -1)
    if max_new_tokens == 0:
        return [], []
    sampling = temperature > 0
    # pad_token_id must be an id no token has: transformers drops the caller's all-ones
    # attention mask before it reaches the assistant, whose generate then infers a mask from
    # pad_token_id and hides every prompt token equal to it (see CONFORMANCE.md, findings).
    settings = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=sampling,
                    eos_token_id=list(stop_ids) or None, pad_token_id=hf_target.config.vocab_size,
                    # transformers defaults top_k to 50: 0 is the explicit "off".
                    top_k=top_k, top_p=top_p, **({"temperature": temperature} if sampling else {}))
    rounds = []
    _record_rounds(hf_target, rounds)
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(_seed(generator))
            out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), **settings, **assist)
    finally:
        del hf_target._get_candidate_generator
    return out[0, ids.shape[1]:].tolist(), rounds


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                         stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
    """transformers' assisted generation with `draft` as the assistant, k tokens per round."""
    return assisted(target, draft, prompt_ids, max_new_tokens, k, temperature, stop_ids,
                    generator, top_k, top_p)


def assisted(target, draft, prompt_ids, max_new_tokens, k, temperature, stop_ids, generator,
             top_k, top_p, **options):
    """speculative_generate, with `options` added to generate's keywords (the other paths of
    properties/adapters/transformers_paths.py, e.g. assistant_ensemble_weight)."""
    hf_draft = hf_model(draft, role="draft")
    # A constant k, and no early stop of drafting on low confidence: the kit's perfect-draft
    # property relies on every round proposing k tokens.
    config = hf_draft.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    tokens, rounds = _generate(target, prompt_ids, max_new_tokens, temperature, stop_ids,
                               generator, top_k, top_p, assistant_model=hf_draft, **options)
    return tokens, _stats(tokens, rounds)


def target_greedy_generate(target, prompt_ids, max_new_tokens, stop_ids=()):
    """transformers' own greedy decoding of the target, without an assistant."""
    return _generate(target, prompt_ids, max_new_tokens, 0.0, stop_ids, None, 0, 1.0)[0]


def _stats(tokens, rounds):
    # transformers proposes nothing when only one token is left to generate (the last token
    # comes from the target for free); with no proposal there was no rejection, so such a run
    # reports an acceptance rate of 1, as a chain engine that wasted k proposals would.
    proposed = sum(p for p, _ in rounds)
    accepted = sum(a for _, a in rounds)
    return {"rounds": len(rounds),
            "acceptance_rate": accepted / proposed if proposed else float(bool(rounds)),
            "tokens_per_target_call": len(tokens) / len(rounds) if rounds else 0.0}


class PromptLookup:
    """`--impl=transformers-lookup`: `generate(prompt_lookup_num_tokens=k)`; the draft model the
    kit passes is ignored, so the perfect-draft family does not apply."""

    KIT_MODEL_KINDS = KIT_MODEL_KINDS
    KIT_LOGIT_TOLERANCE = KIT_LOGIT_TOLERANCE
    KIT_NOT_APPLICABLE = {"perfect_draft": "prompt lookup ignores the draft model"}

    @staticmethod
    def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                             stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
        tokens, rounds = _generate(target, prompt_ids, max_new_tokens, temperature, stop_ids,
                                   generator, top_k, top_p, prompt_lookup_num_tokens=k)
        return tokens, _stats(tokens, rounds)

    target_greedy_generate = staticmethod(target_greedy_generate)


def accept_or_correct(p, q, token, generator=None):
    """The rule transformers applies, `generation.utils._speculative_sampling`, on one token.

    It takes logits: log p and log q give back p and q through its softmax (zero mass becomes
    -inf, then zero again). It scores one candidate and needs one more target position for the
    bonus token; p is repeated there and the bonus it draws is discarded.
    """
    from transformers.generation.utils import _speculative_sampling

    token = int(token)
    candidate = torch.tensor([[token]])
    q_logits = q.double().log().view(1, 1, -1)                     # [1, 1, V]
    p_logits = p.double().log().view(1, 1, -1).expand(1, 2, -1)    # [1, 2, V]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(generator))
        valid, n_matches = _speculative_sampling(candidate, q_logits, 1, p_logits)
    if int(n_matches) == 1:
        return token, True
    return int(valid[0, 0]), False
