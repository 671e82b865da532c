"""What the runs show: OUT/runs.jsonl -> OUT/summary.json, OUT/summary.md (the table
CONFORMANCE.md holds) and one QQ picture of the p-values per family (OUT/calibration-qq.svg).

Per family (all its correct implementations together) and overall:
* the p-values against Uniform(0, 1): Kolmogorov-Smirnov at KS_ALPHA, and the QQ picture
  (-log10 of the observed against the expected order statistics, with the pointwise 95% band;
  a conservative check bends below the diagonal, a liberal one above);
* the rate of p < 0.05 and p < 1e-3 with exact 95% intervals, and the rate at the kit's alpha
  extrapolated from the tail (stats.extrapolated);
* runs NOT CONFORMANT, with an exact interval, against the verdict line's union bound for the
  checks those runs made;
* apart from the p-values: checks of a law with one possible outcome (judged by support alone,
  no p-value by design) and checks that pooled to one group (df 0 on a law with several
  outcomes: p = 1 whatever the engine did, a failure of the pooling rule that
  statistics.pool_cells no longer allows; only runs recorded before that fix have them).
Power (runs on deviating implementations): per family and deviation, the runs and the checks
that rejected, with intervals, and the deviation detected half the time (interpolated).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from properties import statistics
from tests.calibration import stats as cs


NO_DEVIATION = "no such deviation of this law"
SUPPORT_TESTS = ("support", "one-outcome")


def load(out: Path) -> list[dict]:
    path = Path(out) / "runs.jsonl"
    if not path.exists():
        raise SystemExit(f"{path}: no runs (make calibration writes it)")
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in runs if not r.get("setup_error")]   # the log names those


def _null(runs: list[dict]) -> dict:
    groups = defaultdict(list)
    for run in runs:
        if not run.get("delta"):
            groups[run["family"]].append(run)
    out = {}
    for family, rs in list(groups.items()) + [("all", [r for g in groups.values() for r in g])]:
        records = [rec for r in rs for rec in r["records"]]
        ps = [rec["p"] for rec in records if rec.get("df", 1) >= 1]
        checks = [len(r["records"]) for r in rs]
        failed = sum(r["failed"] for r in rs)
        row = {"runs": len(rs), "impls": sorted({r["impl"] for r in rs}), "checks": len(ps),
               "support_checks": sum(map(_support_only, records)),
               "powerless_checks": sum(map(_powerless, records)),
               "checks_per_run": float(np.mean(checks)) if checks else 0.0,
               "failed_runs": failed, "failed_interval": cs.clopper_pearson(failed, len(rs)),
               "below_alpha": int(sum(p < statistics.ALPHA for p in ps)),
               "failures": [f for r in rs for f in r["failures"]][:5],
               "seconds_per_run": float(np.mean([r["seconds"] for r in rs]))}
        bound = cs.expected_run_bound(row["checks_per_run"], statistics.ALPHA)
        row["run_bound"] = bound
        row["run_consistent"] = cs.binomial_consistent(failed, len(rs), bound)
        if ps:
            row["uniform"] = cs.uniformity(ps)
            row["rates"] = [cs.rate(ps, t) for t in cs.THRESHOLDS]
            row["at_alpha"] = cs.extrapolated(ps, statistics.ALPHA)
        out[family] = row
    return out


def _support_only(record: dict) -> bool:
    """A check with no p-value by design: a law with one possible outcome, judged by support
    alone (statistics.plan, test "support"), or two samples both on one outcome ("one-outcome").
    Not in the p-values (p = 1 is no statement of calibration), counted apart."""
    return record.get("test") in SUPPORT_TESTS


def _powerless(record: dict) -> bool:
    """A check of df 0 on a law with two or more possible outcomes: pooling left one group, so
    p = 1 whatever the engine did. The pooling rule no longer allows it (statistics.pool_cells
    keeps two groups, judged exactly where one is small); runs recorded before that fix have
    them (records without "test"). Counted as a failure of the pooling rule, not a p-value."""
    return record.get("df", 1) < 1 and not _support_only(record)


def _power(runs: list[dict]) -> dict:
    groups = defaultdict(lambda: defaultdict(list))
    for run in runs:
        # a run whose deviation could not be built (an earlier deviate.weights refused laws
        # with one outcome above 1 - delta) was not a deviating engine: left out
        if run.get("delta") and not any(NO_DEVIATION in f["error"] for f in run["failures"]):
            groups[run["family"]][run["delta"]].append(run)
    out = {}
    for family, by_delta in groups.items():
        rows = []
        for delta, rs in sorted(by_delta.items()):
            # the check each example's sample plan is sized for (the rule's first of three: its
            # deviating engine moves acceptance too, which its other two checks see at once)
            recs = [rec for r in rs for rec in r["records"] if rec.get("check", 0) == 0]
            k = sum(r["failed"] for r in rs)
            kc = sum(not rec["passed"] for rec in recs)
            rows.append({"delta": delta, "runs": len(rs), "rejected": k,
                         "rate": k / len(rs), "interval": cs.clopper_pearson(k, len(rs)),
                         "checks": len(recs), "checks_rejected": kc,
                         "check_rate": kc / len(recs) if recs else float("nan"),
                         "check_interval": cs.clopper_pearson(kc, len(recs)) if recs else None})
        out[family] = {"by_delta": rows,
                       "half_power_run": cs.half_power([r["delta"] for r in rows],
                                                       [r["rate"] for r in rows]),
                       "half_power_check": cs.half_power([r["delta"] for r in rows],
                                                         [r["check_rate"] for r in rows])}
    return out


def costs(runs: list[dict]) -> list[dict]:
    """Seconds per run of each (family, implementation, correct or deviating): what a batch of
    RUNS costs (each run on one worker process)."""
    groups = defaultdict(list)
    for run in runs:
        groups[(run["family"], run["impl"], bool(run.get("delta")))].append(run)
    return [{"family": f, "impl": i, "deviating": d, "runs": len(rs),
             "seconds": float(np.mean([r["seconds"] for r in rs])),
             "checks": float(np.mean([len(r["records"]) for r in rs]))}
            for (f, i, d), rs in sorted(groups.items())]


def _thinned(n: int, tail: int = 40, rest: int = 120) -> np.ndarray:
    """Indices of the sorted p-values drawn: the `tail` smallest all (where a miscalibration
    shows), `rest` evenly spaced among the others (the picture stays small; the band and the
    KS test use every value)."""
    if n <= tail + rest:
        return np.arange(n)
    return np.concatenate([np.arange(tail), np.unique(np.linspace(tail, n - 1, rest).astype(int))])


def qq_svg(runs: list[dict], path: Path) -> None:
    """One panel per family: -log10 p observed against expected, with the 95% band."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    by_family = defaultdict(list)
    for run in runs:
        if not run.get("delta"):
            by_family[run["family"]] += [rec["p"] for rec in run["records"]
                                         if rec.get("df", 1) >= 1]
    families = sorted(by_family)
    if not families:
        return
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kit-calibration",
                         "font.size": 8, "axes.spines.top": False,
                         "axes.spines.right": False}):
        cols = min(3, len(families))
        rows = (len(families) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
        for ax, family in zip(axes.flat, families):
            p = np.sort(np.clip(by_family[family], 1e-300, 1.0))
            expected, low, high = cs.qq_envelope(len(p))
            shown = _thinned(len(p))
            ax.fill_between(-np.log10(expected[shown]), -np.log10(low[shown]),
                            -np.log10(high[shown]), color="#cfd8e6", linewidth=0)
            top = max(-np.log10(expected[0]), 1.0)
            ax.plot([0, top], [0, top], color="#222222", linewidth=0.8)
            ax.plot(-np.log10(expected[shown]), -np.log10(p[shown]), ".", color="#3b6fb6",
                    markersize=2.5)
            ks = cs.uniformity(p)
            ax.set_title(f"{family}: {len(p)} p-values, KS p = {ks['p']:.2g}")
            ax.set_xlabel("expected -log10 p (uniform)")
            ax.set_ylabel("observed -log10 p")
        for ax in list(axes.flat)[len(families):]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(path, format="svg", metadata={"Date": None})
        plt.close(fig)


def _interval(lo_hi) -> str:
    lo, hi = lo_hi
    return f"[{lo:.2g}, {hi:.2g}]"


def markdown(null: dict, power: dict, cost: list | None = None) -> str:
    lines = ["| family (implementations) | runs | checks | KS vs uniform (alpha 1e-3) | "
             "p < 0.05 [95% CI] | p < 1e-3 [95% CI] | at 2e-6, extrapolated [95% CI] | "
             "runs NOT CONFORMANT [95% CI] | union bound per run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family, r in null.items():
        if "uniform" not in r:
            continue
        u, (r05, r3), a = r["uniform"], r["rates"], r["at_alpha"]
        lines.append(
            f"| {family} ({', '.join(r['impls'])}) | {r['runs']} | {r['checks']} | "
            f"D = {u['ks']:.3f}, p = {u['p']:.2g} ({'consistent' if u['consistent'] else 'NOT uniform'}) | "
            f"{r05['k']} = {r05['rate']:.3f} {_interval((r05['low'], r05['high']))} | "
            f"{r3['k']} = {r3['rate']:.2g} {_interval((r3['low'], r3['high']))} | "
            f"{a['estimate']:.2g} {_interval((a['low'], a['high']))} | "
            f"{r['failed_runs']} of {r['runs']} {_interval(r['failed_interval'])} | "
            f"{r['run_bound']:.2g} ({r['checks_per_run']:.1f} checks) |")
    notes = [f"{family}: {r['support_checks']} checks of a law with one possible outcome "
             f"(judged by support alone, no p-value)" for family, r in null.items()
             if family != "all" and r.get("support_checks")]
    notes += [f"{family}: {r['powerless_checks']} checks pooled to one group (df 0, p = 1 "
              f"whatever the engine did), a failure of the pooling rule, recorded before it was "
              f"fixed" for family, r in null.items()
              if family != "all" and r.get("powerless_checks")]
    if notes:
        lines += ["", "Not among the p-values: " + "; ".join(notes) + "."]
    if power:
        lines += ["", "| family | deviation (TV) | runs rejected [95% CI] | checks rejected "
                      "[95% CI] |", "| --- | --- | --- | --- |"]
        for family, pw in power.items():
            for row in pw["by_delta"]:
                lines.append(f"| {family} | {row['delta']:g} | {row['rejected']} of {row['runs']} "
                             f"{_interval(row['interval'])} | {row['checks_rejected']} of "
                             f"{row['checks']} {_interval(row['check_interval'])} |")
            half = pw["half_power_check"]
            lines.append(f"| {family} | detected half the time (per check, interpolated) | "
                         f"{'-' if pw['half_power_run'] is None else format(pw['half_power_run'], '.3f')} (runs) | "
                         f"{'-' if half is None else format(half, '.3f')} |")
    if cost:
        lines += ["", "| family | implementation | runs | seconds per run (one worker) | checks "
                      "per run |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {c['family']} | {c['impl']}{' (deviating)' if c['deviating'] else ''} | "
                  f"{c['runs']} | {c['seconds']:.0f} | {c['checks']:.1f} |" for c in cost]
    return "\n".join(lines)


def write(out: Path, docs: Path | None = None) -> str:
    out = Path(out)
    runs = load(out)
    null, power = _null(runs), _power(runs)
    cost = costs(runs)
    (out / "summary.json").write_text(json.dumps({"null": null, "power": power, "cost": cost},
                                                 indent=1))
    table = markdown(null, power, cost)
    (out / "summary.md").write_text(table + "\n")
    qq_svg(runs, out / "calibration-qq.svg")
    if docs is not None:
        Path(docs).mkdir(parents=True, exist_ok=True)
        qq_svg(runs, Path(docs) / "calibration-qq.svg")
    return table
