"""transformers' other speculative paths, each an `--impl` name (issue 40):

    transformers-early-exit  generate(assistant_early_exit=N): the target's first N layers,
                             its final norm and head draft for it (self-speculation)
    transformers-universal   generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...):
                             universal assisted decoding, an assistant with another tokenizer
    transformers-ensemble    generate(assistant_model=..., assistant_ensemble_weight=w): the
                             verifier accepts against w p + (1 - w) q; lossy in transformers'
                             own words, judged as the kit's negative control

They share `properties.adapters.transformers` (checkpoints, seeding, the recorded rounds); what
each adds is the option and what the kit can judge of it.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
import torch

from properties import methods
from properties.adapters import transformers as hf
from reference.model import EarlyExit, Qwen3

# the kit's own early-exit convention (properties/models/specs.py): the first layer drafts
EARLY_EXIT_DEFAULT = 1
# transformers' docstring of the option (generation/configuration_utils.py, 5.25.0)
ENSEMBLE_WORDS = ("\"the verifier accepts tokens against the mixture `w * p_target + (1 - w) * "
                  "q_draft` instead of `p_target`, trading a controlled distributional bias for "
                  "a higher acceptance rate\"; None \"keeps decoding lossless\"")
ENSEMBLE_WEIGHT = 0.5


def _module(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def exit_layers(target, draft) -> int:
    """The exit depth transformers is asked for: the kit's draft where it is the target's own
    first layers (an EarlyExit of this target, or the target itself: every layer, the perfect
    draft); any other draft cannot be an early exit, so the kit's convention (one layer)."""
    t, d = _module(target), _module(draft)
    if d is t:
        return t.config.num_hidden_layers
    if isinstance(d, EarlyExit) and d.target is t:
        return d.config.num_hidden_layers
    return min(EARLY_EXIT_DEFAULT, t.config.num_hidden_layers)


@contextlib.contextmanager
def _drafting(config, k):
    """k tokens a round, constant, no confidence stop, on `config` for one call only: the
    early-exit assistant is the target itself, which reads them from its own stored
    generation_config (not from generate's keywords), and the target is shared across runs."""
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule",
             "assistant_confidence_threshold")
    saved = {name: getattr(config, name) for name in names}
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


class EarlyExitImpl:
    """`--impl=transformers-early-exit`. The draft the kit hands is used only to choose the exit
    depth (`exit_layers`): for the kit's early-exit draft transformers drafts with exactly it
    (the first layer, the final norm and head, as `reference.model.EarlyExit`), for the perfect
    draft with every layer. Other drafts are set aside: greedy, sequence and bounds judge the
    output against the target, whatever drafted."""

    KIT_MODEL_KINDS = hf.KIT_MODEL_KINDS
    KIT_LOGIT_TOLERANCE = hf.KIT_LOGIT_TOLERANCE

    @staticmethod
    def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                             stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
        with _drafting(hf.hf_model(target).generation_config, k):
            tokens, rounds = hf._generate(target, prompt_ids, max_new_tokens, temperature,
                                          stop_ids, generator, top_k, top_p,
                                          assistant_early_exit=exit_layers(target, draft))
        return tokens, hf._stats(tokens, rounds)

    target_greedy_generate = staticmethod(hf.target_greedy_generate)


# Universal assisted decoding needs two tokenizers over the same texts. The kit's models have
# no text: token i of the target is the character FIRST + i, one character a token, no merges.
FIRST = 0x4E00     # CJK ideographs: 20,000 letters, no space, no normalization touches them


def _tokenizer(alphabet):
    """A transformers tokenizer whose token i is the character alphabet[i]."""
    from tokenizers import Tokenizer, decoders, models
    hf._transformers()
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.decoder = decoders.Fuse()   # ids back to one string, no spaces between tokens
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def permutation(vocab: int) -> list[int]:
    """assistant id of the target's token i: the reverse order."""
    return [vocab - 1 - i for i in range(vocab)]


def tokenizers(vocab: int):
    """(the target's tokenizer, the assistant's). The assistant's has the same characters in
    `permutation`'s order, and one more, EXTRA, that no text of the target holds: transformers
    takes models of equal vocabulary size for models of one tokenizer and refuses an
    assistant_tokenizer then (ValueError "`assistant_tokenizer` is not required when the main
    and assistant models use the same tokenizer")."""
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"tokenizers: vocab={vocab!r}, must be an int >= 1")
    letters = [chr(FIRST + i) for i in range(vocab + 1)]
    order = permutation(vocab)
    assistant = [""] * vocab
    for i, j in enumerate(order):
        assistant[j] = letters[i]
    return _tokenizer(letters[:vocab]), _tokenizer(assistant + [letters[vocab]])


def assistant_of(draft) -> Qwen3:
    """The kit's draft in the assistant's ids: embedding and head rows moved by `permutation`,
    and a row for EXTRA (zero: a logit of 0, so greedy drafting picks it only where every real
    logit is negative; under sampling transformers prunes it from the head)."""
    base = hf._qwen3(draft)
    vocab = base.config.vocab_size
    order = torch.tensor(permutation(vocab))
    state = base.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = state[name]
        moved = torch.empty_like(rows)
        moved[order] = rows
        state[name] = torch.cat([moved, rows.new_zeros(1, rows.shape[1])])
    model = Qwen3(replace(base.config, vocab_size=vocab + 1)).to(base.lm_head.weight.dtype)
    model.load_state_dict(state)
    return model.eval()


class UniversalImpl:
    """`--impl=transformers-universal`: the kit's draft as an assistant with its own tokenizer
    (`tokenizers`, `assistant_of`), so every round goes through text: greedy through
    AssistedCandidateGeneratorDifferentTokenizers (ids -> text -> assistant ids, drafts -> text
    -> target ids, aligned by their longest common run), sampled through
    UniversalSpeculativeDecodingGenerator (a vocabulary map by token string, q carried over)."""

    KIT_MODEL_KINDS = hf.KIT_MODEL_KINDS
    KIT_LOGIT_TOLERANCE = hf.KIT_LOGIT_TOLERANCE

    @staticmethod
    def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                             stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
        vocab = hf._qwen3(target).config.vocab_size
        # Under sampling transformers prunes the assistant's head in place, once per pair of
        # tokenizer objects (AssistantVocabTranslatorCache): a pruned assistant then decodes
        # wrong in greedy drafting, and a second assistant under the same pair is never pruned
        # (the finding tests/findings/transformers_universal_translator_cache/). So each mode
        # has its own assistant instance, and each instance its own pair of tokenizers.
        mode = "sampled" if temperature > 0 else "greedy"
        assistant = hf.hf_model(assistant_of(draft), role=f"universal-assistant-{mode}")
        if getattr(assistant, "kit_tokenizers", None) is None:
            assistant.kit_tokenizers = tokenizers(vocab)
        mine, theirs = assistant.kit_tokenizers
        config = assistant.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
        config.assistant_confidence_threshold = 0.0
        tokens, rounds = hf._generate(target, prompt_ids, max_new_tokens, temperature, stop_ids,
                                      generator, top_k, top_p, assistant_model=assistant,
                                      tokenizer=mine, assistant_tokenizer=theirs)
        return tokens, hf._stats(tokens, rounds)

    target_greedy_generate = staticmethod(hf.target_greedy_generate)


class EnsembleImpl:
    """`--impl=transformers-ensemble`: assisted generation with `assistant_ensemble_weight`
    = ENSEMBLE_WEIGHT. transformers names it lossy (ENSEMBLE_WORDS): the kit must judge it NOT
    CONFORMANT, greedy too (its greedy compares drafts with the argmax of the mixture)."""

    KIT_MODEL_KINDS = hf.KIT_MODEL_KINDS
    KIT_LOGIT_TOLERANCE = hf.KIT_LOGIT_TOLERANCE
    KIT_METHOD = methods.Method(
        "transformers-ensemble", f"assisted generation, assistant_ensemble_weight="
        f"{ENSEMBLE_WEIGHT}", methods.UNKNOWN, lossy=f"transformers' own words: {ENSEMBLE_WORDS}")

    @staticmethod
    def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0,
                             stop_ids=(), generator=None, *, top_k=0, top_p=1.0):
        return hf.assisted(target, draft, prompt_ids, max_new_tokens, k, temperature, stop_ids,
                           generator, top_k, top_p, assistant_ensemble_weight=ENSEMBLE_WEIGHT)

    target_greedy_generate = staticmethod(hf.target_greedy_generate)
