"""`python -m properties.serve run ENGINE METHOD --models trained` against the fake engine
serving the committed trained pair: the launcher end to end (conformant), the greedy check
failing on a wrong engine, the acceptance check failing on wrong counts, the head-size refusal
before anything starts, and the results file and grid showing trained runs (about 25 s on 2
cores: the end-to-end run starts two fake servers, each loading the pair in float64); transformers
serve's reading of a trained pair (its tokenizer, its early exit's settings taking effect in
process, an answer re-split by the tokenizer, its missing counters), no server started.

`--models trained-large` (the weight-bound pair of `make models-large`, committed): the same
end-to-end run and the refusal that differs from the committed pair's, skipped where the pair
has not been made."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from properties import acceptance, engines
from properties.export import trained as trained_export
from properties.serve import run as launcher
from properties.serve import speed, trained
from tests.fakes.server import FakeServer

FAKE = engines.get("fake")
LARGE = trained_export.PAIRS["trained-large"]


def needs_large(models: str = "trained-large"):
    """Skip when `models` is the weight-bound pair and it has not been made."""
    if models == "trained-large" and not (LARGE / "manifest.json").is_file():
        pytest.skip(f"no weight-bound pair at {LARGE}: run `make models-large`")


def _check(behaviour, draft="draft-early-exit", prompts=1, tokens=16):
    method = FAKE.method(draft)
    with FakeServer(behaviour, trained=draft) as spec, FakeServer(trained="none") as base:
        return trained.check(FAKE, method, spec.url, base.url, say=lambda _: None,
                             n_prompts=prompts, max_tokens=tokens)


# the large pair runs the same path on a larger model (43 s on 2 idle cores): make test-extra
@pytest.mark.parametrize("models", ["trained",
                                    pytest.param("trained-large", marks=pytest.mark.extra)])
def test_trained_run_on_the_fake_engine_is_conformant_with_exact_acceptance(models, tmp_path,
                                                                             monkeypatch):
    needs_large(models)
    monkeypatch.setattr(launcher, "ROOT", tmp_path)     # the default run directory, under it
    lines = []
    outcome = launcher.run("fake", "draft-early-exit", models=models, measure_speed=False,
                           say=lines.append)
    assert outcome.exit == 0 and outcome.verdict == "CONFORMANT", "\n".join(lines)
    run_dir, = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith(f"fake-draft-early-exit-{models}-")   # -trained-large-TIME
    record = json.loads((run_dir / "result.json").read_text())
    t = record["trained"]
    assert record["models"] == models and record["families"] == [] and not t["failures"]
    assert len(t["requests"]) == trained.PROMPTS
    # the fake's own speculation loop (tests/fakes/server.py, TrainedSpeculator) and the replay agree
    assert (t["engine_drafted"], t["engine_accepted"]) == (t["exact_drafted"], t["exact_accepted"])
    assert 0 < t["exact_accepted"] < t["exact_drafted"]
    if models == "trained":
        # the early exit of the trained pair agrees with the target often enough to gain
        assert t["tokens_per_target_call"] > 1.5
    # only the target and the method's draft were exported, of the pair asked for
    assert sorted(p.name for p in (run_dir / "export").iterdir()) == ["draft-early-exit", "target"]
    exported = json.loads((run_dir / "export" / "target" / "config.json").read_text())
    assert exported["hidden_size"] == trained_export.pair_of(models).target.config.hidden_size
    text = "\n".join(lines)
    assert "acceptance (engine counters)" in text and "tokens per target call" in text
    assert f"{models} pair: {trained.PROMPTS} greedy requests" in text
    assert record["summary"]["served_trained"]["passed"] == 1


def test_a_wrong_token_fails_the_greedy_check_at_its_position():
    result = _check("wrong_token")
    assert any("greedy: position 3" in f for f in result["failures"]), result["failures"]


def test_wrong_counts_fail_the_acceptance_check_naming_both_numbers():
    result = _check("partial_accept", prompts=2)
    bad = [f for f in result["failures"] if "acceptance" in f]
    assert len(bad) == 2, result["failures"]
    for request, failure in zip(result["requests"], bad):
        # the fake reports 3/4 of what its rounds accepted: both numbers are named
        assert request["engine_accepted"] == request["exact_accepted"] * 3 // 4
        assert f"{request['engine_accepted']:g} accepted" in failure
        assert f"{request['exact_accepted']} accepted" in failure


def test_the_correct_fake_passes_the_same_check():
    result = _check(None, draft="draft-small")
    assert not result["failures"] and result["engine_drafted"] > 0


def test_replay_target_calls_count_prefill_rounds_and_plain_steps():
    # an independent count: with a draft that never agrees, every round commits one token
    path = list(range(10, 40))
    never = lambda committed, n: [0] * n   # noqa: E731
    e = acceptance.replay(path, never, 8, 4, "full")
    assert (e.drafts, e.accepted) == (7, 0)   # the prefill gives token 1, 7 rounds the rest
    assert trained.target_calls(e, 8, "full") == 8
    e = acceptance.replay(path, never, 8, 4, "capped")
    assert (e.drafts, e.accepted) == (6, 0)   # the last token: a plain step, no draft
    assert trained.target_calls(e, 8, "capped") == 8
    always = lambda committed, n: path[committed:committed + n]   # noqa: E731
    e = acceptance.replay(path, always, 8, 4, "prompt")
    assert (e.drafts, e.drafted, e.accepted) == (2, 7, 7)   # 4 + 1, then 3: the last round capped
    assert trained.target_calls(e, 8, "prompt") == 2


@pytest.mark.parametrize("engine", ["vllm", "onnxruntime-genai"])
def test_an_engine_that_cannot_run_the_small_draft_refuses_before_starting(engine, tmp_path):
    lines = []
    outcome = launcher.run(engine, "draft-small", models="trained", run_dir=tmp_path,
                           say=lines.append)
    assert outcome.exit == 3 and outcome.verdict == "SETUP"
    assert "draft-small" in outcome.text and "head_dim=24" in outcome.text
    assert engine in outcome.text
    assert not any(tmp_path.iterdir())     # nothing exported, nothing started


def test_head_size_rules_come_from_the_engine_files():
    pair = trained_export.load(torch.float32)
    problems = trained_export.unservable({"draft-small": pair.small, "target": pair.target})
    assert any("vllm" in p and "head_dim=24" in p for p in problems)
    assert any("onnxruntime-genai" in p and "head_dim=24" in p for p in problems)
    assert not any(p.startswith("target") for p in problems)
    assert trained_export.refusal(engines.get("vllm"), engines.get("vllm").method(
        "draft-early-exit")) is None
    assert trained_export.refusal(engines.get("llamacpp"), engines.get("llamacpp").method(
        "draft-small")) is None


def test_head_size_refusal_depends_on_the_pair():
    """An engine whose attention takes no head_dim 24 refuses the committed small draft, not
    the weight-bound pair's (head_dim 32); the target and the early exit pass on both."""
    no_24 = replace(FAKE, name="no-24", head_sizes=("head_dim other than 24", lambda d: d != 24))
    small, early = no_24.method("draft-small"), no_24.method("draft-early-exit")
    refused = trained_export.refusal(no_24, small, "trained")
    assert "no-24 cannot run the trained draft-small: head_dim=24" in refused
    assert trained_export.refusal(no_24, early, "trained") is None
    needs_large()
    assert trained_export.refusal(no_24, small, "trained-large") is None
    assert trained_export.refusal(no_24, early, "trained-large") is None
    # vLLM's own declaration: its draft-small refused on the committed pair only
    vllm = engines.get("vllm")
    assert "head_dim=24" in trained_export.refusal(vllm, vllm.method("draft-small"), "trained")
    assert trained_export.refusal(vllm, vllm.method("draft-small"), "trained-large") is None


def test_an_unmade_large_pair_or_an_unknown_models_is_refused_before_starting(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setitem(trained_export.PAIRS, "trained-large", tmp_path / "nowhere")
    lines = []
    outcome = launcher.run("fake", "draft-early-exit", models="trained-large",
                           run_dir=tmp_path / "run", say=lines.append)
    assert outcome.exit == 3 and outcome.verdict == "SETUP"
    assert "make models-large" in outcome.text and "nowhere" in outcome.text
    assert not (tmp_path / "run").exists()     # nothing exported, nothing started
    outcome = launcher.run("fake", "draft-early-exit", models="large", run_dir=tmp_path / "run",
                           say=lines.append)
    assert outcome.exit == 3 and "models='large'" in outcome.text
    assert "choose kit, trained or trained-large" in lines[-1]
    with pytest.raises(ValueError, match="models='large'"):
        trained_export.pair_of("large")


def test_the_page_and_the_launcher_know_the_same_trained_pairs():
    from properties.report import grid
    assert grid.TRAINED_MODELS == tuple(trained_export.PAIRS)


def test_trained_only_methods_are_refused_on_the_kits_models(tmp_path):
    outcome = launcher.run("llamacpp", "draft-small", run_dir=tmp_path, say=lambda _: None)
    assert outcome.exit == 3 and "--models trained" in outcome.text
    outcome = launcher.run("fake", "draft-early-exit", run_dir=tmp_path / "kit",
                           say=lambda _: None)
    assert outcome.exit == 3 and "--models trained" in outcome.text


def test_speed_measures_the_trained_prompts():
    with FakeServer(trained="draft-early-exit") as spec, FakeServer(trained="none") as base:
        servers = [SimpleNamespace(url=s.url, process=None) for s in (spec, base)]
        got = speed.measure(FAKE, *servers, turns=1, say=lambda _: None,
                            method=FAKE.method("draft-early-exit"),
                            prompts=trained.prompts(1), tokens=8)
    assert got["tokens"] == 8 and got["requests_per_turn"] == 1 and got["speedup"] > 0


def test_results_and_grid_keep_trained_runs_beside_the_kits(tmp_path):
    from properties.report import grid
    kit = {"engine": "fake", "method": "draft-early-exit", "verdict_text": "CONFORMANT",
           "summary": {}}
    t = {"engine_drafted": 280, "engine_accepted": 125, "exact_drafted": 280,
         "exact_accepted": 125, "tokens_per_target_call": 2.59}
    trained_run = dict(kit, models="trained", trained=t, speed={"speedup": 1.31},
                       verdict="CONFORMANT")
    large = {"engine_drafted": 200, "engine_accepted": 150, "exact_drafted": 200,
             "exact_accepted": 150, "tokens_per_target_call": 3.1}
    large_run = dict(kit, models="trained-large", trained=large, speed={"speedup": 1.87},
                     verdict="CONFORMANT")
    results = tmp_path / "engines.json"
    launcher.results_append(results, kit)
    launcher.results_append(results, trained_run)
    launcher.results_append(results, large_run)     # beside the committed pair's, not over it
    assert len(json.loads(results.read_text())) == 3
    table = results.with_suffix(".md").read_text()
    assert "| 125 / 280 (0.446) | 125 / 280 (0.446) | 2.59 | 1.31x |" in table
    # each trained row names its pair; the kit's table has neither
    assert "| draft-early-exit | trained |" in table
    assert "| draft-early-exit | trained-large |" in table
    assert "| 150 / 200 (0.750) | 150 / 200 (0.750) | 3.10 | 1.87x |" in table
    kit_rows = table.split("The trained pairs")[0]
    assert kit_rows.count("| fake |") == 1
    page = grid.render(json.loads(results.read_text()), tmp_path)
    assert "The trained pair" in page and "2.59" in page and "1.31x" in page
    assert "(trained-large)" in page and "3.10" in page and "1.87x" in page


def test_a_refused_run_adds_nothing_to_the_results_file(tmp_path):
    from properties.serve.__main__ import main
    results = tmp_path / "engines.json"
    assert main(["run", "vllm", "draft-small", "--models", "trained", "--results",
                 str(results)]) == 3
    assert not results.exists()


# ------------------------------------------------------- transformers serve on a trained pair

TRANSFORMERS = engines.get("transformers")


def test_transformers_runs_prompt_lookup_and_the_early_exit_on_both_pairs():
    methods = TRANSFORMERS.methods
    assert methods["prompt-lookup"].pairs == methods["draft-early-exit"].pairs == \
        ("trained", "trained-large")
    # a request can name no assistant model: the early exit is its only draft, and only a
    # trained pair's run serves it
    assert methods["draft-early-exit"].drafter.trained_only
    assert "draft-small" not in methods


@pytest.mark.parametrize("models", ["trained", "trained-large"])
def test_transformers_sends_and_reads_a_trained_pairs_text_through_its_tokenizer(models):
    needs_large(models)
    from tokenizers import Tokenizer
    from properties.adapters.client import Request
    pair_tokenizer = Tokenizer.from_file(str(trained_export.PAIRS[models] / "tokenizer.json"))
    prompt = trained.prompts(1, models)[0]
    spec = trained.dialect_for(TRANSFORMERS, TRANSFORMERS.method("draft-early-exit"), models)
    base = trained.dialect_for(TRANSFORMERS, None, models)
    for dialect in (spec, base):
        body = dialect.body(Request(prompt, 8), "m")
        assert body["prompt"] == pair_tokenizer.decode(list(prompt))
        assert dialect.tokens({"text": body["prompt"]}, None, "here") == prompt
    exit_layers = json.loads((trained_export.PAIRS[models] / "manifest.json").read_text())
    config = json.loads(spec.body(Request(prompt, 8), "m")["generation_config"])
    assert config["assistant_early_exit"] == exit_layers["early_exit_layers"]
    assert "assistant_early_exit" not in json.loads(base.body(Request(prompt, 8), "m")[
        "generation_config"])
    # the kit's own models keep the kit's tokenizer
    assert TRANSFORMERS.dialect_for(None).for_pair("kit") is TRANSFORMERS.dialect_for(None)


def test_transformers_prepare_writes_the_early_exits_rounds_into_the_served_target(tmp_path):
    from properties.engines import transformers
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "generation_config.json").write_text('{"do_sample": false}')
    transformers.prepare(None, tmp_path, tmp_path / "prepare.log")
    written = json.loads((tmp_path / "target" / "generation_config.json").read_text())
    assert written == {"do_sample": False, "num_assistant_tokens": 4,
                       "num_assistant_tokens_schedule": "constant",
                       "assistant_confidence_threshold": 0.0}
    assert TRANSFORMERS.method("draft-early-exit").k == written["num_assistant_tokens"]
    # the recipe shows the same step
    (what, step), = transformers.prepare_commands(None, "/export")
    assert "/export/target/generation_config.json" in step.shell()
    assert '"num_assistant_tokens": 4' in step.shell()


def test_an_engine_without_counters_has_its_acceptance_said_unjudged():
    record = {"trained": {"requests": [{}], "max_tokens": 48, "k": 4, "draft": "draft-early-exit",
                          "failures": [], "replayed": False, "engine_drafted": None,
                          "acceptance_unjudged": "cannot judge: URL (transformers) reports no "
                                                 "speculative-decoding counters"}}
    lines = trained.describe(record)
    assert any(line.startswith("acceptance NOT JUDGED") and "no speculative-decoding counters"
               in line for line in lines), lines
    assert trained.dialect_for(TRANSFORMERS, TRANSFORMERS.method("draft-early-exit")
                               ).counters_missing(SimpleNamespace(url="URL"))
    assert trained.dialect_for(FAKE, FAKE.method("draft-early-exit")).counters_missing(
        SimpleNamespace(url="URL")) is None


def test_a_text_read_back_in_another_segmentation_is_the_same_text():
    # the committed pair's tokens 9 ")" and 468 "))": the served run of 2026-12-07 20:47 read
    # the float64 target's ")" "))" back from its text as "))" ")"
    dialect = trained.dialect_for(TRANSFORMERS, None, "trained")
    assert dialect.same_text([468, 9], [9, 468])
    assert not dialect.same_text([468, 468], [9, 468])
    assert not TRANSFORMERS.dialect_for(None).same_text([1, 2], [1, 2])   # the kit's: ids are exact


def test_the_prepared_target_makes_transformers_early_exit_draft_4_a_round(tmp_path):
    # the settings `prepare` writes take effect: transformers' own early exit (in process, the
    # served code path's generate) on the committed pair's exported target, each round's
    # proposals counted; the plain export's defaults (confidence stop 0.4) cut rounds short
    from transformers import AutoModelForCausalLM
    from transformers.generation import candidate_generator as generators
    from properties.engines import transformers
    trained_export.export(tmp_path, TRANSFORMERS.method("draft-early-exit"), "trained")
    prompt = trained.prompts(1)[0]

    def rounds():
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "target", dtype=torch.float32)
        seen, original = [], generators.EarlyExitCandidateGenerator.get_candidates

        def counted(self, input_ids, **kwargs):
            ids, logits = original(self, input_ids, **kwargs)
            seen.append(ids.shape[-1] - input_ids.shape[-1])
            return ids, logits
        generators.EarlyExitCandidateGenerator.get_candidates = counted
        try:
            model.eval().generate(torch.tensor([list(prompt)]), max_new_tokens=24,
                                  min_new_tokens=0, do_sample=False, assistant_early_exit=2)
        finally:
            generators.EarlyExitCandidateGenerator.get_candidates = original
        return seen

    plain = rounds()
    transformers.prepare(None, tmp_path, tmp_path / "prepare.log")
    prepared = rounds()
    # every round drafts 4 but the last, capped at the tokens wanted less one
    assert prepared[:-1] == [4] * (len(prepared) - 1) and prepared[-1] <= 4, prepared
    assert any(n < 4 for n in plain[:-1]), plain
