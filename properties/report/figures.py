"""The report's pictures, drawn with matplotlib (Agg) as SVG.

SVG because a bar keeps an id in the file (``obs-3`` is the observed bar of cell 3), so a test
can read the drawn heights back, and text stays text (``svg.fonttype: none``), which keeps a
page of many pictures small. Every function takes records from properties.evidence and
returns the SVG as bytes.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")   # no display: the report is written on CI machines and xdist controllers

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Z99 = 2.5758           # two-sided 99% normal quantile: the intervals drawn
OBSERVED, EXACT, WORST, POOLED = "#3b6fb6", "#222222", "#d0342c", "#8fb3e0"
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "kit-report", "font.size": 9,
          "axes.spines.top": False, "axes.spines.right": False}


def _svg(fig: Figure) -> bytes:
    """Saved with the margins each picture set (a "tight" bounding box draws the figure twice,
    the larger part of a picture's cost)."""
    out = io.BytesIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()


def _short(label: str, width: int = 18) -> str:
    return label if len(label) <= width else label[:width - 1] + "…"


def distribution(record: dict) -> bytes:
    """Observed vs exact probability per (pooled) cell of one chi-square check. A failing
    check's cells that contribute most to the statistic are drawn in red; pooled cells are
    drawn lighter and labelled as pooled; outcomes the exact law forbids come last, at exact 0."""
    two = record["kind"] == "two_sample"
    cells = record["cells"]
    impossible = record.get("impossible", [])
    n = max(record["n_a"] if two else record["n"], 1)
    nb = max(record.get("n_b", 1), 1)
    count = len(cells) + len(impossible)
    with matplotlib.rc_context(_STYLE):
        fig = plt.figure(figsize=(min(max(6.5, 0.2 * count + 3.6), 16), 3.6))
        ax = fig.add_subplot()
        xs = range(len(cells))
        pooled = [c["members"] > 1 or bool(c.get("rest")) for c in cells]
        colours = [WORST if c["top"] and not record["passed"] else POOLED if pool else OBSERVED
                   for c, pool in zip(cells, pooled)]
        width = 0.4 if two else 0.8
        # one bar call for all cells (a call per bar costs more than the drawing itself)
        bars = ax.bar([i - (0.2 if two else 0) for i in xs], [c["observed"] / n for c in cells],
                      width, color=colours, edgecolor="white", linewidth=0.3)
        for i, (bar, pool) in enumerate(zip(bars, pooled)):
            bar.set_gid(f"obs-{i}")
            if pool:
                bar.set_hatch("//")
        if two:
            others = ax.bar([i + 0.2 for i in xs], [c["observed_b"] / nb for c in cells], 0.4,
                            color="#9a9a9a", edgecolor="white", linewidth=0.3)
            for i, bar in enumerate(others):
                bar.set_gid(f"obsb-{i}")
        exact = [cell["expected"] / n for cell in cells]
        spread = [Z99 * math.sqrt(max(p * (1 - p), 0.0) / n) for p in exact]
        ax.errorbar(list(xs), exact, yerr=spread, fmt="_", color=EXACT, markersize=12,
                    elinewidth=0.8, capsize=2,
                    label=("expected under one law (pooled samples), 99% band" if two else
                           "exact probability, 99% band at this n"))
        for j, cell in enumerate(impossible):
            bar = ax.bar(len(cells) + j, cell["observed"] / n, 0.8, color=WORST)[0]
            bar.set_gid(f"imp-{j}")
        # the cell that stands for the rest of a large outcome space can dwarf the others:
        # the axis is scaled to the cells shown one by one, and a taller bar says its value
        rest = [i for i, c in enumerate(cells) if c.get("rest")]
        single = [i for i in range(len(cells)) if i not in rest]
        if rest and single:
            top = max(max(cells[i]["observed"] / n, exact[i] + spread[i]) for i in single)
            top = max([top] + [c["observed"] / n for c in impossible]) * 1.25
            for i in rest:
                value = max(cells[i]["observed"] / n, exact[i])
                if value > top:
                    ax.annotate(f"{cells[i]['observed'] / n:.3f} (exact {exact[i]:.3f}) ↑",
                                (i, top * 0.97), ha="right", va="top", fontsize=7)
            ax.set_ylim(0, top)
        labels = [_short(c["label"]) for c in cells] + [_short(c["label"]) + " (p=0)"
                                                         for c in impossible]
        ax.set_xticks(range(count))
        ax.set_xticklabels(labels if count <= 40 else [str(i) for i in range(count)],
                           rotation=60 if count > 6 else 0, ha="right" if count > 6 else "center",
                           fontsize=7 if count > 12 else 8)
        ax.set_ylabel("probability")
        ax.set_xlim(-0.7, count - 0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=OBSERVED)]
        names = ["observed " + ("(speculative outputs)" if two else "frequency")]
        if any(pooled):
            handles.append(plt.Rectangle((0, 0), 1, 1, color=POOLED, hatch="//"))
            names.append("pooled cells (several outcomes)")
        if two:
            handles.append(plt.Rectangle((0, 0), 1, 1, color="#9a9a9a"))
            names.append("observed (the engine's own sampler)")
        if not record["passed"]:
            handles.append(plt.Rectangle((0, 0), 1, 1, color=WORST))
            names.append("largest contributions to the statistic" +
                         (", and outcomes of probability 0" if impossible else ""))
        ax.legend(handles + [ax.get_legend_handles_labels()[0][0]],
                  names + [ax.get_legend_handles_labels()[1][0]], fontsize=7, frameon=False,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the bars, never on them
        ax.set_title(title(record), fontsize=9, loc="left")
        # room for the rotated labels below and the legend on the right, in inches
        width, height = fig.get_size_inches()
        fig.subplots_adjust(left=0.7 / width, right=1 - 2.6 / width, top=1 - 0.35 / height,
                            bottom=(1.25 if count > 6 else 0.45) / height)
        return _svg(fig)


def title(record: dict) -> str:
    stat, p = record["statistic"], record["p_value"]
    exact = {"binomial": "exact binomial test", "fisher": "Fisher's exact test"}
    if record.get("test") in exact and p is not None:
        text = (f"{exact[record['test']]}, two groups, p = {p:.3g}, α = {record['alpha']:.0e}, "
                f"n = {record['n']:,}")
    else:
        text = (f"χ² = {stat:.2f} on {record['df']} df, p = {p:.3g}, α = {record['alpha']:.0e}, "
                f"n = {record['n']:,}" if stat is not None and p is not None else
                f"n = {record['n']:,}")
    plan = record.get("plan")
    if plan and record.get("power") is not None:
        text += f"; power {record['power']:.3f} at TV {plan['delta']:g}"
    return text + ("  PASSED" if record["passed"] else "  FAILED")


def acceptance(merged: dict) -> bytes:
    """Acceptance by draft position (measured, and the exact expectation with its 99%
    interval), and tokens per target call measured against its exact expectation."""
    positions = [p for p in merged["positions"] if p["reached"] > 0]
    with matplotlib.rc_context(_STYLE):
        fig, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.7),
                                          gridspec_kw={"width_ratios": [3, 1.2]})
        js = [i + 1 for i in range(len(positions))]
        exact = [p["exact"] / p["reached"] for p in positions]
        half = [Z99 * math.sqrt(max(p["var"], 0.0)) / p["reached"] for p in positions]
        measured = [p["accepted"] / p["reached"] for p in positions]
        left.fill_between(js, [max(0, e - h) for e, h in zip(exact, half)],
                          [min(1, e + h) for e, h in zip(exact, half)], color="#cccccc",
                          step=None, label="99% interval around the exact expectation")
        left.plot(js, exact, "-", color=EXACT, marker="_", markersize=14,
                  label="exact: mean Σ min(p, q) at the contexts reached")
        dots = left.plot(js, measured, "o", color=OBSERVED, label="measured: accepted / reached")
        dots[0].set_gid("acc-measured")
        for j, p in zip(js, positions):
            left.annotate(f"{p['reached']}", (j, 0.02), ha="center", fontsize=6, color="#666666")
        left.set_ylim(-0.02, 1.05)
        left.set_xticks(js)
        left.set_xlabel("draft position (numbers: rounds that reached it)")
        left.set_ylabel("acceptance probability")
        left.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.2),
                    ncol=2)   # under the axis: the points and the band stay clear
        rounds = max(merged["rounds"], 1)
        tpc, want = merged["tokens"] / rounds, merged["exact_tokens"] / rounds
        err = Z99 * math.sqrt(max(merged["var_tokens"], 0.0)) / rounds
        right.bar([0], [tpc], 0.6, color=OBSERVED)[0].set_gid("tpc-measured")
        right.bar([1], [want], 0.6, color="#bbbbbb", yerr=[err], capsize=4)[0].set_gid(
            "tpc-exact")
        right.set_xticks([0, 1])
        right.set_xticklabels(["measured", "exact"])
        right.set_title("tokens per target call", fontsize=9)
        right.set_ylim(0, max(tpc, want + err) * 1.2 + 0.1)
        for x, v in ((0, tpc), (1, want)):   # inside the bar's foot, clear of the error bar
            right.annotate(f"{v:.3f}", (x, 0), ha="center", va="bottom", fontsize=8,
                           color="white", xytext=(0, 4), textcoords="offset points")
        fig.suptitle(f"{merged['runs']} runs, {merged['rounds']} rounds, "
                     f"{merged['tokens']} tokens", fontsize=9, x=0.02, ha="left")
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.3, top=0.88, wspace=0.25)
        return _svg(fig)


def served_acceptance(records: list) -> bytes:
    """A served engine's counters, request by request, beside the exact replay."""
    with matplotlib.rc_context(_STYLE):
        fig = plt.figure(figsize=(6, 3))
        ax = fig.add_subplot()
        xs = range(len(records))
        measured = [r["accepted"] / r["drafted"] if r["drafted"] else 0 for r in records]
        exact = [r["accepted_exact"] / r["drafted_exact"] if r["drafted_exact"] else 0
                 for r in records]
        ax.bar([x - 0.2 for x in xs], measured, 0.4, color=OBSERVED,
               label="the engine's counters: accepted / drafted")
        ax.bar([x + 0.2 for x in xs], exact, 0.4, color="#bbbbbb",
               label="exact replay (greedy: Σ min(p, q) is 0 or 1 per position)")
        for x, r in zip(xs, records):
            if not r["drafted"] and not r["drafted_exact"]:
                ax.annotate("nothing drafted", (x, 0.02), ha="center", fontsize=7, rotation=90)
        ax.set_ylim(0, 1.25)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([str(x + 1) for x in xs])
        ax.set_xlabel("request")
        ax.set_ylabel("acceptance rate")
        ax.legend(fontsize=7, frameon=False, loc="upper left")
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
        return _svg(fig)


def speed(measured: dict) -> bytes:
    """Seconds per turn of the same greedy requests, speculating and baseline."""
    spec, base = measured.get("spec_seconds", []), measured.get("base_seconds", [])
    tokens = measured.get("tokens", 0)
    with matplotlib.rc_context(_STYLE):
        fig = plt.figure(figsize=(5, 2.8))
        ax = fig.add_subplot()
        turns = range(max(len(spec), len(base)))
        ax.bar([t - 0.2 for t in turns][:len(spec)], [tokens / s for s in spec], 0.4,
               color=OBSERVED, label="speculating")
        ax.bar([t + 0.2 for t in turns][:len(base)], [tokens / s for s in base], 0.4,
               color="#9a9a9a", label="baseline (no speculation)")
        ax.set_xticks(list(turns))
        ax.set_xticklabels([f"turn {t + 1}" for t in turns])
        ax.set_ylabel("tokens per second")
        ax.set_title(f"speed-up {measured.get('speedup', float('nan')):.3f}x "
                     f"({tokens} tokens per turn, one request at a time)", fontsize=9, loc="left")
        ax.legend(fontsize=7, frameon=False)
        fig.subplots_adjust(left=0.14, right=0.97, bottom=0.12, top=0.88)
        return _svg(fig)
