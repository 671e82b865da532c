"""(h) Head drafting vs plain decoding on the weight-bound pair, fast engine, batch 1.

The weight-bound target (reference/trained-large/, 15M parameters) drafts with its EAGLE-3 head
(reference/trained-large/eagle3/, fast/head.py: fed by the hidden states of the target's own
verify forwards), k = 4 and 3, on held-out prompts (48 tokens, 64 new tokens, four prompts one
after another), greedy and at T = 1, against plain decoding (fast/plain.py: the same kernels,
cache and sampler), alternating as fast/test_bench_trained.py's side_by_side does, on one intra-op
thread (fast/conftest.py). Greedy outputs are checked equal to plain decoding. Goal (issue 41):
>= 2.0x at both temperatures (at either k: KS says why both are measured).

Why a ratio is what it is, printed beside it: a round costs one verify of k + 1 tokens and the
head's drafting (its k steps: one over the round's newly verified pairs, then k - 1 of one row),
in target-decode-step units from test_h_step_costs (paired medians, as test_t_fast_step_costs);
it yields the tokens per target call, so head / plain <= tokens per call / (verify + drafting).
Where the goal is missed the run prints that arithmetic and the acceptance it came from, by
position. test_h_draft_vocab measures EAGLE-3's draft vocabulary (a cheaper lm_head) that way.
"""

import time

import pytest
import torch

import fast
from fast.plain import plain_generate
from fast.test_bench_trained import K, ms, paired, prefilled, side_by_side, workload

pretrained = pytest.importorskip("reference.pretrained")

TEMPERATURES = (0.0, 1.0)
GOAL = (2.0, ">= 2.0")
# Round sizes: k = 4, the figure the goal was set at, and k = 3: a head step costs about a fifth
# of a decode step here, so the fourth proposal (accepted in about a fifth of the rounds) costs
# about what it yields; which k pays more is measured, not assumed.
KS = (K, 3)


@pytest.fixture(scope="module")
def pair():
    path = pretrained.LARGE_DIR
    if not (path / "eagle3" / "config.json").is_file():
        pytest.skip(f"no EAGLE-3 head at {path / 'eagle3'}: run `make models-large-head`")
    loaded = pretrained.load_dir(path, torch.float32)
    loaded.name = "large"
    loaded.eagle3 = loaded.head("eagle3")
    return loaded


def cost_name(what: str, k: int) -> str:
    """The name of a step cost of round size k: "verify" / "drafting" at k = K as before."""
    return what if k == K else f"{what} k={k}"


def head_step_costs(pair, head, rounds: int) -> dict:
    """Seconds per round of a target decode step, one head step of one row, and for each k of
    KS a verify of k + 1 tokens and the head's drafting of k proposals right after it, batch
    1, after a 48-token prompt, in rounds where the verifies and draftings swap places with
    (decode, head step) every round."""
    from fast.head import HeadDrafter
    from fast.sampling import Sampler
    from fast.weights import model_weights
    weights = model_weights(pair.target)
    prompts = torch.tensor([p[:48] for p in pair.prompts()[:1]])          # [1, 48]
    lengths = torch.full((1,), 48)
    target = prefilled(weights, prompts, lengths)
    drafter = HeadDrafter(head)
    drafter.attach(weights, 1, 64)
    features = target.prefill(prompts, lengths, drafter.states)            # [1, 48, n * H]
    drafter.prefill(prompts, lengths)
    sampler = Sampler(0.0, 0, 1.0, None, "cpu", 1)
    rows = type("Rows", (), {"last": prompts[:, -1], "row_ids": torch.zeros(1, dtype=torch.long)})
    H = pair.target.config.hidden_size
    h = torch.zeros(1, 1, H)

    def drafting(k):
        # a typical round: all but 2 of the last round's k + 1 pairs verified, then k proposals
        def run():
            drafter.start, drafter.pending = lengths - k + 1, features[:, -(k + 1):]
            drafter.next_tokens = prompts[:, -(k + 1):]
            drafter.propose(rows, lengths, k, sampler, 48 + k + 1)
        return run

    def verify(k):
        return lambda: target.chain(prompts[:, :k + 1], lengths, 48 + k + 1, "all")

    steps = {"decode": lambda: target.chain(prompts[:, :1], lengths, 49, "last"),
             "head step": lambda: drafter._step(prompts[:, :1], h, lengths, 49, None)}
    for k in KS:
        steps[cost_name("verify", k)], steps[cost_name("drafting", k)] = verify(k), drafting(k)
    seconds = {name: [] for name in steps}
    # drafting always right after its verify, as in a round: the verify streams the target's
    # weights through the caches, so the head's are read from memory again (timed after a
    # decode step instead, the head's steps look cheaper than any round sees them)
    rounds_of = [cost_name(what, k) for k in KS for what in ("verify", "drafting")]
    orders = [["decode", "head step"] + rounds_of, rounds_of + ["decode", "head step"]]
    with torch.no_grad():
        for _ in range(rounds):
            orders.reverse()
            for name in orders[0]:
                start = time.perf_counter()
                steps[name]()
                seconds[name].append(time.perf_counter() - start)
    return seconds


def test_h_step_costs(benchmark, figures, pair):
    """The head's drafting of k proposals and one head step of one row, each / a target
    decode step, beside the verify of k + 1 tokens / a decode step (head_step_costs): paired
    medians over 100 rounds (fast/test_bench_trained.py says why). Stored for test_h_head's
    bound."""
    benchmark.group = "(h) large pair, fast, head step costs, B=1"
    measured = {}
    benchmark.pedantic(lambda: measured.update(head_step_costs(
        pair, pair.eagle3, 1 if benchmark.disabled else 100)), rounds=1, warmup_rounds=0)
    if benchmark.disabled:
        return
    seconds = measured
    what = {"head step": "head step of one row"}
    for k in KS:
        what[cost_name("verify", k)] = f"verify of {k + 1} tokens"
        what[cost_name("drafting", k)] = f"head drafting of k={k}"
    for name in what:
        cost = paired(seconds[name], seconds["decode"])
        figures.put(f"h/{name}", cost)
        figures.ratio(benchmark, f"(h) large, fast, {what[name]} / target decode step, B=1",
                      cost, None, None, f"medians {ms(seconds[name]):.2f} vs "
                      f"{ms(seconds['decode']):.2f} ms")


def accepted_by_round(generate):
    """Run generate() with the engine's verify decisions logged: (its result, the accepted
    count of every row of every round, before stop ids and budgets cut a block)."""
    import fast.engine as engine
    log, originals = [], (engine.greedy_verify, engine.rejection_sample)

    def logged(verify):
        def wrapper(*args):
            accepted, block = verify(*args)
            log.append(accepted)
            return accepted, block
        return wrapper

    engine.greedy_verify, engine.rejection_sample = map(logged, originals)
    try:
        result = generate()
    finally:
        engine.greedy_verify, engine.rejection_sample = originals
    return result, torch.cat(log).tolist() if log else []


def arithmetic(acceptance: float, k: int, positions: list, per_call: float, verify, drafting,
               what: str) -> str:
    """The bound of a drafter / plain ratio from its step costs, in words: a round costs a
    verify and the drafting (decode steps; None where not measured) and yields per_call
    tokens, so the ratio is at most per_call / (verify + drafting); and what GOAL would need."""
    why = (f"acceptance {acceptance:.3f} at k={k} (by position "
           + " ".join(f"{a:.2f}" for a in positions)
           + f") gives {per_call:.2f} tokens per target call")
    if verify is None or drafting is None:
        return why
    cost = verify + drafting
    return (why + f"; a round costs verify {verify:.2f} + {what} drafting {drafting:.2f} = "
            f"{cost:.2f} decode steps, so at most {per_call / cost:.2f}x (with every proposal "
            f"accepted {(k + 1) / cost:.2f}x); {GOAL[0]:.1f}x needs {GOAL[0] * cost:.2f} tokens "
            f"per call at this cost, or drafting <= {per_call / GOAL[0] - verify:.2f} decode "
            f"steps at this acceptance")


def by_position(accepted: list, k: int) -> list:
    """Acceptance at each proposal position: of the rounds that reached position i (accepted
    every proposal before it), the share that accepted proposal i."""
    reached = [sum(a >= i for a in accepted) for i in range(k + 1)]
    return [reached[i + 1] / reached[i] if reached[i] else 0.0 for i in range(k)]


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("k", KS)
def test_h_head(benchmark, figures, pair, k, temperature):
    from fast.head import HeadDrafter
    chunks, new = workload(benchmark, pair, 1)
    size = "" if k == K else f", k={k}"
    benchmark.group = f"(h) large pair, fast, head{size}, B=1, T={temperature:g}"
    counts = {}

    def plain():
        g = torch.Generator().manual_seed(0)
        return [row for c in chunks for row in plain_generate(pair.target, c, new, temperature, g)], None

    def speculative():
        g = torch.Generator().manual_seed(0)
        runs = [fast.batched_generate(pair.target, HeadDrafter(pair.eagle3), c, new, k=k,
                                      temperature=temperature, generator=g) for c in chunks]
        counts.update(accepted=sum(s["accepted"] for _, s in runs),
                      proposed=sum(s["proposed"] for _, s in runs))
        return [row for out, _ in runs for row in out], sum(s["row_rounds"] for _, s in runs)

    verify = figures.get("h/" + cost_name("verify", k))
    drafting = figures.get("h/" + cost_name("drafting", k))
    bound = None if verify is None else (lambda per_call: per_call / (verify + drafting))
    label = f"(h) large, fast, head{size} / plain, tokens/s, B=1, T={temperature:g}"
    side_by_side(benchmark, figures, label, plain, speculative, temperature, GOAL, bound)
    if k == K:
        figures.put(f"h/per_call/T={temperature:g}",
                    benchmark.extra_info.get("tokens_per_target_call"))
    ratio = benchmark.extra_info.get("ratio")
    if ratio is None or ratio >= GOAL[0]:
        return
    # missed: the arithmetic that bounds it on this CPU. The same generation once more,
    # untimed, its verify decisions logged (the generator's seed fixes the rounds: they are the
    # timed runs' rounds)
    per_call = benchmark.extra_info["tokens_per_target_call"]
    _, accepted = accepted_by_round(speculative)
    positions = by_position(accepted, k)
    acceptance = counts["accepted"] / counts["proposed"]
    why = arithmetic(acceptance, k, positions, per_call, verify, drafting, "head")
    # the summary's line for the arithmetic; this benchmark's JSON keeps its measured ratio
    measured = {key: benchmark.extra_info[key] for key in ("ratio", "target", "met", "note")}
    figures.ratio(benchmark, f"(h) why{size} T={temperature:g} misses {GOAL[1]}: step-cost bound",
                  bound(per_call) if bound is not None else ratio, None, None, why)
    benchmark.extra_info.update(measured, why_missed=why, acceptance_by_position=positions)


# EAGLE-3's draft vocabulary, measured rather than assumed: the head's lm_head over the Vd most
# frequent target tokens of the training text reads (V - Vd) * H fewer parameters a step
# (1024: 0.39M, 512: 0.59M of a step's 2.85M), and proposes nothing outside them. The heads
# here are the trained head with its lm_head cut to those rows (its logits masked outside them:
# the law a head trained on the draft vocabulary learns, the target's law renormalized there,
# is the trained head's law renormalized there where that head is right).
DRAFT_VOCABS = (1024, 512)


@pytest.fixture(scope="module")
def token_counts(pair):
    """counts(timed) -> how often each target token occurs in the training text
    (reference/corpus.py's training files, the pair's tokenizer; about 12 s to encode, once a
    module): the draft vocabulary is the most frequent. Untimed (the smoke run, benchmarks
    disabled) the held-out prompts are counted instead: that checks the code, not a figure."""
    from reference import corpus
    made = {}

    def counts(timed: bool) -> torch.Tensor:
        if timed not in made:
            if timed:
                train_files, _ = corpus.split(corpus.corpus_files())
                ids = corpus.encode_files(pair.tokenizer, [corpus.read(f) for f in train_files])
            else:
                ids = [t for p in pair.prompts() for t in p]
            made[timed] = torch.bincount(torch.tensor(ids),
                                         minlength=pair.target.config.vocab_size)
        return made[timed]
    return counts


def restricted_head(head, draft_vocab: torch.Tensor):
    """The trained head with its lm_head cut to the rows of draft_vocab (target ids, ascending
    as EAGLE-3's d2t orders them)."""
    from reference.heads.eagle3 import Eagle3Head
    state = dict(head.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"][draft_vocab]
    state["draft_to_target"] = draft_vocab
    cut = Eagle3Head(head.target_config, head.hidden, draft_vocab.tolist())
    cut.load_state_dict(state, strict=True)
    return cut.to(head.fc.weight.dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("size", DRAFT_VOCABS)
def test_h_draft_vocab(benchmark, figures, pair, token_counts, size):
    """A draft vocabulary of `size` tokens: its drafting cost and tokens per target call beside
    the full head's, and the step-cost bound each gives (no goal: the figure that chooses)."""
    from fast.head import HeadDrafter
    chunks, new = workload(benchmark, pair, 1)
    benchmark.group = f"(h) large pair, fast, head with a draft vocabulary of {size}, B=1"
    counts = token_counts(not benchmark.disabled)
    head = restricted_head(pair.eagle3, counts.argsort(descending=True)[:size].sort().values)
    per_call, measured = {}, {}

    def run():
        measured.update(head_step_costs(pair, head, 1 if benchmark.disabled else 50))
        for temperature in TEMPERATURES:
            g = torch.Generator().manual_seed(0)
            runs = [fast.batched_generate(pair.target, HeadDrafter(head), c, new, k=K,
                                          temperature=temperature, generator=g) for c in chunks]
            tokens = sum(len(row) for out, _ in runs for row in out)
            per_call[temperature] = tokens / sum(s["row_rounds"] for _, s in runs)

    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    verify, full_drafting = figures.get("h/verify"), figures.get("h/drafting")
    if benchmark.disabled or verify is None:
        return
    drafting = paired(measured["drafting"], measured["decode"])
    for temperature in TEMPERATURES:
        full = figures.get(f"h/per_call/T={temperature:g}")
        bound = per_call[temperature] / (verify + drafting)
        note = (f"drafting {drafting:.2f} decode steps (full vocabulary {full_drafting:.2f}); "
                f"{per_call[temperature]:.2f} tokens per target call"
                + ("" if full is None else
                   f" (full vocabulary {full:.2f}); the full vocabulary's bound "
                   f"{full / (verify + full_drafting):.2f}x"))
        figures.ratio(benchmark, f"(h) draft vocabulary {size}: step-cost bound, "
                      f"T={temperature:g}", bound, None, None, note)


def head_walk_ranks(pair, head, prompts, outputs, depth: int) -> list:
    """For every round start along the greedy outputs (the round whose newest token is the
    prompt's last or an output token), the rank of the target's next token among the head's
    logits at each of the round's first `depth` proposals, the earlier ones taken as accepted
    (reference.heads.replay.round_logits: the head's laws on that path, replayed from the
    target's features). rows[prompt][i] = [rank at proposal 1, 2, ...]."""
    from reference.heads.replay import round_logits
    from reference.hidden import forward_hidden
    rows = []
    for prompt, out in zip(prompts, outputs):
        seq = prompt + out
        with torch.no_grad():
            _, features = forward_hidden(pair.target, torch.tensor([seq]),
                                         pair.target.new_cache(1, len(seq)), head.hidden)
        ranks = []
        for i in range(len(out)):
            n = len(prompt) - 1 + i              # the round's newest token is seq[n]
            logits = round_logits(head, features[0], seq, n, min(depth, len(seq) - 1 - n))
            ranks.append([int((row > row[seq[n + 1 + d]]).sum()) for d, row in enumerate(logits)])
        rows.append(ranks)
    return rows


def walk_tokens_per_call(ranks: list, topk: int, depth: int) -> float:
    """Greedy tokens per target call of the best tree of this topk and depth with no node
    budget: a round accepts the target's tokens while each is among the head's topk at its
    node (the path's nodes are the committed sequence), then adds one. topk 1 is the chain."""
    calls = tokens = 0
    for per_start in ranks:
        i = 0
        while i < len(per_start):
            d = 0
            while d < min(depth, len(per_start[i])) and per_start[i][d] < topk:
                d += 1
            i, calls = i + d + 1, calls + 1
        tokens += len(per_start)
    return tokens / calls


# Trees drawn by the head, bounded before building them (deliverable 2 grows trees from the small
# draft): tokens per call of top-2 and top-3 trees by depth, against the chain (top-1).
TREE_DEPTHS = (3, 4, 5)


def test_h_tree_bound(benchmark, figures, pair):
    """The greedy tokens per target call of any tree of the head's top-2 / top-3 children to
    depth 3-5 with no node budget, beside the chain's (walk_tokens_per_call on the target's
    greedy outputs; top-1 to depth k is the chain, equal to the measured tokens per call). No
    timing: the figures are counts. Their use, by arithmetic: a tree pays only if its tokens per
    call exceed the chain's by more than its verify costs beyond the chain's (past about 8
    nodes a verify grows with its nodes on this CPU, "Issue 41: dynamic trees")."""
    from fast.plain import plain_generate
    chunks, new = workload(benchmark, pair, 1)
    benchmark.group = "(h) large pair, head-drawn trees, greedy tokens per call bound"
    prompts = [c[0] for c in chunks]
    found = {}

    def run():
        outputs = plain_generate(pair.target, prompts, new)
        found["ranks"] = head_walk_ranks(pair, pair.eagle3, prompts, outputs, max(TREE_DEPTHS))

    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    ranks = found["ranks"]
    chain = walk_tokens_per_call(ranks, 1, K)
    if benchmark.disabled:
        return
    for topk in (2, 3):
        for depth in TREE_DEPTHS:
            per_call = walk_tokens_per_call(ranks, topk, depth)
            figures.ratio(benchmark, f"(h) head top-{topk} tree, depth {depth}, no budget / "
                          f"chain k={K}, tokens per call", per_call / chain, None, None,
                          f"{per_call:.2f} vs {chain:.2f} (a top-{topk} tree of depth {depth} "
                          f"has up to {sum(topk ** d for d in range(1, depth + 1))} nodes)")
