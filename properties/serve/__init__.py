"""Served engines: the kit against an OpenAI-compatible HTTP server (``--impl=openai:URL``).

    models.py     the fixed set of kit models a server loads (target, early-exit and random drafts)
    tokenizer.py  their tokenizer: one character per token id, so text and ids convert exactly
    export.py     writes them as Hugging Face directories; ``python -m properties.serve export DIR``
    recipes.py    the command lines that serve them (transformers, vLLM, SGLang, llama.cpp)
    client.py     the HTTP client: bounded concurrency, timeouts, the request dialects
    oracle.py     float64 greedy and exact sampling law of the served models
    checks.py     the served properties, raising the kit's PropertyFailure
    impl.py       the Impl behind ``--impl=openai:URL``
    plugin.py     pytest options (--baseline, timeouts, concurrency) and the session fixture
    launch.py     starting and stopping a local ``transformers serve``
    server.py     an engine server as a child process: start, health, stop, restart
    run.py        ``python -m properties.serve run ENGINE METHOD``: the kit starts and judges an engine
    engines/      one module per engine (vLLM, llama.cpp, transformers, SGLang, the fake)
    dialects.py   how each engine speaks; deaths.py: a server that dies is a finding
    acceptance.py the exact counters of a greedy request; speed.py: evidence and speed-up
"""
