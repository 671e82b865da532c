"""The conformance kit for speculative decoding: ``pytest properties/ --impl=NAME``.

Where to start reading: ``families.py`` (what is checked, family by family), then one family's
test module (``test_greedy.py``) and its check (``checks/greedy.py``). Everything else serves
those two.

How data flows from ``--impl`` to the verdict:

    --impl=NAME ─► impl.py ─► an Impl (its functions, grouped in levels)
                   │  reference / fast / a module / a .py file       (in-process)
                   │  transformers, transformers-lookup             (adapters/transformers.py)
                   │  openai:URL                                    (adapters/served.py + client.py)
                   ▼
    test_<family>.py: Hypothesis draws a case (strategies.py ─► cases.py: specs of the models,
                   prompt, k, SamplingParams) ─► checks/<family>.py runs it:
                   harness.py calls the implementation on the kit's models (models/), under
                   guards.py; invariants.py reads what the models recorded; oracle.py computes
                   the exact answer (greedy output, sampling law); statistics.py judges a sample
                   ─► a PropertyFailure with a replay line (replay.py), or a pass with the
                   evidence recorded (evidence.py)
                   ▼
    plugin/kit.py: applicability per family, the outcomes kept in the run's Session
                   (session.py); verdict.py: the conformance summary, one verdict
                   (CONFORMANT / NOT CONFORMANT / NOT SHOWN / INCOMPLETE); report/ draws the
                   evidence

The parts (each package's docstring, or its files', says more):

    core         families.py, cases.py, strategies.py (importable by anyone), oracle.py,
                 statistics.py (chi-square plans with stated alpha and power), harness.py,
                 guards.py, invariants.py, acceptance.py (the exact counters a server must
                 report), acceptance_sampled.py (the exact law of a sampled round's accepted
                 count), acceptance_by_position.py (Σ min(p, q) of the rounds a run made),
                 speculation.py (was anything drafted where a served check judges? a test
                 never shown speculating is NOT SHOWN, never a pass), methods.py (a
                 speculative method as one object: what drafts, k, its conventions),
                 formulas.py (reads them off an engine's dialect: the formula for penalties,
                 min_p and logit_bias that the engine's file declares, a
                 reference.penalties.Formula, or None, and the parameters its API cannot take;
                 it holds no formula itself), evidence.py, profiles.py (Hypothesis profiles),
                 progress.py, replay.py, impl.py (finding the implementation under test),
                 reseed.py (``--kit-reseed``: every case's samples drawn afresh, for the
                 calibration's runs)
    the run      session.py (one run: the implementation, the tests planned, their outcomes,
                 the known failures matched), verdict.py (the verdict, decided in one place),
                 known.py (the one known-failures format, ``--known-failures=FILE``)
    models/      the kit's float64 models: trace (instrumentation), tables, specs, the
                 wrappers engines are handed, the fixed served models with their tokenizer,
                 and the served heads of the head methods (heads.py)
    checks/      one module per family; served.py holds the served families' checks, and
                 served_batch.py, served_params.py, served_acceptance.py their own families
    test_*.py    the families as pytest tests, one module each (served ones: test_served_*.py)
    adapters/    implementations under test that are not written against the chapter's API:
                 transformers' assisted generation, and any server over HTTP (the OpenAI
                 client, its default dialect, the served Impl)
    engines/     one file per production engine (vLLM, llama.cpp, transformers serve, SGLang,
                 OpenVINO GenAI, onnxruntime-genai): environment, command lines per method,
                 health, dialect, counters; an engine driven through its Python API declares a
                 Session class there, served by the kit's stdlib-only worker (inprocess.py,
                 python_api.py) as any server; local.py finds the engines' environments,
                 gguf_convert.py drives llama.cpp's converter
    serve/       a production engine as part of the kit's run (``pytest properties/
                 --engine=NAME --method=NAME``; ``python -m properties.serve run ENGINE METHOD``
                 builds those arguments): run.py's Launch, held by the session, exports, starts
                 the engine and its baseline, restarts, shows speculation, measures the
                 speed-up, stops them
    export/      the kit's checkpoints as Hugging Face directories, the trained pair, recipes
    plugin/      the pytest plugin (conftest.py only loads it): kit.py (options, applicability,
                 outcomes, known failures, the summary), served.py (the served options and the
                 served Impl, built configured), say.py (the kit's lines during a run),
                 hooks.py (the kit's own hooks for a program running it with pytest.main: its
                 lines, and the implementation it hands the kit)
    report/      ``--kit-report=DIR``: the evidence behind a verdict as an HTML page
    examples/    an engine exposed with the chapter's API, as an author would expose theirs
                 (``--impl=properties/examples/chapter_engine.py``)

Not in the package (the project's lab, in its checkout's tests/, outside what ``pip install``
ships): the known failures of each engine (tests/known/ENGINE.txt), the standalone
reproductions of its defects (tests/findings/), the calibration of the kit's stated error
rates (tests/calibration/, ``make calibration``), the fake server and fake engine of the
launcher's self-test (tests/fakes/), and the broken implementations of the kit's self-test
(tests/mutants/).
"""
