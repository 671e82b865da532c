"""transformers' other speculative paths (properties/adapters/transformers_paths.py): each
option reaches generate and its own candidate generator drafts, so that the kit's verdicts on
--impl=transformers-early-exit / -universal / -ensemble are about the path they name."""

import pytest
import torch

from reference.model import EarlyExit, preset, random_model
from reference.speculative import greedy_generate

pytest.importorskip("transformers", reason="the transformers adapter needs the optional 'hf' extra")
hf = pytest.importorskip("properties.adapters.transformers")
paths = pytest.importorskip("properties.adapters.transformers_paths")
from transformers import Qwen3ForCausalLM  # noqa: E402
from transformers.generation import candidate_generator as cg  # noqa: E402
from transformers.generation import utils as gen_utils  # noqa: E402

PROMPT = [3, 1, 4, 1, 5]
LONG_PROMPT = [(5 * i + 2) % 256 for i in range(16)]   # past the short-prompt finding


@pytest.fixture(scope="module")
def target():
    return random_model(preset("tiny", num_hidden_layers=3), seed=4, dtype=torch.float64)


@pytest.fixture(scope="module")
def other():
    return random_model(preset("tiny", num_hidden_layers=1), seed=5, dtype=torch.float64)


@pytest.fixture
def rounds(monkeypatch):
    """Every round's candidate generator class, its input ids and its proposals."""
    seen = []
    original = Qwen3ForCausalLM._get_candidate_generator

    def spy(self, *args, **kwargs):
        generator = original(self, *args, **kwargs)
        get = generator.get_candidates

        def candidates(input_ids, **kw):
            ids, logits = get(input_ids, **kw)
            seen.append((type(generator), input_ids[0].tolist(),
                         ids[0, input_ids.shape[1]:].tolist()))
            return ids, logits
        generator.get_candidates = candidates
        return generator
    monkeypatch.setattr(Qwen3ForCausalLM, "_get_candidate_generator", spy)
    return seen


def test_the_exit_depth_is_the_kits_draft_where_it_is_the_targets_own_layers(target, other):
    assert paths.exit_layers(target, target) == 3            # the perfect draft: every layer
    assert paths.exit_layers(target, EarlyExit(target, 2)) == 2
    assert paths.exit_layers(target, other) == paths.EARLY_EXIT_DEFAULT


def test_early_exit_drafts_exactly_the_kits_early_exit_draft(target, rounds):
    draft = EarlyExit(target, 1)
    tokens, stats = paths.EarlyExitImpl.speculative_generate(target, draft, PROMPT, 12, k=3)
    assert tokens == greedy_generate(target, PROMPT, 12)
    assert rounds and all(kind is cg.EarlyExitCandidateGenerator for kind, _, _ in rounds)
    standalone = hf._qwen3(draft)
    for _, context, proposed in rounds:
        # the first layer, the final norm and the head, from the same context (float64 here)
        assert proposed == greedy_generate(standalone, context, len(proposed)), context
    assert stats["rounds"] == len(rounds)
    # the target's stored drafting settings are put back after the call
    assert hf.hf_model(target).generation_config.num_assistant_tokens is None


def test_the_assistant_is_the_same_draft_in_the_assistants_ids(other):
    assistant = paths.assistant_of(other)
    order = paths.permutation(256)
    ids = torch.tensor([LONG_PROMPT])
    moved = torch.tensor([[order[t] for t in LONG_PROMPT]])
    theirs = assistant(moved, assistant.new_cache(1, 16))
    mine = other(ids, other.new_cache(1, 16))
    torch.testing.assert_close(theirs[..., order], mine)
    assert torch.all(theirs[..., 256] == 0)                 # the extra token's row
    target_tokenizer, assistant_tokenizer = paths.tokenizers(256)
    text = target_tokenizer.decode(LONG_PROMPT)
    assert assistant_tokenizer(text, add_special_tokens=False)["input_ids"] == moved[0].tolist()


@pytest.mark.parametrize("temperature, generator_class", [
    (0.0, cg.AssistedCandidateGeneratorDifferentTokenizers),
    (1.0, cg.UniversalSpeculativeDecodingGenerator)])
def test_universal_decoding_runs_its_own_candidate_generator(target, other, rounds, temperature,
                                                             generator_class):
    tokens, _ = paths.UniversalImpl.speculative_generate(
        target, other, LONG_PROMPT, 10, k=3, temperature=temperature,
        generator=torch.Generator().manual_seed(0))
    assert len(tokens) == 10
    assert rounds and all(kind is generator_class for kind, _, _ in rounds)
    assert any(proposed for _, _, proposed in rounds)
    if temperature == 0:
        assert tokens == greedy_generate(target, LONG_PROMPT, 10)


def test_transformers_refuses_an_assistant_tokenizer_of_the_same_vocabulary_size(target):
    # why the assistant's tokenizer carries one extra character
    mine, _ = paths.tokenizers(256)
    with pytest.raises(ValueError, match="not required when the main and assistant models use "
                                         "the same tokenizer"):
        hf._generate(target, PROMPT, 4, 0.0, (), None, 0, 1.0,
                     assistant_model=hf.hf_model(target, role="draft"), tokenizer=mine,
                     assistant_tokenizer=mine)


def test_greedy_universal_decoding_still_dies_on_a_short_prompt():
    # tests/findings/transformers_universal_short_prompt/ (a kit example it failed on): when
    # transformers fixes it, this fails, and CONFORMANCE.md is updated
    from properties.models.specs import Qwen3Spec, qwen3_module
    small = qwen3_module(Qwen3Spec(vocab=13, seed=0, layers=3, hidden=16))
    with pytest.raises(RuntimeError, match="0 elements"):
        paths.UniversalImpl.speculative_generate(small, small, [1, 2, 3, 1, 2], 12, k=4)


def test_the_ensemble_weight_reaches_the_verifier_and_changes_greedy_output(target, other,
                                                                             monkeypatch):
    weights = []
    original = gen_utils._speculative_sampling

    def spy(*args, assistant_ensemble_weight=None):
        weights.append(assistant_ensemble_weight)
        return original(*args, assistant_ensemble_weight=assistant_ensemble_weight)
    monkeypatch.setattr(gen_utils, "_speculative_sampling", spy)
    paths.EnsembleImpl.speculative_generate(target, other, PROMPT, 8, k=3, temperature=1.0,
                                            generator=torch.Generator().manual_seed(0))
    assert weights and set(weights) == {paths.ENSEMBLE_WEIGHT}
    greedy, _ = paths.EnsembleImpl.speculative_generate(target, other, PROMPT, 16, k=3)
    assert greedy != greedy_generate(target, PROMPT, 16)     # lossy, as transformers says
    from properties.impl import load
    assert "w * p_target" in load("transformers-ensemble").method.lossy
