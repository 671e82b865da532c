"""The kit's check functions, one module per family (properties/families.py).

Each ``check_*(impl, case)`` runs one example of one property and raises
``properties.harness.PropertyFailure`` when it is violated. The test modules draw cases with
Hypothesis and call these; ``tests/`` and ``python -m properties.replay`` call them directly.
"""
