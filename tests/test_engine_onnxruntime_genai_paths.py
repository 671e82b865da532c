"""onnxruntime-genai 0.18.0's other speculative paths (issue 40): the caller-supplied drafts of
its Engine API, declared as the refused method `caller-drafts` with the engine's words and the
GPU recipe, and asked for by the worker at start (the engine refuses them there, in its own
words); with the engine installed (extra), that start on the converted kit target."""

import json
import subprocess
from pathlib import Path

import pytest

from properties.engines import onnxruntime_genai as ort
from properties.engines.inprocess import __file__ as WORKER
from properties.methods import Scripted


def test_caller_drafts_are_declared_refused_with_the_engines_words_and_a_recipe():
    method = ort.METHODS["caller-drafts"]
    assert isinstance(method.drafter, Scripted) and method.drafter.script == "right-then-wrong"
    assert "This engine does not support speculative draft verification." in method.refused
    assert "requires CUDA with FP16/BF16 or WebGPU with FP16, not (cpu, FLOAT)" in method.refused
    assert "use_paged_attention=true" in method.refused and "-e cuda" in method.refused
    # the other methods run here
    assert [m for m, d in ort.METHODS.items() if d.refused] == ["caller-drafts"]


def test_only_the_scripted_method_asks_the_engine_for_caller_drafts(tmp_path):
    def config(method):
        argv = [str(a) for a in ort.command(None, tmp_path, method, 8000).argv]
        return json.loads(argv[argv.index("--config") + 1])
    assert config(ort.METHODS["caller-drafts"])["caller_drafts"] is True
    assert config(ort.METHODS["caller-drafts"])["model"].endswith("onnxruntime-genai/target")
    for name in ("draft-early-exit", "ngram"):
        assert config(ort.METHODS[name])["caller_drafts"] is False
    assert config(None)["caller_drafts"] is False


def test_the_docstring_says_what_the_version_offers():
    text = ort.__doc__
    for said in ("Request.set_draft_tokens", "max_draft_tokens_per_proposal", "og.MtpGenerator",
                 "mtp_num_hidden_layers", "dflash2_path", "dspark_path",
                 "EAGLE, EAGLE-3, Medusa: not offered in 0.18.0"):
        assert said in text, said


@pytest.mark.extra
def test_the_worker_start_meets_the_engines_refusal(tmp_path):
    """The kit's served target converted by the builder (float32, CPU; about 15 s), then the
    worker started for `caller-drafts`: it exits with the engine's own refusal."""
    try:
        env = ort.find()
    except Exception as exc:
        pytest.skip(str(exc))
    from properties.export import kit
    export = tmp_path / "export"
    kit.export_model("target", export / "target")
    ort.convert(export / "target", ort.models_dir(export) / "target", ort.site_packages(env))
    step = ort.command(env, export, ort.METHODS["caller-drafts"], 1)
    done = subprocess.run([str(a) for a in step.argv], capture_output=True, text=True,
                          timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "This engine does not support speculative draft verification." in done.stderr
    assert str(step.argv[1]) == str(Path(WORKER).resolve())
