"""Reading a `Trace`: the rounds an engine ran and whether its caches kept the invariant.

The chapter's invariant: at the top of every round both caches hold exactly the committed
sequence except its newest token. The kit checks it from the outside, so it has to say what a
round is without the engine's help:

* the committed sequence is ``c = prompt + output``;
* a *verify call* is a target call that feeds a position at or past ``len(prompt)`` (a prefill
  only feeds positions before the last prompt token); verify call r opens round r's check;
* the round's base is ``b_1 = len(prompt) - 1`` and ``b_{r+1} = b_r + a_r + 1``, where ``a_r``
  is the number of round r's proposals (the tokens the target was fed after the newest one)
  that the committed sequence kept;
* at verify call r the target cache must hold exactly ``c[:b_r]`` and the first token fed must
  be the newest committed token ``c[b_r]``;
* the draft must, by the call in which it is fed position ``b_r`` (the newest token), hold
  exactly ``c[:b_r]`` before it; the positions it writes after that in the same round must be
  the proposals the target verified. (An engine may catch the draft up lazily, feeding a
  missing accepted token together with the newest one.)

Each cache's content at any moment is rebuilt from the recorded calls and truncates, so a
violation names the round, the cache, the position, the token held and the token committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from properties.models import Trace


@dataclass(frozen=True)
class Round:
    number: int
    base: int                # position of the newest committed token when the round began
    fed: tuple               # tokens the target was fed: newest committed + proposals
    accepted: int            # proposals kept by the committed sequence (lower bound at the end)
    truncated_by_end: bool   # the output ended inside this round's block


@dataclass
class Analysis:
    rounds: list
    problem: str | None
    chain: bool              # False when the engine used masks/positions (tree verification)


def _first_difference(held, want):
    for i, (a, b) in enumerate(zip(held, want)):
        if a != b:
            return i
    return min(len(held), len(want))


def analyse(trace: Trace, prompt, output) -> Analysis:
    c = [int(t) for t in prompt] + [int(t) for t in output]
    P = len(prompt)
    if any(e.masked for e in trace.calls()):
        return Analysis([], trace.violations[0] if trace.violations else None, chain=False)
    content: dict[int, list] = {}
    rounds: list[Round] = []
    problem = trace.violations[0] if trace.violations else None
    expected_base = P - 1
    round_drafts: list = []   # (event, content of the cache after the call) since last verify

    def fail(text, event):
        return f"{text}\n  the engine's calls up to that point (most recent last):\n{trace.tail(event.index)}"

    for e in trace.events:
        if e.what == "new_cache":
            content[e.cache] = []
            continue
        held = content.setdefault(e.cache, [])
        if e.what == "truncate":
            content[e.cache] = held[: e.end]
            continue
        if e.role == "target" and e.start + len(e.tokens) > P and problem is None:
            r = len(rounds) + 1
            s = e.start
            if s != expected_base:
                if s < expected_base:
                    why = (f"it is {expected_base - s} short: committed tokens were rolled back "
                           f"or never fed")
                else:
                    why = (f"it holds {s - expected_base} extra entries: rolled-back tokens "
                           f"(rejected proposals) are still in it")
                i = _first_difference(held, c[:expected_base])
                detail = ""
                if i < min(len(held), expected_base):
                    detail = (f"; from position {i} on it holds {held[i:i + 6]} where the "
                              f"committed sequence has {c[i:i + 6]}")
                problem = fail(
                    f"round {r}: at the target's verify call its cache held {s} entries, but the "
                    f"committed sequence had {expected_base + 1} tokens, so it should hold "
                    f"{expected_base} (all but the newest); {why}{detail}", e)
            elif held[:s] != c[:s]:
                i = _first_difference(held, c)
                problem = fail(
                    f"round {r}: the target cache stopped holding a prefix of the committed "
                    f"sequence at position {i}: it holds token {held[i]}, the committed token is "
                    f"{c[i] if i < len(c) else '(none: past the output)'}", e)
            elif s >= len(c) or e.tokens[0] != c[s]:
                problem = fail(
                    f"round {r}: the target was fed token {e.tokens[0]} at position {s} as the "
                    f"newest committed token, but the committed token there is "
                    f"{c[s] if s < len(c) else '(none: past the output)'}", e)
            if problem is None:
                problem = _check_draft(r, s, c, e, round_drafts, fail)
            proposals = list(e.tokens[1:])
            kept = 0
            while kept < len(proposals) and s + 1 + kept < len(c) and proposals[kept] == c[s + 1 + kept]:
                kept += 1
            rounds.append(Round(r, s, tuple(e.tokens), kept,
                                truncated_by_end=s + 1 + kept >= len(c)))
            expected_base = s + kept + 1
            round_drafts = []
        content[e.cache] = held[: e.start] + list(e.tokens)
        if e.role == "draft":
            round_drafts.append((e, content[e.cache]))
    if problem is None and rounds and expected_base < len(c) - 1:
        last = rounds[-1]
        problem = (f"the output has tokens at positions {expected_base + 1}..{len(c) - 1} that no "
                   f"round's target call verified (the last round began at position {last.base} "
                   f"and kept {last.accepted} proposals)")
    if problem is None and not rounds and len(output) > 0 and trace.used_caches():
        problem = "the engine produced output without any target call verifying it"
    return Analysis(rounds, problem, chain=True)


def _check_draft(r, b, c, verify, round_drafts, fail):
    """The draft's side of round r (see the module docstring)."""
    if not round_drafts:
        return None  # engines that draft without a model call (none in the chapter's API)
    covering = [(e, after) for e, after in round_drafts if e.start <= b < e.start + len(e.tokens)]
    if not covering:
        e, after = round_drafts[-1]
        return fail(
            f"round {r}: the draft was never fed position {b}, the newest committed token "
            f"{c[b]}, before the target verified (its calls this round wrote positions "
            f"{', '.join(f'{d.start}..{d.start + len(d.tokens) - 1}' for d, _ in round_drafts)}); "
            f"its cache should have held the {b} committed tokens before it", verify)
    e, after = covering[0]
    if after[: b + 1] != c[: b + 1]:
        i = _first_difference(after, c[: b + 1])
        what = f"position {i} holds token {after[i]}, the committed token is {c[i]}"
        return fail(
            f"round {r}: when the draft was fed the newest committed token (position {b}) its "
            f"cache did not hold exactly the committed sequence before it: {what}", e)
    proposals = list(verify.tokens[1:])
    for d, after in round_drafts[round_drafts.index(covering[0]):]:
        spec = after[b + 1:]
        if spec != proposals[: len(spec)]:
            i = _first_difference(spec, proposals)
            return fail(
                f"round {r}: the draft cache holds token {spec[i]} at position {b + 1 + i}, but "
                f"the proposal the target verified there is "
                f"{proposals[i] if i < len(proposals) else '(none)'}", d)
    return None
