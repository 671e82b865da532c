"""The kit's stated error rates, measured (issue 25; CONFORMANCE.md, "Calibration"):
``make calibration`` / ``python -m tests.calibration run|power|summary`` (from the checkout's
root: the lab, not the kit; it runs the kit itself, one family at a time).

    collect.py   one run of a family: the kit's own run of it (pytest.main, its plugin), fresh
                 seeds (--hypothesis-seed, --kit-reseed), every p-value recorded
    engines.py   the correct implementations each family runs on (the fake server for served),
                 and the one each family's power is measured on (deviated by deviate.py)
    deviate.py   implementations off the exact law by exactly a chosen total variation
    runner.py    many runs on worker processes, one JSON line each (OUT/runs.jsonl)
    stats.py     Clopper-Pearson, the KS test of the p-values, the tail extrapolation
    summary.py   the table, the QQ picture and summary.json
"""
