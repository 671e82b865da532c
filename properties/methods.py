"""A speculative method is one object: everything the kit's checks, oracles, evidence, export
and report need to know about how an engine speculates.

    Method      an engine's way of speculating: its name (the engine's word for it), what
                drafts (a Drafter), how many tokens it may draft per round (k), its proposal
                convention and verification rule
    Drafter     what proposes: a draft model the kit also holds (its next-logits are known, so
                greedy counters and the acceptance law are replayed exactly), a lookup over the
                context (n-gram, prompt lookup: the kit replays whether it proposes), a lookup
                whose engine keeps state beside the context (StatefulLookup: only the engine's
                own counts say whether it proposed), or nothing the kit knows

An engine's file declares its methods with these objects (`Method("ngram", ..., LOOKUP)`);
no other module interprets a draft kind: a check asks the object (`drafter.model`,
`drafter.replays`, `drafter.perfect`, `drafter.proposes(...)`, `drafter.cover(case)`).
Adding a method is one object here or in an engine's file; adding a kind of drafter is one
class here.
"""

from __future__ import annotations

from dataclasses import dataclass

# how a proposal is drawn from the draft's law (properties/acceptance_sampled.py):
#   "greedy"   the draft's argmax, verified as one-hot q (vLLM's default draft_sample_method)
#   "sampled"  drawn from q, the draft's processed law (the textbook rule)
PROPOSALS = ("greedy", "sampled")
# how a round's proposals are verified against the target: token by token, each accepted with
# min(1, p/q) and the first rejection resampled from the normalized residual; or as one block
# (Sun et al. 2024; reference/block.py, its law in properties/acceptance_sampled.py)
VERIFICATIONS = ("token-wise", "block")


@dataclass(frozen=True)
class ModelDraft:
    """A stand-alone draft language model whose weights the kit holds (an export of its own,
    or the target itself): it proposes in every round, and the kit replays its greedy
    counters and the exact law of its accepted count from `model`'s next logits."""

    model: str            # the served model it is: a name of models/served.MODELS, or of a
                          # trained pair (properties/export/trained.py); "target": a perfect draft
    trained_only: bool = False   # only a trained pair has it (--models trained, trained-large)

    replays = True        # the kit computes what it proposes
    lookup = False

    @property
    def perfect(self) -> bool:
        """The target drafts for itself: every proposal must be accepted."""
        return self.model == "target"

    @property
    def export(self) -> str:
        """The directory (of an export) the engine loads the draft from."""
        return self.model

    def proposes(self, prompt, tokens) -> bool:
        """Whether some judged position (1 .. len(tokens) - 1) was drafted: a draft model
        proposes in every round, so in every request of two or more tokens."""
        return len(tokens) >= 2

    def cover(self, case):
        return case

    def describe(self) -> str:
        return "the target itself" if self.perfect else f"draft model {self.model}"


@dataclass(frozen=True)
class Lookup:
    """A drafter that only looks up the context (n-gram, prompt lookup): it proposes where the
    context's last `min_n` .. `max_n` tokens occurred before, what followed them. Nothing of
    its proposals is a model's law, so acceptance is not replayed; whether it proposed at a
    judged position is."""

    min_n: int = 1
    max_n: int = 3

    model = None
    replays = False
    lookup = True
    perfect = False
    trained_only = False
    export = None

    def proposes(self, prompt, tokens) -> bool:
        context = tuple(prompt)
        return any(lookup_proposes(context + tuple(tokens[:i]), self.min_n, self.max_n)
                   for i in range(1, len(tokens)))

    def cover(self, case):
        """The case as a lookup can speculate it: the prompt prefixed with COVER, which holds
        every token of the served vocabulary after its first position (llama.cpp never matches
        at position 0), so that whatever token is sampled a lookup of one token matches and
        proposes what followed it: every judged position after the first is speculated, and
        proposals are both accepted and rejected."""
        if set(case.prompt) >= set(COVER):
            return case
        return case.replace(prompt=COVER + tuple(case.prompt))

    def describe(self) -> str:
        return f"lookup of {self.min_n}-{self.max_n} tokens in the context"


@dataclass(frozen=True)
class StatefulLookup:
    """A drafter that drafts from the context by a rule the kit does not replay: which earlier
    occurrence it copies, how many tokens, and whether it drafts at all depend on state the
    engine keeps beside the context (a map per server slot that outlives requests, a hash pool
    shared by every request, n-gram statistics with thresholds, the count accepted last time).
    So `proposes` says None: whether a judged position was speculated comes only from the
    engine's own per-response draft counts (speculation.send), never from a replay. Like a
    `Lookup` it gets the covering prompt (COVER, `repeats` times: a drafter that needs a token
    seen twice before it proposes gets every token twice), and like one its proposals are no
    model's law, so the counters and the acceptance law are not replayed."""

    rule: str                 # what it proposes, in words, with the engine's source
    state: str                # what it keeps beyond the request's context
    repeats: int = 1          # copies of COVER in front of the prompt

    model = None
    replays = False
    lookup = True             # it drafts from the context: the kit's prompts must repeat
    perfect = False
    trained_only = False
    export = None

    def __post_init__(self):
        if not isinstance(self.repeats, int) or isinstance(self.repeats, bool) or self.repeats < 1:
            raise ValueError(f"StatefulLookup: repeats={self.repeats!r}, must be an int >= 1")

    def proposes(self, prompt, tokens) -> None:
        """Not replayed: the engine's state decides (the class's docstring)."""
        return None

    def cover(self, case):
        """The case behind `repeats` copies of COVER (Lookup.cover's prompt, repeated)."""
        prefix = COVER * self.repeats
        if tuple(case.prompt[:len(prefix)]) == prefix:
            return case
        return case.replace(prompt=prefix + tuple(case.prompt))

    def describe(self) -> str:
        return f"{self.rule} (not replayed: {self.state})"


@dataclass(frozen=True)
class Unknown:
    """A drafter the kit was not told of (a server checked by URL alone), or none (the
    baseline): nothing about its proposals is replayed."""

    what: str = "unknown"     # "unknown" or "none"

    model = None
    replays = False
    lookup = False
    perfect = False
    trained_only = False
    export = None

    def proposes(self, prompt, tokens) -> bool | None:
        return None

    def cover(self, case):
        return case

    def describe(self) -> str:
        return "no draft" if self.what == "none" else "a drafter the kit was not told of"


@dataclass(frozen=True)
class Scripted:
    """Drafts the kit scripts from the served target (properties/scripted.py: right, wrong,
    right-then-wrong), handed to an engine that takes caller-supplied drafts (vLLM's
    custom_class proposer): a next-token function of the sequence like a draft model's, so
    greedy counters and the acceptance law are replayed exactly: the drafter answers the
    replays itself (`greedy_round`, `round_logits`: one-hot logits at the scripted token)."""

    script: str

    replays = True
    model = None              # no served model: the script is computed from the target
    lookup = False
    perfect = False
    trained_only = False
    export = None

    def __post_init__(self):
        from properties import scripted
        if self.script not in scripted.SCRIPTS:
            raise ValueError(f"Scripted: script={self.script!r}, choose from {scripted.SCRIPTS}")

    def greedy_round(self, context, n: int) -> tuple:
        """The script's n proposals after `context` (properties/acceptance.py's replay)."""
        from properties import scripted
        return tuple(scripted.propose(self.script, context, n))

    def round_logits(self, context, prefix):
        """The script's one-hot logits [V] after context + prefix (a script is a function of
        the whole sequence: where the round started does not matter)."""
        from properties import scripted
        return scripted.next_logits([tuple(context) + tuple(prefix)], self.script)[0]

    def proposes(self, prompt, tokens) -> bool:
        """A script proposes in every round, as a draft model does."""
        return len(tokens) >= 2

    def cover(self, case):
        return case

    def describe(self) -> str:
        return f"scripted drafts ({self.script}, from the target's greedy tokens)"


@dataclass(frozen=True)
class HeadDraft:
    """A feature-level head (reference/heads/: EAGLE, EAGLE-3, Medusa, MTP, DFlash) that drafts
    from the target's own hidden states, so it proposes in every round. Which hidden states feed it
    is the engine's convention (`hidden`, a reference.hidden.HiddenStates; None: the engine's
    default for the head), declared in the engine's file. Its proposals are a function of the
    target's hidden states and of where the round started (a chained head's verified features
    end there), not of a model's next logits alone: the drafter answers the exact replays
    itself (`greedy_round`, `round_logits`, from the served head of properties/models/heads.py,
    which properties/export/heads.py writes for the engine). `replays` is True only where the
    engine's own counters were measured equal to that replay (its file says with what numbers);
    otherwise neither the greedy counters nor the acceptance law are replayed."""

    kind: str                 # "eagle", "eagle3", "medusa", "mtp", "dflash", "dspark"
    head: str                 # the export name of the head (the folder an engine loads it from)
    hidden: object = None     # reference.hidden.HiddenStates, or None: the engine's default
    trained_only: bool = False   # only a trained target has a trained head
    replays: bool = False     # the kit replays the engine's rounds with this head exactly
    # the head's constructor options beyond the hidden states, as (name, value) pairs: an
    # engine's convention for its kind (an MTP layer's order, recycle and lead pair)
    options: tuple = ()
    # EAGLE-3's decoder layer: Qwen3's (per-head q/k norm, vLLM's Eagle3Qwen3ForCausalLM) or,
    # False, a Llama layer (EAGLE-3's own LlamaForCausalLMEagle3, all llama.cpp computes)
    qk_norm: bool = True
    # the served target the head is made for: "target" (the kit's), or a deeper variant of it
    # (properties/models/served.py VARIANTS), which the method's run then serves as its target
    # and its baseline (an engine that reads more layers than the served target has)
    target: str = "target"

    model = None              # no stand-alone draft model: the head needs the target's states
    lookup = False
    perfect = False

    def __post_init__(self):
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"HeadDraft: kind={self.kind!r}, choose from {HEAD_KINDS}")
        if not isinstance(self.head, str) or not self.head:
            raise ValueError(f"HeadDraft: head={self.head!r}, must be the head's export name")
        from reference.hidden import HiddenStates
        if self.hidden is not None and not isinstance(self.hidden, HiddenStates):
            raise ValueError(f"HeadDraft: hidden={self.hidden!r}, must be a "
                             f"reference.hidden.HiddenStates or None (the engine's default)")
        if not isinstance(self.replays, bool):
            raise ValueError(f"HeadDraft: replays={self.replays!r}, must be a bool")
        if (not isinstance(self.options, tuple)
                or not all(isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str)
                           for o in self.options)):
            raise ValueError(f"HeadDraft: options={self.options!r}, must be a tuple of (name, "
                             f"value) pairs, e.g. (('recycle', 'normed'),)")
        if not isinstance(self.qk_norm, bool) or (not self.qk_norm and self.kind != "eagle3"):
            raise ValueError(f"HeadDraft: qk_norm={self.qk_norm!r}, must be a bool, and False "
                             f"only for an eagle3 head (kind {self.kind!r})")
        from properties.models.served import VARIANTS
        if self.target != "target" and (self.target not in VARIANTS or self.trained_only):
            raise ValueError(f"HeadDraft: target={self.target!r}, must be \"target\" or a "
                             f"variant of the served target, {sorted(VARIANTS)} (not for a "
                             f"trained pair's head)")

    @property
    def export(self) -> str:
        """The directory (of an export) the engine loads the head from."""
        return self.head

    def greedy_round(self, context, n: int) -> tuple:
        """The served head's argmax proposals (at most n) in a round whose newest token is
        context[-1]: what properties/acceptance.py replays greedy rounds with."""
        from properties.models import heads
        return heads.round_proposals(self, tuple(int(t) for t in context), n)

    def round_logits(self, context, prefix):
        """The served head's logits [V] for the proposal after `prefix` in a round whose newest
        token is context[-1]: what properties/acceptance_sampled.py walks a round's tree with."""
        from properties.models import heads
        return heads.round_logits(self, context, prefix)

    def proposes(self, prompt, tokens) -> bool:
        """A head drafts in every round (from the latest verified hidden state), so in every
        request of two or more tokens, as a draft model does."""
        return len(tokens) >= 2

    def cover(self, case):
        return case

    def describe(self) -> str:
        reads = ("the engine's default hidden states" if self.hidden is None
                 else f"the target's {self.hidden.describe()}")
        on = "" if self.target == "target" else f" (served target: {self.target})"
        return f"{HEAD_KINDS[self.kind]} head {self.head} reading {reads}{on}"


def exact_draft(drafter):
    """What the exact replays (properties/acceptance.py, acceptance_sampled.py) take as the
    draft: a draft model's name, or a head or a script itself (it computes its own rounds)."""
    return drafter if isinstance(drafter, (HeadDraft, Scripted)) else drafter.model


# the heads' kinds, and their names in the papers
HEAD_KINDS = {"eagle": "EAGLE", "eagle3": "EAGLE-3", "medusa": "Medusa", "mtp": "MTP",
              "dflash": "DFlash", "dspark": "DSpark"}

Drafter = ModelDraft | Lookup | StatefulLookup | Unknown | Scripted | HeadDraft

PERFECT = ModelDraft("target")
EARLY_EXIT = ModelDraft("draft-early-exit")
RANDOM = ModelDraft("draft-random")
SMALL = ModelDraft("draft-small", trained_only=True)
# Method.pairs of a draft both trained pairs have (the small draft, the early exit)
BOTH_PAIRS = ("trained", "trained-large")
LOOKUP = Lookup()
UNKNOWN = Unknown()
NONE = Unknown("none")


@dataclass(frozen=True)
class Method:
    """One speculative method of an engine."""

    name: str                 # the engine's name for it (the launcher's METHOD argument)
    description: str
    drafter: Drafter
    k: int = 4                # tokens drafted per round, at most
    # the proposal convention, where the method fixes it; None: the engine's dialect declares
    # it (Dialect.draft_proposals), else the acceptance check tries both
    proposals: str | None = None
    verification: str = "token-wise"
    # a mode the engine itself names as lossy (its own words): judged NOT CONFORMANT, and the
    # verdict says the engine named it so when its failures come
    lossy: str | None = None
    # where the engine's build refuses the method on this kind of machine (a CPU): its own
    # message, and where it runs instead. `make engines` leaves it out (still listed); the
    # launcher still starts it when asked, so the refusal is re-checked on every new version
    refused: str | None = None
    # the trained pairs (reference/pretrained.py PAIR_DIRS) `make engines` also runs it on, with
    # `--models PAIR`: greedy on held-out text, the counts against the exact replay and the
    # speed-up where speculation pays (the kit's 32-token models show none). A drafter only a
    # trained pair has (the small draft, a trained head) names the pairs it belongs to here.
    pairs: tuple = ()

    def __post_init__(self):
        if not isinstance(self.drafter, (ModelDraft, Lookup, StatefulLookup, Unknown, Scripted,
                                         HeadDraft)):
            raise TypeError(f"Method {self.name!r}: drafter={self.drafter!r} is not a Drafter "
                            f"(properties.methods: ModelDraft, Lookup, StatefulLookup, Unknown, Scripted; e.g. PERFECT)")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"Method {self.name!r}: k={self.k!r}, must be an int >= 1")
        if self.proposals is not None and self.proposals not in PROPOSALS:
            raise ValueError(f"Method {self.name!r}: proposals={self.proposals!r}, choose from "
                             f"{PROPOSALS}")
        if self.verification not in VERIFICATIONS:
            raise ValueError(f"Method {self.name!r}: verification={self.verification!r}, "
                             f"choose from {VERIFICATIONS}")
        from reference.pretrained import PAIR_DIRS as PAIRS
        if not isinstance(self.pairs, tuple) or any(p not in PAIRS for p in self.pairs):
            raise ValueError(f"Method {self.name!r}: pairs={self.pairs!r}, must be a tuple of "
                             f"{tuple(PAIRS)}")
        if self.drafter.trained_only and not self.pairs:
            raise ValueError(f"Method {self.name!r}: its drafter only a trained pair has, so "
                             f"pairs=() must name the pairs it runs on, e.g. ('trained',)")


# --served-draft=NAME, for a server checked by URL (the launcher hands its Method instead)
DRAFTERS = {"unknown": UNKNOWN, "perfect": PERFECT, "draft-early-exit": EARLY_EXIT,
            "draft-random": RANDOM, "ngram": LOOKUP, "none": NONE}


def option_of(drafter) -> str:
    """The --served-draft name of a drafter ("unknown" where it has none)."""
    return next((name for name, d in DRAFTERS.items() if d == drafter), "unknown")


def by_option(draft: str, k: int = 4) -> Method:
    """The method of a server described on the command line (--served-draft, --served-k)."""
    if draft not in DRAFTERS:
        raise ValueError(f"--served-draft={draft}: choose from {', '.join(DRAFTERS)}")
    return Method(draft, f"--served-draft={draft}", DRAFTERS[draft], k)


# every token of the served models' 32-token vocabulary, in a fixed order that no two-token
# pattern repeats in, after a first token that lookups skip
COVER = (0,) + tuple((7 * i + 3) % 32 for i in range(32))


def lookup_proposes(context, min_n: int = 1, max_n: int = 3) -> bool:
    """Whether prompt lookup proposes after `context`: some suffix of `min_n` .. `max_n`
    tokens occurs earlier in it with a token after the occurrence (the proposal)."""
    ctx = tuple(context)
    for n in range(min(max_n, len(ctx) - 1), min_n - 1, -1):
        tail = ctx[-n:]
        if any(ctx[i:i + n] == tail for i in range(len(ctx) - n)):
            return True
    return False
