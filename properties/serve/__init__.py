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
    launch.py     starting and stopping a local ``transformers serve`` for the tests
"""
