"""The kit's report: ``--kit-report=DIR`` writes DIR/index.html and the JSON it was built from.

    (properties/evidence.py, in the kit's core, records what the checks hold while a test
    runs, and properties/acceptance_by_position.py the exact acceptance it is drawn beside;
    this package only reads and draws them)
    collect.py     the pytest side: the report directory's check, the records of each test, the
                   run's header, the JSON
    figures.py     the pictures (matplotlib, SVG)
    page.py        index.html from the JSON
    grid.py        the engine x method x family matrix of ``make engines``
"""
