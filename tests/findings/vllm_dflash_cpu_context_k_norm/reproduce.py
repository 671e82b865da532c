"""vLLM 0.32.0 (CPU build): a DFlash drafter of more than one layer drafts with layer 0's k_norm
on every layer's context keys.

DFlash's context keys are computed for all draft layers at once: the per-layer k_norm weights
are stacked into one [num_layers, head_dim] tensor (model_executor/models/qwen3_dflash.py:
552-555, `_k_norm_weights`) and handed to one "grouped" RMSNorm over keys shaped
[num_layers, tokens, kv_heads, head_dim] (`_normalize_context_k`, :639-649, called at :683: "The weight is
selected per layer by the outermost (layer) index"). The CPU build's kernel
(torch.ops._C.rms_norm, reached through vllm._custom_ops.rms_norm) reads only the first
head_dim weights, so every layer's context keys are normed with layer 0's weight. A one-layer
drafter is unaffected.

Standalone (no import of the conformance kit): run it with vLLM's Python.

    .engines/vllm/bin/python tests/findings/vllm_dflash_cpu_context_k_norm/reproduce.py

It calls the kernel as _normalize_context_k does, on random keys of two layers with different
k_norm weights, and compares with RMSNorm by layer and with layer 0's weight everywhere.
Exit status 0 when the finding reproduces (layer 1's rows equal the layer-0-weight norm and
differ from their own), 1 otherwise.
"""

import sys

import torch
import vllm._custom_ops as ops

EPS = 1e-6


def rms(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def main() -> int:
    torch.manual_seed(0)
    layers, tokens, kv_heads, head_dim = 2, 5, 2, 32
    keys = torch.randn(layers, tokens, kv_heads, head_dim)
    weights = torch.randn(layers, head_dim)             # each layer's own k_norm weight
    out = torch.empty_like(keys)
    ops.rms_norm(out, keys, weights.contiguous(), EPS)  # as _normalize_context_k calls it
    by_layer = torch.stack([rms(keys[i], weights[i]) for i in range(layers)])
    layer0 = rms(keys, weights[0])
    own = (out[1] - by_layer[1]).abs().max().item()
    first = (out[1] - layer0[1]).abs().max().item()
    print(f"vllm {__import__('vllm').__version__}, torch {torch.__version__}")
    print(f"layer 0 rows vs their own weight: max |diff| {(out[0] - by_layer[0]).abs().max():.3g}")
    print(f"layer 1 rows vs their own weight (expected 0): max |diff| {own:.3g}")
    print(f"layer 1 rows vs layer 0's weight: max |diff| {first:.3g}")
    reproduced = own > 1e-3 and first < 1e-6
    print("REPRODUCED: every layer normed with layer 0's k_norm weight" if reproduced
          else "not reproduced: the kernel applies each layer's weight")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
