"""The server's speculative-decoding acceptance counters, from its Prometheus /metrics page.

vLLM exports ``vllm:spec_decode_num_draft_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_total`` (vLLM docs, speculative decoding metrics);
each may appear once per label set (engine, model), and the kit adds them up. The counters are
server-wide and cumulative, so a check reads them before and after its own requests and uses
the difference (nothing else may be sent to the server meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass

from properties.adapters.client import BadResponse

DRAFTED = ("vllm:spec_decode_num_draft_tokens_total",)
ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
PATH = "/metrics"


@dataclass(frozen=True)
class Counters:
    drafted: float
    accepted: float


def parse(text: str, names) -> float | None:
    """The sum of every sample of the named counters in Prometheus text format; None when the
    page has none of them."""
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[-1])
            except ValueError:
                raise BadResponse(f"/metrics: cannot read the value of {line[:200]!r}") from None
            seen = True
    return total if seen else None


def acceptance_counters(client) -> Counters:
    """The server's counters now; BadResponse when it exports none."""
    text = client.get_root_text(PATH)
    drafted, accepted = parse(text, DRAFTED), parse(text, ACCEPTED)
    if drafted is None or accepted is None:
        raise BadResponse(f"{client.url}: {PATH} has no speculative-decoding counters "
                          f"({DRAFTED[0]}, {ACCEPTED[0]})")
    return Counters(drafted, accepted)


def available(client) -> bool:
    try:
        acceptance_counters(client)
    except Exception:
        return False
    return True
