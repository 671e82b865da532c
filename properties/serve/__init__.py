"""The launcher: the kit starts a production engine, judges it, and stops it.

    __main__.py  ``python -m properties.serve run ENGINE METHOD`` (and ``export DIR``,
                 ``recipes DIR``): the command line
    run.py       one run: export, start the speculating and the baseline server, run the kit
                 in this process (its plugin hands the Engine, the method and the servers to
                 the checks, and takes the summary back), evidence that speculation ran,
                 speed-up, verdict, results
    server.py    an engine's server as a child process: start, health, stop, restart, logs
    deaths.py    a server that dies is a finding: the request that killed it, its log's cause
    speed.py     the engine's own counters (its dialect's `count`), and the speed-up measured
                 with alternating turns
    launch.py    a local ``transformers serve`` for tests

What is engine-specific lives in properties/engines/ (one file per engine); the HTTP client,
the OpenAI dialect and the served Impl in properties/adapters/; the served checks in
properties/checks/served.py. Nothing here names an engine.
"""
