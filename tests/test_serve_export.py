"""The exported served models: they load back bit for bit, in transformers too, their
tokenizer round-trips every id through text, and float32 stays within the stated tolerance."""

from __future__ import annotations

import json
import re

import pytest
import torch

from properties.serve import __main__ as cli
from properties import oracle
from properties.export import kit as export
from properties.models import tokenizer
from properties.adapters.served import LOGIT_TOLERANCE
from properties.models.served import MODELS, VOCAB


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export.export(tmp_path_factory.mktemp("served"))


def test_export_writes_every_model_and_reads_back_exactly(exported):
    assert set(exported) == set(MODELS)
    for name, path in exported.items():
        for file in ("config.json", "model.safetensors", "generation_config.json",
                     "tokenizer.json", "tokenizer_config.json"):
            assert (path / file).is_file(), (name, file)
        config = json.loads((path / "config.json").read_text())
        assert config["head_dim"] in (64, 128) and config["vocab_size"] == VOCAB
        export.check_export(name, path)
    with pytest.raises(ValueError, match="differs"):
        export.check_export("target", exported["draft-random"])


def test_tokenizer_round_trips_every_id():
    ids = list(range(VOCAB)) + [5, 5, 31, 0]
    assert tokenizer.encode(tokenizer.decode(ids)) == ids
    built = tokenizer.build()
    assert built.encode(tokenizer.decode(ids)).ids == ids
    assert built.decode(ids) == tokenizer.decode(ids)
    with pytest.raises(tokenizer.TokenizeError, match="character ' ' at offset 1"):
        tokenizer.encode("a b")
    with pytest.raises(tokenizer.TokenizeError, match="token id 32 at position 0"):
        tokenizer.decode([32])


def test_transformers_loads_the_export_in_float32_within_the_tolerance(exported):
    transformers = pytest.importorskip("transformers")
    path = exported["target"]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = [3, 9, 27, 3, 9, 27, 0, 31, 12]
    assert tok(tokenizer.decode(ids))["input_ids"] == ids
    assert tok.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        got = model(torch.tensor([ids])).logits[0, :-1].double()
    exact = oracle.served_logits(ids[:1], ids[1:])
    # the measured float32 deviation is what LOGIT_TOLERANCE (greedy ties) must exceed widely
    assert (got - exact).abs().max() < LOGIT_TOLERANCE / 10


def test_cli_export_prints_every_server_recipe(tmp_path, capsys, monkeypatch):
    # the served heads' writing is tests/test_export_heads.py's (test_the_export_command_writes_
    # the_declared_heads); here the command only has to ask for them and list each, which spares
    # building every served head again in this worker (20 of this test's 25 s, 2026-12-07)
    from properties.export import heads
    asked = []

    def export_declared(directory):
        asked.append(directory)
        return {"head-x": tmp_path / "out" / "head-x"}

    monkeypatch.setattr(heads, "export_declared", export_declared)
    assert cli.main(["export", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert asked == [str(tmp_path / "out")]
    assert f"# head-x: {tmp_path / 'out' / 'head-x'}  (a feature-level head" in text
    for needle in ("transformers serve", "prompt_lookup_num_tokens", "--speculative-config",
                   '"method": "ngram"', "sglang.launch_server", "convert_hf_to_gguf.py",
                   "llama-server", "--impl=openai:"):
        assert needle in text, needle
    file = tmp_path / "a-file"
    file.write_text("")
    assert cli.main(["export", str(file)]) == 2
    assert "DIR=" in capsys.readouterr().err


def test_cli_export_models_trained_large_writes_the_weight_bound_pair(tmp_path, capsys):
    """`export --models trained-large`: the 8-layer target of hidden 384 and its own small
    draft of head_dim 32, which every engine's declared head sizes take (no warning)."""
    import warnings
    from properties.export import trained
    large = trained.PAIRS["trained-large"]
    if not (large / "manifest.json").is_file():
        pytest.skip(f"no weight-bound pair at {large}: run `make models-large`")
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # a head size some engine refuses would warn
        assert cli.main(["export", str(tmp_path), "--models", "trained-large"]) == 0
    text = capsys.readouterr().out
    assert "the weight-bound trained target" in text and "# the trained-large pair" in text
    config = {name: json.loads((tmp_path / name / "config.json").read_text())
              for name in ("target", "draft-small", "draft-early-exit")}
    assert (config["target"]["hidden_size"], config["target"]["num_hidden_layers"]) == (384, 8)
    assert config["draft-small"]["head_dim"] == 32
    assert config["draft-early-exit"]["hidden_size"] == 384
    # the same tokenizer as the committed pair, written beside each model
    assert (tmp_path / "target" / "tokenizer.json").read_text() == \
        (large / "tokenizer.json").read_text()


def test_cli_export_models_trained_large_without_the_pair_names_its_make_target(
        tmp_path, capsys, monkeypatch):
    from properties.export import trained
    monkeypatch.setitem(trained.PAIRS, "trained-large", tmp_path / "nowhere")
    assert cli.main(["export", str(tmp_path / "out"), "--models", "trained-large"]) == 2
    err = capsys.readouterr().err
    assert "--models trained-large" in err and "make models-large" in err
    assert not (tmp_path / "out").exists()


def test_methods_lists_what_make_engines_runs(capsys):
    """`python -m properties.serve methods` (what make engines runs): every declared method of
    each engine, left out exactly where the method object says why (a trained pair's only, or
    refused on this machine with the engine's message); --all names the reason."""
    from properties import engines
    assert cli.main(["methods", "vllm", "llamacpp"]) == 0
    listed = set(capsys.readouterr().out.split())
    for name in ("vllm", "llamacpp"):
        for method in engines.get(name).methods.values():
            left_out = method.drafter.trained_only or method.refused is not None
            assert (f"{name}:{method.name}" in listed) == (not left_out), method.name
    assert "vllm:draft-early-exit" in listed and "vllm:draft-early-exit-synthetic" not in listed
    assert cli.main(["methods", "--all", "vllm"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "Synthetic acceptance not supported" in lines["vllm:draft-early-exit-synthetic"]
    assert "trained pair" in lines["vllm:draft-small"]
    assert cli.main(["methods", "nosuchengine"]) == 2
    assert "ENGINE='nosuchengine'" in capsys.readouterr().err


def test_methods_lists_the_trained_runs_each_method_declares(capsys):
    """A method's trained pairs (Method.pairs) are listed as ENGINE:METHOD:PAIR after the kit's
    runs, except where the launcher would refuse the pair before starting (vLLM's CPU attention
    takes no head_dim 24, the committed small draft's), which --all names."""
    from properties import engines
    assert cli.main(["methods", "vllm", "llamacpp"]) == 0
    order = capsys.readouterr().out.split()
    listed = set(order)
    for name in ("vllm", "llamacpp"):
        for method in engines.get(name).methods.values():
            for pair in method.pairs:
                if (name, method.name, pair) != ("vllm", "draft-small", "trained"):
                    assert f"{name}:{method.name}:{pair}" in listed, (method.name, pair)
    assert "vllm:draft-small:trained" not in listed
    assert "vllm:draft-small:trained-large" in listed
    assert "llamacpp:eagle3-trained-large:trained-large" in listed
    assert "llamacpp:eagle3-trained-large:trained" not in listed   # its head reads layers 1, 4, 7
    assert order.index("llamacpp:eagle3") < order.index("vllm:draft-early-exit:trained")
    assert cli.main(["methods", "--all", "vllm"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "head_dim=24" in lines["vllm:draft-small:trained"]


@pytest.mark.parametrize("pairs, words", [(("trained", "nosuch"), "pairs=('trained', 'nosuch')"),
                                          (["trained"], "must be a tuple")])
def test_method_pairs_must_name_trained_pairs(pairs, words):
    from properties.methods import EARLY_EXIT, Method
    with pytest.raises(ValueError, match=re.escape(words)):
        Method("m", "d", EARLY_EXIT, pairs=pairs)


def test_a_trained_only_drafter_names_its_pairs():
    from properties.methods import SMALL, Method
    with pytest.raises(ValueError, match=r"pairs=\(\) must name the pairs"):
        Method("draft-small", "d", SMALL)


def test_exact_counts_beside_the_engines_own():
    """The launcher's evidence replays its greedy requests' counts where the kit replays the
    drafter: the target drafting for itself has every drafted token accepted; a draft unlike
    the target has fewer; a lookup (not replayed) or an engine with no declared schedule gets
    none."""
    from types import SimpleNamespace
    from properties.methods import EARLY_EXIT, LOOKUP, PERFECT, Method
    from properties.adapters.dialects import Dialect
    from properties.serve import speed
    engine = SimpleNamespace(schedule="full", dialect=Dialect())
    requests = [(speed.PROMPTS[0], speed.TOKENS)]
    perfect = speed.exact_counts(engine, Method("p", "", PERFECT, 4), requests)
    assert perfect["drafted"] > 0 and perfect["accepted"] == perfect["drafted"]
    early = speed.exact_counts(engine, Method("e", "", EARLY_EXIT, 4), requests)
    assert early["drafted"] > 0 and early["accepted"] < early["drafted"]
    assert speed.exact_counts(engine, Method("n", "", LOOKUP, 4), requests) is None
    assert speed.exact_counts(SimpleNamespace(schedule=None), Method("p", "", PERFECT, 4),
                              requests) is None
