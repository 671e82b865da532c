"""Exact tree sampling in the reference (reference/tree.py): the proof checked numerically, the
sampler checked statistically, the kit API and the CLI.

`node_law` computes, by enumerating every draw of the b children, the exact law of the token a
node commits under a sibling rule; the correct rule must give p to rounding, and each of the
sibling bugs of tests/mutants/tree.py must not (so the exactness test can fail).
"""

import contextlib
import io
import itertools
import json

import pytest
import torch
from scipy import stats

from reference.__main__ import main
from reference.model import EarlyExit, random_model
from reference.speculative import PromptLookup, tree_generate
from reference.sampling import SamplingParams
from reference.tree import Sampler, Tree, residual, sampled_path


def _renormalized(q, earlier):
    kept = q.clone()
    kept[list(set(earlier))] = 0
    return kept / kept.sum() if kept.sum() > 0 else q


def node_law(p, q, b, carried=True, against_p=False, renormalize=False, without=False):
    """Exact law of the committed token at a node with b children drawn from q (i.i.d., or
    without replacement when `without`), under the recursive rule or one of its bugs."""
    law = torch.zeros_like(p)
    for kids in itertools.product(range(p.numel()), repeat=b):
        if without and len(set(kids)) < b:
            continue
        weight, left = 1.0, 1.0
        for x in kids:
            weight *= float(q[x]) / (left if without else 1.0)
            left -= float(q[x]) if without else 0.0
        if weight == 0:
            continue
        reach, r, earlier = 1.0, p, []
        for x in kids:
            q_x = _renormalized(q, earlier) if renormalize else q
            tested = p if against_p else r
            accept = min(1.0, float(tested[x] / q_x[x])) if q_x[x] > 0 else 0.0
            law[x] += weight * reach * accept
            reach *= 1 - accept
            r = residual(r if carried else p, q_x)
            earlier.append(x)
        law += weight * reach * r
    return law


def _pair(seed, vocab=4):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, 0)
    return p, q


@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_iid_children_with_recursive_rejection_commit_p(b, seed):
    p, q = _pair(seed)
    assert torch.allclose(node_law(p, q, b), p, atol=1e-12, rtol=0)


def test_sparse_and_equal_distributions_commit_p():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.25, 0.25, 0.5], dtype=torch.float64)
    for a, c in ((p, q), (q, p), (p, p)):
        assert torch.allclose(node_law(a, c, 3), a, atol=1e-12, rtol=0)


# The kit's S_SIBLINGS example's root (properties/test_tree.py) in miniature: p and q apart.
BUGS = {"residual not carried": {"carried": False}, "siblings against p": {"against_p": True},
        "q renormalized, drawn with replacement": {"renormalize": True},
        "drawn without replacement, q not renormalized": {"without": True}}


@pytest.mark.parametrize("bug", BUGS)
def test_each_sibling_bug_changes_the_law(bug):
    p = torch.tensor([0.35, 0.015, 0.207, 0.428], dtype=torch.float64)
    q = torch.tensor([0.222, 0.753, 0.003, 0.022], dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    tv = 0.5 * float((node_law(p, q, 3, **BUGS[bug]) - p).abs().sum())
    assert tv > 0.1, f"{bug}: total variation {tv}"


def test_sampled_path_commits_p_at_one_node():
    """The reference's own walk on a one-level tree of 3 i.i.d. children: the committed token
    is tested against p by chi-square at alpha 1e-6 (n = 4000 detects TV 0.1 with power
    > 0.999 on 3 df)."""
    torch.manual_seed(0)
    tree, n = Tree((3,)), 4000
    target_logits = torch.log(torch.tensor([[0.35, 0.015, 0.207, 0.428]] * 4, dtype=torch.float64))
    q = torch.tensor([0.222, 0.753, 0.003, 0.022], dtype=torch.float64)
    q = q / q.sum()
    sampler = Sampler(SamplingParams(temperature=1.0), torch.Generator().manual_seed(1))
    p = sampler.probs(target_logits[0])
    counts = torch.zeros(4)
    for _ in range(n):
        tokens = [0] + [sampler.draw(q) for _ in range(3)]
        path, after = sampled_path(tree, tokens, {0: q}, target_logits, sampler)
        counts[tokens[path[0]] if path else after] += 1
    assert stats.chisquare(counts.numpy(), (n * p).numpy()).pvalue > 1e-6


@pytest.fixture(scope="module")
def target():
    return random_model("tiny", seed=3, dtype=torch.float64)


def test_perfect_draft_accepts_every_path_under_sampling(target):
    g = torch.Generator().manual_seed(0)
    out, stats_ = tree_generate(target, target, [1, 2, 3], 16, tree=(2, 2), temperature=0.9,
                                generator=g)
    assert len(out) == 16 and stats_["acceptance_rate"] == 1.0 and stats_["rounds"] == 6


def test_same_seed_same_output_and_stops(target):
    draft = EarlyExit(target, 2)
    runs = [tree_generate(target, draft, [4, 5], 20, tree=(2, 2, 1), temperature=1.2, top_k=50,
                          top_p=0.9, generator=torch.Generator().manual_seed(7))[0] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20
    stop = runs[0][5]
    out, _ = tree_generate(target, draft, [4, 5], 20, tree=(2, 2, 1), temperature=1.2, top_k=50,
                           top_p=0.9, stop_ids=(stop,), generator=torch.Generator().manual_seed(7))
    assert out == runs[0][:runs[0].index(stop) + 1]


@pytest.mark.parametrize("kwargs, match", [
    ({"tree": (2, 0)}, r"tree branching must be .* got \(2, 0\)"),
    ({"tree": 3}, r"tree branching must be .* got 3"),
    ({"temperature": -0.5}, r"temperature must be >= 0 .* got -0.5"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\] .* got 0.0"),
])
def test_tree_generate_bad_input(target, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tree_generate(target, target, [1, 2], 4, **kwargs)


def test_tree_generate_needs_a_model_draft(target):
    with pytest.raises(ValueError, match="needs a model draft"):
        tree_generate(target, PromptLookup(2), [1, 2], 4)


def test_cli_tree_sampling():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        main(["speculate", "--tree", "--temperature", "0.8", "--max-new-tokens", "9",
              "--draft", "early-exit"])
    lines = [json.loads(line) for line in text.getvalue().splitlines()]
    assert len(lines[0]["tokens"]) == 9 and lines[0]["tokens_per_target_call"] > 1
    assert lines[-1]["draft"] == "none (target sampling)"
