"""The calibration summary's treatment of checks without a p-value: a law with one possible
outcome (judged by support alone) is counted apart, and a check that pooled to one group on a
law with several outcomes (df 0: what the pooling rule did before its fix) is counted as a
failure of that rule; neither enters the p-values."""

from __future__ import annotations

import json

import numpy as np

from tests.calibration import summary


def test_support_and_powerless_checks_are_counted_apart(tmp_path):
    rng = np.random.default_rng(4)
    with open(tmp_path / "runs.jsonl", "w") as f:
        for i in range(20):
            records = [{"p": float(p), "passed": True, "check": 0, "df": 1,
                        "test": "chi-square"} for p in rng.uniform(size=3)]
            records.append({"p": float(rng.uniform()), "passed": True, "check": 1, "df": 1,
                            "test": "binomial"})
            if i < 4:      # a law with one outcome: no p-value by design
                records.append({"p": 1.0, "passed": True, "check": 2, "df": 0,
                                "test": "support"})
            if i < 3:      # an old run's df-0 check (no "test" recorded)
                records.append({"p": 1.0, "passed": True, "check": 3, "df": 0})
            f.write(json.dumps({"family": "sequence", "impl": "reference", "delta": 0.0,
                                "seed": i, "seconds": 1.0, "failed": False, "failures": [],
                                "records": records}) + "\n")
    table = summary.write(tmp_path)
    row = json.loads((tmp_path / "summary.json").read_text())["null"]["sequence"]
    assert (row["checks"], row["support_checks"], row["powerless_checks"]) == (80, 4, 3)
    assert row["uniform"]["n"] == 80
    assert "sequence: 4 checks of a law with one possible outcome" in table
    assert "sequence: 3 checks pooled to one group" in table
