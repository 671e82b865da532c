"""(w) Which target would speculation pay on, on this machine: step costs by target size.

Speculation at batch 1 pays by the arithmetic of one round: a verify of k + 1 tokens plus k draft
steps, in units of the target's decode step, against the tokens per target call it yields. Issue
24 asks for a target whose step is bound by reading its weights, where a draft step costs at most
0.1 decode steps and a verify of 5 tokens at most 1.1. This file measures both ratios in the fast
engine (its kernels and static cache, one intra-op thread, batch 1, after a 48-token prompt), with
its few-row matmul kernel (fast/small_m.py) and, alternating with it, on torch's BLAS, for
Qwen3-style targets from the committed trained target's shape up to one far larger than the
CPU's last-level cache, each against a draft of the committed small draft's shape. The weights
are random: a step's time does not depend on their values.

Each shape reports verify / decode and draft / decode, and the bound they put on speculative /
plain decoding if the pair were as well matched as the committed one (its small draft's greedy
tokens per target call, from reference/trained/manifest.json):
tokens per call / (verify + k draft). Untimed (the smoke run) each shape runs once: about 2 s in all.
"""

import json
import time

import pytest
import torch

from fast import small_m
from fast.graphs import StepRunner
from fast.runner import ModelRunner
from fast.weights import model_weights
from reference.model import Config, Qwen3
from reference.pretrained import TRAINED_DIR

K, PROMPT = 4, 48
# name -> (hidden, intermediate, layers, heads, kv heads); head_dim = hidden / heads, 32 or 64
SHAPES = {
    "128x6 (the trained target)": (128, 384, 6, 4, 2),
    "256x8": (256, 768, 8, 8, 2),
    "384x8": (384, 1152, 8, 6, 2),
    "512x8": (512, 1536, 8, 8, 2),
    "768x8": (768, 2304, 8, 12, 4),
    "1024x8": (1024, 3072, 8, 16, 4),
}


def config(hidden, intermediate, layers, heads, kv_heads) -> Config:
    return Config(vocab_size=2048, hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  tie_word_embeddings=True)


def runner(model_config: Config, prompt) -> ModelRunner:
    torch.manual_seed(0)
    model = Qwen3(model_config).eval()
    run = ModelRunner(model_weights(model), 1, PROMPT + 16, StepRunner(False, "cpu"))
    run.prefill(prompt, torch.tensor([PROMPT]))
    return run


@pytest.fixture(scope="module")
def committed():
    manifest = json.loads((TRAINED_DIR / "manifest.json").read_text())
    small = Config(**manifest["recipe"]["small"])
    return small, manifest["acceptance"]["small"]["T=0"]["tokens_per_target_call"]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_w_step_costs_by_size(benchmark, figures, committed, shape):
    small, per_call = committed
    benchmark.group = "(w) step costs by target size, fast, B=1"
    prompt = torch.randint(0, 2048, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    target, draft = runner(config(*SHAPES[shape]), prompt), runner(small, prompt)
    start = torch.tensor([PROMPT])
    # the engine's matmuls (fast/small_m.py's kernel where it applies), and beside them the
    # same steps on torch's BLAS (F.linear), alternating, so both are measured under one load
    steps = {"decode": (target, 1, True), "verify": (target, K + 1, True),
             "draft": (draft, 1, True), "decode_blas": (target, 1, False),
             "verify_blas": (target, K + 1, False)}
    best = {name: float("inf") for name in steps}

    def one_each():
        with torch.no_grad():
            for name, (run, T, kernel) in steps.items():
                with small_m.enabled(kernel):
                    t0 = time.perf_counter()
                    run.chain(prompt[:, :T], start, PROMPT + T, "last" if T == 1 else "all")
                    best[name] = min(best[name], time.perf_counter() - t0)

    # fewer rounds for the large shapes: a verify of the largest costs tens of milliseconds
    benchmark.pedantic(one_each, rounds=1 if benchmark.disabled else 40, warmup_rounds=0)
    if benchmark.disabled:
        return
    verify, draft_cost = best["verify"] / best["decode"], best["draft"] / best["decode"]
    blas = best["verify_blas"] / best["decode_blas"]
    parameters = sum(p.numel() for p in Qwen3(config(*SHAPES[shape])).parameters())
    bound = per_call / (verify + K * draft_cost)
    benchmark.extra_info.update({"parameters": parameters, "decode_ms": best["decode"] * 1e3,
                                 "verify_over_decode": verify, "draft_over_decode": draft_cost,
                                 "bound_at_committed_tokens_per_call": bound,
                                 "blas_decode_ms": best["decode_blas"] * 1e3,
                                 "blas_verify_over_decode": blas,
                                 "kernel_over_blas_decode": best["decode"] / best["decode_blas"],
                                 "kernel_over_blas_verify": best["verify"] / best["verify_blas"]})
    ms = (f"decode {best['decode'] * 1e3:.2f} ms, {parameters / 1e6:.1f}M parameters; on "
          f"torch's BLAS: verify / decode {blas:.2f}, decode {best['decode_blas'] * 1e3:.2f} ms")
    figures.ratio(benchmark, f"(w) {shape}: verify {K + 1} / decode", verify, "<= 1.1",
                  verify <= 1.1, ms)
    figures.ratio(benchmark, f"(w) {shape}: small draft step / decode", draft_cost, "<= 0.1",
                  draft_cost <= 0.1, f"draft {best['draft'] * 1e3:.2f} ms")
    figures.ratio(benchmark, f"(w) {shape}: spec / plain bound, B=1", bound, ">= 1.5",
                  bound >= 1.5, f"{per_call:.2f} tokens per call / ({verify:.2f} + {K} x "
                  f"{draft_cost:.3f})")
