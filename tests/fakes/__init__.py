"""The project's fakes, for testing the served-engine kit and its launcher without an engine
(test infrastructure: in a checkout only, outside what `pip install` ships).

    engine.py   the `fake` engine of ``python -m properties.serve run fake METHOD`` (the
                launcher's self-test): its methods, dialect, counters and command line
    server.py   the fake OpenAI-compatible server itself: in-process (``FakeServer``, with
                behaviours that break it in one named way each) or as the engine's process
                (``python -m tests.fakes.server --port P``)
"""
