"""The kit's stated error rates, measured (issue 25; CONFORMANCE.md, "Calibration"):
``make calibration`` / ``python -m properties.calibration run|power|summary``.

    collect.py   one run of a family: the kit's test bodies, fresh seeds, every p-value recorded
    engines.py   the correct implementations each family runs on (the fake server for served)
    deviate.py   implementations off the exact law by exactly a chosen total variation
    runner.py    many runs on worker processes, one JSON line each (OUT/runs.jsonl)
    stats.py     Clopper-Pearson, the KS test of the p-values, the tail extrapolation
    summary.py   the table, the QQ picture and summary.json
"""
