"""The kit's property families: the one place where a family is declared.

A family is a group of properties with one verdict line in the conformance summary. Each test
module of the kit belongs to exactly one family and says so once, at module level:

    pytestmark = pytest.mark.family("greedy")

The conftest reads that marker: the family's level decides applicability (an implementation
without the level's functions skips the module's tests as not applicable, without drawing
examples), and the family's entry here gives the summary its description and stated power.
A test that needs more than its family's level (a model kind, a keyword such as top_p) says so
with ``@pytest.mark.needs(kind=..., keywords=(...), greedy=True)`` (greedy: skipped for an
implementation that declares greedy decoding not applicable); a parametrized ``kind`` is read from the
test's parameters. The check functions themselves live in ``properties/checks/<family>.py``,
importable by ``tests/`` and by the replay tool without importing a test module.
"""

from __future__ import annotations

from dataclasses import dataclass

from properties import statistics


@dataclass(frozen=True)
class Family:
    name: str
    level: str            # the implementation level it needs (properties.impl.LEVELS)
    checks: str           # one line: what it holds the implementation to
    power: str | None = None   # statistical families: the deviation detected with POWER


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("rule", "rule",
           "accept_or_correct commits a token distributed exactly as p",
           f"TV >= {statistics.DELTA_RULE} in the committed token's law "
           f"({statistics.DELTA_RULE_THOROUGH} in the thorough profile)"),
    Family("greedy", "engine",
           "at temperature 0 the output is exactly the target's greedy output"),
    Family("sequence", "engine",
           "under sampling the first L tokens are distributed exactly as the target's",
           f"TV >= {statistics.DELTA_SEQUENCE} (table models) / "
           f"{statistics.DELTA_SEQUENCE_QWEN3} (qwen3) in the joint law of the outputs"),
    Family("cache", "engine",
           "no model call ever sees a context other than the committed sequence"),
    Family("perfect_draft", "engine",
           "with draft = target every proposal is accepted"),
    Family("bounds", "engine",
           "max_new_tokens, stop ids and the stats"),
    Family("sampler", "engine",
           "the engine's own sampler (target_generate, when exposed) follows the convention",
           f"TV >= {statistics.DELTA_SEQUENCE} (table) / {statistics.DELTA_SEQUENCE_QWEN3} "
           f"(qwen3) in the law of its outputs"),
    Family("batched", "batched",
           "every row of a ragged batch is exact, greedy and sampled",
           f"TV >= {statistics.DELTA_BATCHED} in each prompt's sampled rows, "
           f"{statistics.DELTA_BATCHED_JOINT} in the law of a pair of rows (independence)"),
    Family("tree", "tree",
           "tree verification: greedy == target greedy, sampled law exact, caches, bounds",
           f"TV >= {statistics.DELTA_TREE} in the joint law of the sampled outputs "
           f"({statistics.DELTA_TREE_THOROUGH} in the thorough profile)"),
    # served engines (--impl=openai:URL, properties/serve): one family per property
    Family("served_greedy", "served",
           "a served engine's greedy output is the target's, and the unspeculated server's"),
    Family("served_sequence", "served",
           "a served engine samples the first L tokens exactly as the target; seed honoured",
           "TV >= 0.15 in the joint law of the outputs"),
    Family("served_bounds", "served",
           "a served engine's max_tokens, stop ids (inside accepted blocks) and support"),
    Family("served_perfect_draft", "served",
           "a served engine with the target as its draft accepts every proposal"),
    Family("served_batch", "served",
           "a request answered inside a concurrent batch is answered as alone: greedy equal, "
           "sampled rows independent, seeds kept",
           "TV >= 0.2 in the joint law of a pair of concurrent outputs"),
    Family("served_params", "served",
           "penalties, min_p, logit_bias, stop strings, n and logprobs under speculation as "
           "without it"),
    Family("served_acceptance", "served",
           "under sampling the engine's accepted/drafted counts match the exact "
           "expectation sum min(p, q)"),
    Family("served_trained", "served",
           "on a trained pair (--models trained, trained-large): greedy output equal to the "
           "float64 target's and the baseline's, drafted and accepted counts equal to the "
           "exact replay of each request's rounds"),
)}

# the families a served engine is judged by on the kit's own models, and on a trained pair
# (whose 2,048-token laws the kit does not enumerate: greedy and counters only)
SERVED = tuple(name for name, f in FAMILIES.items()
               if f.level == "served" and name != "served_trained")
SERVED_TRAINED = ("served_trained",)

LEVEL_ORDER = ("rule", "engine", "batched", "tree", "served")


def get(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown kit family {name!r}; the families are {sorted(FAMILIES)}") from None
