"""``pytest properties/ --engine=ENGINE --method=METHOD --models trained``: a production engine on the
committed trained pair, where speculation pays, judged on what still has an exact answer;
``--models trained-large``: the same run on the weight-bound pair of `make models-large`
(properties/export/trained.py PAIRS), whose target is large enough for speculation to pay in
time too. Every function below takes the pair's name (`models`, default the committed pair).

The kit's law families need its own 32-token models (their laws are enumerable); on the trained
pair (2,048 tokens) the run checks instead, over greedy requests on held-out prompts (Python
source the models never saw, tokenized by the trained tokenizer):

(a) greedy: the engine's output is the float64 trained target's greedy output (a token the
    engine chose where the float64 top-two gap is within the served tolerance is a tie, not a
    failure: the served checks' rule, properties/checks/served.py greedy_divergence), and equals
    the baseline server's up to such ties;
(b) acceptance: under greedy decoding the rounds are determined by the target's greedy path
    and the draft's greedy proposals, so the engine's own counts of drafted and accepted tokens
    for each request must equal the replay of its rounds with the float64 pair
    (properties.acceptance.replay, under the engine's declared end-of-request schedule); a
    mismatch is a failure naming both. Tokens per target call come from the same replay. An
    engine that keeps no counters (transformers serve) has (b) said NOT JUDGED, and nothing
    then shows it drafted: the verdict is NOT SHOWN, never CONFORMANT;
(c) the speed-up: properties.serve.speed.measure with these prompts.

The family served_trained (properties/test_served_trained.py) runs the check; it passes when
(a) and (b) hold for every request, and shows speculation when the engine drafted. The speed-up
and the acceptance are reported beside the verdict (result.json, the results file, the engines
grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from properties import acceptance
from properties.adapters.client import Client, Request, ServedError
from properties.adapters.served import LOGIT_TOLERANCE
from properties.checks.served import greedy_divergence
from properties.export import heads
from properties.models import heads as head_rounds
from properties.export import trained as export
from properties.methods import HeadDraft

# held-out prompts of the pair (its heldout.json: 48 tokens each; both pairs share them) and
# the greedy tokens asked per request
PROMPTS = 4
TOKENS = 48


# ----------------------------------------------------------------- the float64 trained pair

class Pair:
    """The trained target and the draft of one method in float64 (of the pair `models` names),
    forwards without reuse (the requests are few and short: each call is one forward over the
    whole sequence)."""

    def __init__(self, draft: str | None, models: str = "trained"):
        pair = export.pair_of(models, torch.float64)
        self.target = pair.target
        self.draft = {None: None, "target": pair.target, "draft-small": pair.small,
                      "draft-early-exit": pair.early_exit()}[draft]

    @staticmethod
    @torch.inference_mode()
    def forward(model, seq) -> torch.Tensor:
        """[len(seq), V]: row i is the model's logits after seq[:i + 1]."""
        ids = torch.tensor([list(seq)])
        return model(ids, model.new_cache(1, ids.shape[1]))[0]

    def logits(self, prompt, tokens) -> torch.Tensor:
        """[len(tokens), V]: the target's rows for each token of `tokens` after `prompt`
        (greedy_divergence's `logits`)."""
        if not tokens:
            return torch.empty(0, self.target.config.vocab_size, dtype=torch.float64)
        seq = list(prompt) + list(tokens)
        return self.forward(self.target, seq[:-1])[len(prompt) - 1:]

    def greedy(self, model, seq, n: int) -> tuple[list, list]:
        """(n greedy tokens of `model` after seq, the top-two logit gap at each)."""
        seq, out, gaps = list(seq), [], []
        for _ in range(n):
            row = self.forward(model, seq)[-1]
            top = torch.topk(row, 2).values
            out.append(int(row.argmax()))
            gaps.append(float(top[0] - top[1]))
            seq.append(out[-1])
        return out, gaps


@lru_cache(maxsize=4)
def pair(draft: str | None, models: str = "trained") -> Pair:
    return Pair(draft, models)


def prompts(n: int = PROMPTS, models: str = "trained") -> list[tuple]:
    """The first n held-out prompts of the pair `models` names (token ids of the trained
    tokenizer)."""
    return [tuple(p) for p in export.pair_of(models, torch.float32).prompts()[:n]]


# ----------------------------------------------------------------- (b): the exact replay

@dataclass
class Replay:
    expected: acceptance.Expected
    target_calls: int
    draft_ties: int      # proposals whose float64 draft top-two gap is within the tolerance


def replay(ref: Pair, prompt, tokens, max_tokens: int, k: int, schedule: str,
           pieces=(), head=None, eos_stops_acceptance: bool = False) -> Replay:
    """The exact rounds of one greedy request whose output was `tokens` (the engine's: where it
    broke a tie the replay follows it), summed over its pieces when the client assembled it
    from several requests (each from the prompt and the tokens so far). `head`: a float64
    feature-level head that drafts instead of ref.draft (its rounds start from the target's
    features of each round's context; draft_ties counts a draft model's near-ties only)."""
    tokens = list(tokens)
    pieces = tuple(pieces) or (len(tokens),)
    drafts = drafted = accepted = calls = ties = 0
    done = 0
    for length in pieces:
        start = tuple(prompt) + tuple(tokens[:done])
        wanted = max_tokens - done
        # the target's path: the engine's tokens, then the float64 greedy past them (accepted
        # proposals may run past the end of a request)
        path = tokens[done:]
        if len(path) < wanted + k + 1:
            path += ref.greedy(ref.target, start + tuple(path), wanted + k + 1 - len(path))[0]

        def propose(committed, n):
            nonlocal ties
            if head is not None:
                return head_rounds.greedy_proposals(head, ref.target, start + tuple(path[:committed]),
                                              n)
            out, gaps = ref.greedy(ref.draft, start + tuple(path[:committed]), n)
            ties += sum(g <= LOGIT_TOLERANCE for g in gaps)
            return out

        e = acceptance.replay(path, propose, wanted, k, schedule, produced=length,
                              eos_stops_acceptance=eos_stops_acceptance)
        drafts, drafted, accepted = drafts + e.drafts, drafted + e.drafted, accepted + e.accepted
        calls += target_calls(e, min(length, wanted), schedule)
        done += length
    return Replay(acceptance.Expected(drafts, drafted, accepted), calls, ties)


def target_calls(e: acceptance.Expected, produced: int, schedule: str) -> int:
    """Target forwards of one request of `produced` tokens: the prefill's (where it gives the
    first token: every schedule but "prompt", whose first round's verify is the prefill), one
    per round, and one per token left after the last round (a plain decode step)."""
    prefill = 0 if schedule == "prompt" else 1
    by_rounds = prefill + e.accepted + e.drafts
    return prefill + e.drafts + max(0, produced - by_rounds)


# ----------------------------------------------------------------- the check

def check(engine, method, spec_url: str, base_url: str | None, say=print,
          n_prompts: int = PROMPTS, max_tokens: int = TOKENS, models: str = "trained") -> dict:
    """(a) and (b) over `n_prompts` greedy requests of `max_tokens`, one at a time, to the
    speculating server (its counters read around each) and to the baseline, against the pair
    `models` names (the one the servers were given). Returns the record's "trained" entry: per
    request, totals, failures (empty: conformant)."""
    dialect = dialect_for(engine, method, models)
    client = Client(spec_url, dialect=dialect, timeout=600, concurrency=1)
    base = (Client(base_url, dialect=dialect_for(engine, None, models), timeout=600,
                   concurrency=1) if base_url else None)
    draft = export.draft_of(method)
    # a trained head drafts from the target's own features: its rounds are replayed with it
    head = (heads.trained_head(method.drafter, models)
            if isinstance(method.drafter, HeadDraft) else None)
    replayed = (draft is not None or head is not None) and engine.schedule is not None
    # an engine that keeps no counters (transformers serve) cannot have (b) judged: said in the
    # record and the printed outcome, never passed in silence
    unjudged = (dialect.counters_missing(client)
                if draft is not None or head is not None else None)
    ref = pair(draft, models)
    tol = LOGIT_TOLERANCE
    requests, failures = [], []
    for i, prompt in enumerate(prompts(n_prompts, models)):
        req = Request(prompt, max_tokens)
        entry = {"prompt": i, "prompt_tokens": len(prompt)}
        try:
            counted = dialect.count(client, [req])
            (served,), = counted.answers if counted is not None else client.complete_many([req])
            base_tokens = base.complete(req)[0].tokens if base is not None else None
        except ServedError as exc:
            failures.append(f"prompt {i}: a request failed: {exc}")
            requests.append(entry)
            continue
        tokens = read = list(served.tokens)
        entry.update(tokens=tokens, engine_drafted=None if counted is None else counted.drafted,
                     engine_accepted=None if counted is None else counted.accepted)
        # a text-only engine's ids are its text re-encoded in the tokenizer's own segmentation,
        # which need not be how the model split it (")" then "))" re-encodes as "))" then ")"):
        # where its text is the float64 target's greedy text, the target's ids are judged
        if hasattr(dialect, "same_text") and (len(tokens) != max_tokens or greedy_divergence(
                prompt, tokens, tol, ref.logits) is not None):
            path = ref.greedy(ref.target, prompt, max_tokens)[0]
            if dialect.same_text(tokens, path):
                entry["resegmented_at"] = next(
                    (j for j, (a, b) in enumerate(zip(tokens, path)) if a != b),
                    min(len(tokens), len(path)))
                entry["judged_tokens"] = tokens = path
        # (a) greedy, tie-aware, against the float64 target and the baseline
        if len(tokens) != max_tokens:
            failures.append(f"prompt {i}: {len(tokens)} tokens for max_tokens={max_tokens} "
                            f"(finish_reason {served.finish_reason!r})")
        bad = greedy_divergence(prompt, tokens, tol, ref.logits)
        if bad is not None:
            at, token, best, gap = bad
            failures.append(f"prompt {i}: greedy: position {at}: served token {token}, the "
                            f"float64 target's argmax there is {best}, {gap:.4g} logits higher "
                            f"(ties are gaps <= {tol:g})")
        entry["ties"] = [j for j, row in enumerate(ref.logits(prompt, tokens))
                         if int(row.argmax()) != tokens[j]] if bad is None else None
        # the baseline's ids are read as the engine's were: compared as read
        if base_tokens is not None and list(base_tokens) != read:
            j = next((j for j, (a, b) in enumerate(zip(read, base_tokens)) if a != b),
                     min(len(read), len(base_tokens)))
            row = ref.logits(prompt, read[:j] + [0])[-1]
            a = read[j] if j < len(read) else None
            b = base_tokens[j] if j < len(base_tokens) else None
            if a is None or b is None or abs(float(row[a] - row[b])) > tol:
                failures.append(f"prompt {i}: greedy: differs from the baseline at position "
                                f"{j}, which is no tie (served {a}, baseline {b})")
        # (b) the engine's counts against the exact replay of the same request's rounds
        if replayed and bad is None and len(tokens) <= max_tokens:
            r = replay(ref, prompt, tokens, max_tokens, method.k, engine.schedule, served.pieces,
                       head, engine.dialect.eos_stops_acceptance)
            e = r.expected
            entry.update(exact_drafted=e.drafted, exact_accepted=e.accepted,
                         exact_rounds=e.drafts, target_calls=r.target_calls,
                         draft_ties=r.draft_ties, pieces=list(served.pieces))
            if counted is None:
                failures.append(f"prompt {i}: the engine reports no speculation counters")
            elif (counted.drafted, counted.accepted) != (e.drafted, e.accepted):
                failures.append(
                    f"prompt {i}: acceptance: the engine counts {counted.drafted:g} drafted, "
                    f"{counted.accepted:g} accepted; the exact replay ({engine.schedule} "
                    f"schedule, k={method.k}) gives {e.drafted} drafted, {e.accepted} accepted "
                    f"in {e.drafts} rounds" + (f" ({r.draft_ties} draft proposals within "
                                               f"{tol:g} of a tie)" if r.draft_ties else ""))
        requests.append(entry)
        say(f"[kit] trained prompt {i}: {len(tokens)} tokens; engine "
            f"{entry.get('engine_drafted')} drafted / {entry.get('engine_accepted')} accepted"
            + (f"; exact {entry['exact_drafted']} / {entry['exact_accepted']}"
               if "exact_drafted" in entry else ""))
    return {"requests": requests, "failures": failures, "max_tokens": max_tokens,
            "k": method.k, "schedule": engine.schedule,
            "draft": draft if head is None else method.drafter.head,
            "replayed": replayed, "tolerance": tol, "acceptance_unjudged": unjudged,
            **totals(requests, replayed)}


def dialect_for(engine, method, models: str = "trained"):
    """The dialect of requests to `engine`'s server of `method` (None: the baseline) on the
    pair `models` names (Dialect.for_pair: a text-only dialect reads its texts through the
    pair's tokenizer, the others are themselves)."""
    return engine.dialect_for(method).for_pair(models)


def totals(requests: list, replayed: bool) -> dict:
    def total(key):
        values = [r.get(key) for r in requests]
        return None if not values or any(v is None for v in values) else sum(values)
    out = {"engine_drafted": total("engine_drafted"), "engine_accepted": total("engine_accepted"),
           "tokens": sum(len(r.get("tokens") or ()) for r in requests)}
    if replayed:
        out.update(exact_drafted=total("exact_drafted"), exact_accepted=total("exact_accepted"),
                   exact_rounds=total("exact_rounds"), target_calls=total("target_calls"))
        if out["target_calls"]:
            out["tokens_per_target_call"] = out["tokens"] / out["target_calls"]
    for who in ("engine", "exact"):
        d, a = out.get(f"{who}_drafted"), out.get(f"{who}_accepted")
        if d:
            out[f"{who}_acceptance"] = a / d
    return out


def describe(record: dict) -> list[str]:
    """The run's lines about the trained pair, for its printed outcome."""
    t = record.get("trained") or {}
    if not t:
        return []
    models = record.get("models") or "trained"
    lines = [f"{models} pair: {len(t['requests'])} greedy requests of {t['max_tokens']} tokens "
             f"on held-out prompts, k={t['k']}, draft {t['draft']}"]
    if t.get("engine_drafted") is not None:
        lines.append(f"acceptance (engine counters): {t['engine_accepted']:g} of "
                     f"{t['engine_drafted']:g} drafted tokens accepted"
                     + (f" ({t['engine_acceptance']:.3f})" if t.get("engine_acceptance") else ""))
    if t.get("replayed") and t.get("exact_drafted") is not None:
        lines.append(f"acceptance (exact replay, {t['schedule']} schedule): {t['exact_accepted']}"
                     f" of {t['exact_drafted']} in {t['exact_rounds']} rounds"
                     + (f" ({t['exact_acceptance']:.3f})" if t.get("exact_acceptance") else "")
                     + (f"; tokens per target call {t['tokens_per_target_call']:.2f}"
                        if t.get("tokens_per_target_call") else ""))
    resegmented = [r for r in t["requests"] if "resegmented_at" in r]
    if resegmented:
        lines.append(f"{len(resegmented)} request(s) judged by their text, which is the float64 "
                     f"target's greedy text: re-encoded it splits otherwise (prompt "
                     + ", ".join(f"{r['prompt']} from position {r['resegmented_at']}"
                                 for r in resegmented) + ")")
    if t.get("acceptance_unjudged"):
        lines.append(f"acceptance NOT JUDGED (the counts against the exact replay): "
                     f"{t['acceptance_unjudged']}")
    for failure in t["failures"]:
        lines.append(f"FAILED: {failure}")
    return lines
