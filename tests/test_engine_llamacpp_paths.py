"""llama.cpp's speculative paths of issue 40, without a server: each method's command line
carries its options (the n-gram variants sized so that the kit's covering prompt makes them
propose, synthetic acceptance with one rate per draft position), the stateful lookups say
truthfully that the kit does not replay them, and a mode the engine names lossy is named in
the verdict its checks' failures give."""

from __future__ import annotations

import sys
import types

import pytest

from properties import speculation, verdict
from properties.engines import get
from properties.engines import llamacpp as engine
from properties.methods import COVER, LOOKUP, Lookup, Method, StatefulLookup
from properties.cases import ServedCase
from properties.session import Session
from reference.sampling import SamplingParams

CASE = ServedCase((5, 6, 5), 4, SamplingParams())


def spec_tail(name: str) -> list[str]:
    """The options after the server's common ones (model, port, threads, KV cache)."""
    method = get("llamacpp").method(name) if name else None
    argv = [str(a) for a in engine.command(None, "/export", method, 8000).argv]
    base = [str(a) for a in engine.command(None, "/export", None, 8000).argv]
    assert argv[:len(base)] == base
    return argv[len(base):]


def test_each_context_method_carries_its_sizes():
    assert spec_tail("ngram-map-k") == [
        "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "1",
        "--spec-ngram-map-k-size-m", "4", "--spec-ngram-map-k-min-hits", "1"]
    assert spec_tail("ngram-map-k4v") == [
        "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "1",
        "--spec-ngram-map-k4v-size-m", "4", "--spec-ngram-map-k4v-min-hits", "1"]
    assert spec_tail("ngram-mod") == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1",
        "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "4"]
    assert spec_tail("ngram-cache") == ["--spec-type", "ngram-cache"]
    # unchanged: ngram-simple with a one-token lookup, k drafted
    assert spec_tail("ngram") == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
        "--spec-ngram-simple-size-m", "4", "--spec-draft-n-max", "4"]


def test_draft_models_and_synthetic_acceptance_carry_theirs():
    draft = ["-md", "/export/gguf/draft-early-exit.gguf", "--spec-type", "draft-simple",
             "--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
             "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]
    assert spec_tail("draft-early-exit") == draft
    assert spec_tail("draft-early-exit-synthetic") == draft + [
        "--spec-synth-rates", "0.9,0.8,0.7,0.6"]
    assert spec_tail(None) == []        # the baseline speculates not at all
    # --spec-synth-rates takes exactly one rate per draft position (common/speculative.cpp
    # common_speculative_synth_rates_resolve): a k without as many rates is refused here
    odd = Method("synthetic-k2", "x", get("llamacpp").method("draft-early-exit").drafter, 2,
                 lossy="benchmarking only")
    with pytest.raises(ValueError, match="one rate per draft position"):
        engine.command(None, "/export", odd, 8000)


def test_the_eagle3_head_is_converted_beside_its_target_and_drafted_from():
    """draft-eagle3 with -md (without it llama.cpp accepts the type and never drafts: the
    finding under tests/findings/llamacpp_spec_type_ignored_without_draft/), k proposals every
    round; its head's conversion passes the target's folder (--target-model-dir)."""
    assert spec_tail("eagle3") == [
        "-md", "/export/gguf/head-eagle3-llama.gguf", "--spec-type", "draft-eagle3",
        "--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        "-td", "1", "-ctkd", "f32", "-ctvd", "f32"]
    drafter = get("llamacpp").method("eagle3").drafter
    assert (drafter.kind, drafter.qk_norm, drafter.hidden.layers, drafter.hidden.where) == (
        "eagle3", False, (0, 1, 1), "input")
    # the pre-final-norm state (aux id = the target's depth) is a method of its own: llama.cpp
    # leaves it unwritten for a Qwen3 target (tests/findings/llamacpp_eagle3_last_layer/)
    last = get("llamacpp").method("eagle3-last-layer").drafter
    assert last.hidden.layers == (0, 1, 2) and last.head != drafter.head
    steps = {what: [str(a) for a in step.argv]
             for what, step in engine.prepare_commands(None, "/export")}
    heads = [argv for what, argv in steps.items()
             if "head" in what and argv[3] not in [f"/export/{m}" for m in engine.WHOLE_MODELS]]
    assert sorted(argv[3:] for argv in heads) == [
        [f"/export/{h}", f"/export/gguf/{h}.gguf", "/export/target"]
        for h in ("head-dflash", "head-dspark", "head-eagle3-llama", "head-eagle3-llama-last")]
    # the models' conversions take no target
    assert all(len(argv) == 5 for what, argv in steps.items() if "head" not in what)
    # the engine's workaround for the abort of tests/findings/llamacpp_eagle3_sampled_abort/:
    # the same head and options, the draft's sampler on the CPU
    assert spec_tail("eagle3-cpu-draft-sampling") == spec_tail("eagle3") + [
        "--no-spec-draft-backend-sampling"]
    assert (get("llamacpp").method("eagle3-cpu-draft-sampling").drafter == drafter)


def test_mtp_serves_the_target_with_its_layer_as_the_model():
    """draft-mtp finds its layer in the served model (no -md): the method's server loads the
    GLM-4.5 export of the target with its MTP layer, converted alone (no target beside it);
    the baseline keeps the kit's target."""
    method = get("llamacpp").method("mtp")
    argv = [str(a) for a in engine.command(None, "/export", method, 8000).argv]
    assert argv[argv.index("-m") + 1] == "/export/gguf/target-glm4moe-mtp.gguf"
    assert "-md" not in argv and argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    base = [str(a) for a in engine.command(None, "/export", None, 8000).argv]
    assert base[base.index("-m") + 1] == "/export/gguf/target.gguf"
    d = method.drafter
    assert (d.kind, d.hidden.layers, d.hidden.where, d.hidden.normed, d.replays) == (
        "mtp", (1,), "output", True, True)
    assert dict(d.options) == {"order": "embedding-first", "recycle": "normed", "lead": True}
    steps = [[str(a) for a in step.argv] for _, step in engine.prepare_commands(None, "/export")]
    assert ["/export/target-glm4moe-mtp", "/export/gguf/target-glm4moe-mtp.gguf"] in [
        argv[3:] for argv in steps]


def test_a_lookup_declared_elsewhere_still_gets_ngram_simple_with_its_k():
    method = Method("lookup-3", "x", Lookup(1, 3), 3)
    argv = [str(a) for a in engine.command(None, "/export", method, 8000).argv]
    assert argv[argv.index("--spec-type") + 1] == "ngram-simple"
    assert argv[argv.index("--spec-ngram-simple-size-m") + 1] == "3"


def test_the_objects_declare_what_the_checks_ask():
    methods = get("llamacpp").methods
    for name in ("ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
        drafter = methods[name].drafter
        assert isinstance(drafter, StatefulLookup), name
        # not replayed: no model's law, and no claim about where it proposes
        assert drafter.model is None and not drafter.replays and not drafter.perfect
        assert drafter.proposes((1, 2, 1, 2), (1, 2, 1)) is None
        assert drafter.lookup and drafter.export is None
        assert name in drafter.describe()
    assert methods["ngram-cache"].k == 8     # n_draft = 8, fixed in the source
    assert methods["ngram-cache"].drafter.repeats == 2
    synthetic = methods["draft-early-exit-synthetic"]
    assert "benchmarking" in synthetic.lossy and synthetic.drafter.replays
    assert all(m.lossy is None for n, m in methods.items() if n != synthetic.name)
    assert methods["ngram"].drafter == LOOKUP      # the replayed lookup, unchanged


def test_a_stateful_lookup_covers_the_prompt_as_often_as_it_needs():
    once, twice = StatefulLookup("r", "s"), StatefulLookup("r", "s", repeats=2)
    assert once.cover(CASE).prompt == COVER + CASE.prompt
    assert twice.cover(CASE).prompt == COVER + COVER + CASE.prompt
    assert twice.cover(twice.cover(CASE)) == twice.cover(CASE)   # covered once only
    assert once.cover(CASE).max_tokens == CASE.max_tokens
    # what the kit's served checks do with it: the case covered (a capped engine: 3 for 2)
    impl = types.SimpleNamespace(method=Method("m", "d", twice, 4), schedule="capped")
    moved = speculation.for_drafter(impl, CASE.replace(max_tokens=2))
    assert moved.prompt[:2 * len(COVER)] == COVER * 2 and moved.max_tokens == 3
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="repeats"):
            StatefulLookup("r", "s", repeats=bad)


def test_evidence_for_a_stateful_lookup_comes_from_the_engine_only():
    """Without the engine's own counts, the kit claims nothing about a stateful lookup (the
    replay that shows a plain Lookup does not apply)."""
    impl = types.SimpleNamespace(method=get("llamacpp").method("ngram-mod"))
    request = types.SimpleNamespace(prompt=COVER + (5, 6, 5))
    answer = [types.SimpleNamespace(tokens=(6, 5, 6, 5))]
    seen = speculation.replayed(impl, [request], [answer])
    assert not seen.known and not seen.shown
    plain = types.SimpleNamespace(method=get("llamacpp").method("ngram"))
    assert speculation.replayed(plain, [request], [answer]).shown


def _session(method, outcomes):
    launch = types.SimpleNamespace(speculation={"drafted": 10}, method=method)
    run = Session(types.SimpleNamespace(spec="openai:x", description="", levels=("served",),
                                        missing={}, hints={}, model_kinds=(),
                                        has=lambda level: level == "served"),
                  launch=launch)
    for nodeid, (outcome, cause) in outcomes.items():
        run.planned[nodeid] = "served_greedy"
        run.outcomes[nodeid] = ("served_greedy", outcome, "")
        run.causes[nodeid] = cause
    return run


def test_a_lossy_mode_is_named_in_the_verdict_its_failures_give():
    synthetic = get("llamacpp").method("draft-early-exit-synthetic")
    failed = verdict.summary(_session(synthetic, {
        "properties/t.py::test_greedy": ("failed", "greedy output differs")}), 0)
    assert failed["verdict"] == "NOT CONFORMANT" and failed["exit"] == 1
    assert "the engine names this mode lossy: " + synthetic.lossy in failed["verdict_text"]
    # no failure: the checks' verdict stands (never one of the lossiness's own), and says the
    # engine named it lossy all the same (a blind spot to look at)
    passed = verdict.summary(_session(synthetic, {
        "properties/t.py::test_greedy": ("passed", "")}), 0)
    assert passed["verdict"] == "CONFORMANT"
    assert "yet the engine names this mode lossy" in passed["verdict_text"]
    plain = verdict.summary(_session(get("llamacpp").method("draft-early-exit"), {
        "properties/t.py::test_greedy": ("failed", "greedy output differs")}), 0)
    assert "lossy" not in plain["verdict_text"]


def _lossy_command(env, export_dir, method, port):
    """The kit's fake server; the speculating one serves another model's greedy tokens (as a
    lossy mode changes the output), the baseline the target's."""
    from properties.engines import Command
    from tests.fakes.engine import ROOT
    argv = [sys.executable, "-m", "tests.fakes.server", "--port", str(port)]
    if method is not None:
        argv += ["--behaviour", "wrong_model"]
    return Command(argv, health="/health", cwd=str(ROOT))


@pytest.fixture
def lossy_engine():
    from properties import engines
    from properties.engines import Engine
    from properties.methods import PERFECT
    from tests.fakes.engine import FAKE
    engine = Engine(
        name="lossy-fake", title="a fake engine with a mode it names lossy (test)",
        setup="nothing", validated=("test",),
        methods={"lossy": Method("lossy", "output changed on purpose", PERFECT,
                                 lossy="the fake's own words: benchmarking only")},
        dialect=FAKE, find=lambda: None, version=lambda env: "test", command=_lossy_command,
        start_timeout=60.0, schedule="full", recipe=False)
    engines.register("lossy-fake", engine)
    yield engine
    engines.ENGINES.pop("lossy-fake")


def test_a_launched_lossy_mode_is_judged_by_its_checks_not_refused(lossy_engine, tmp_path):
    """A server the kit started whose speculation changes the greedy output fails the identity
    probe while its baseline (the same export) passes it: the run goes on, the families judge
    it, and the verdict is their NOT CONFORMANT, naming the engine's words."""
    from properties.serve import run
    said = []
    outcome = run.run("lossy-fake", "lossy", run_dir=tmp_path, families="served_greedy",
                      measure_speed=False, say=said.append)
    text = "\n".join(said[-40:])
    assert (outcome.verdict, outcome.exit) == ("NOT CONFORMANT", 1), text
    assert outcome.text.endswith("the engine names this mode lossy: the fake's own words: "
                                 "benchmarking only")
    assert any("greedy probe differs" in line for line in said), text
    assert outcome.summary["method_lossy"] == "the fake's own words: benchmarking only"
    assert any(test.endswith("test_greedy_equals_target_and_baseline") for test, _ in outcome.new)


def test_tests_that_saw_no_draft_are_counted_in_a_failing_verdict():
    """Failures decide the verdict, but a run whose other tests saw nothing drafted says how
    many judged nothing (ngram-map-k: most of them), instead of hiding them behind it."""
    method = get("llamacpp").method("ngram-map-k")
    run = _session(method, {"properties/t.py::test_a": ("failed", "logprob 0.0"),
                            "properties/t.py::test_b": ("not_shown", ""),
                            "properties/t.py::test_c": ("not_shown", "")})
    run.outcomes["properties/t.py::test_b"] = ("served_greedy", "not_shown", "not shown: x")
    run.outcomes["properties/t.py::test_c"] = ("served_greedy", "not_shown", "not shown: x")
    text = verdict.summary(run, 0)["verdict_text"]
    assert text.startswith("NOT CONFORMANT: 1 failure(s)")
    assert "; 2 test(s) not shown (nothing drafted where they judge)" in text
