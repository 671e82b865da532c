"""The fast engine's view of a Qwen3-family model: its weights, fused where that saves a matmul.

The engine never calls a model's own forward. It reads the parameters of a `reference.model`
Qwen3 or EarlyExit (or any module laid out with the Hugging Face Qwen3 names, possibly behind
kit wrappers that expose the real module as `.module`) and runs its own batched forward over
them (fast/forward.py). Fusing q/k/v into one matrix and gate/up into another copies those
weights once; the copies are cached per decoder layer, so an early-exit draft that shares the
target's first layers also shares their fused copies.

The cache is keyed on each parameter's storage pointer and version counter: an in-place update
of a weight bumps its version and the stale fused copy is rebuilt, so the engine never runs on
weights the model no longer has.

Huge pages. A decode step streams every matrix once; on 4 KB pages that is a TLB miss every 4 KB
(the large trained target's 60 MB are 15,000 pages, several times what a core's TLB holds), and
the CPU's prefetchers stop at each page's end. Where Linux grants 2 MB pages on request
(transparent huge pages in "madvise" or "always" mode) and a layer's matrices fill at least one,
the engine copies all of them, and the output head, into one 2 MB-aligned block advised for huge
pages: on the large target a decode step 6-10% and a verify of 5 tokens 8-14% faster (paired
medians, one thread; BENCHMARKS.md, issue 24). The price is memory: the attention output and
down projections and the output head become copies too (the fused q/k/v and gate/up always
were), 37% of the large target's weights again. FAST_HUGE_PAGES=0 in the environment turns it
off. The arithmetic is the same either way, so the outputs are too, bit for bit
(tests/test_fast_weights.py).
"""

import mmap
import sys
import weakref
from dataclasses import dataclass

import torch

from fast import native

# The engine runs only models of these families (the kit reads this to decide what to hand us).
KIT_MODEL_KINDS = {"qwen3"}


def unwrap(model):
    """Peel kit wrappers (objects exposing the real module as `.module`) off a model."""
    seen = 0
    while hasattr(model, "module") and seen < 16:
        model = model.module
        seen += 1
    return model


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float
    num_layers: int


@dataclass
class LayerWeights:
    input_norm: torch.Tensor     # [hidden]
    qkv: torch.Tensor            # [(heads + 2 kv_heads) * head_dim, hidden]
    qk_norm: torch.Tensor        # [heads + kv_heads, head_dim]: q_norm per query head, then k_norm
    o: torch.Tensor              # [hidden, heads * head_dim]
    post_norm: torch.Tensor      # [hidden]
    gate_up: torch.Tensor        # [2 * intermediate, hidden]
    down: torch.Tensor           # [hidden, intermediate]


@dataclass
class ModelWeights:
    shape: Shape
    embed: torch.Tensor          # [vocab, hidden]
    layers: list                 # of LayerWeights
    norm: torch.Tensor           # [hidden]
    lm_head: torch.Tensor        # [vocab, hidden]

    @property
    def dtype(self):
        return self.embed.dtype

    @property
    def device(self):
        return self.embed.device


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # newer Hugging Face configs keep it under rope_parameters
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    return float(theta) if theta is not None else 10000.0


def _layers_of(module):
    if hasattr(module, "layers"):
        return list(module.layers)
    return list(module.model.layers)


def _describe(model) -> str:
    return f"{type(model).__name__} object"


def check_model(model, argument: str):
    """Unwrap and check that `model` is a Qwen3-family module; ValueError naming `argument` if not."""
    module = unwrap(model)
    try:
        config = module.config
        layers = _layers_of(module)
        attn = layers[0].self_attn
        needed = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.q_norm, attn.k_norm,
                  layers[0].mlp.gate_proj, layers[0].mlp.up_proj, layers[0].mlp.down_proj,
                  layers[0].input_layernorm, layers[0].post_attention_layernorm,
                  module.model.embed_tokens, module.model.norm, module.lm_head,
                  config.num_attention_heads, config.num_key_value_heads, config.vocab_size)
        del needed
    except (AttributeError, IndexError, TypeError) as error:
        raise ValueError(f"{argument} must be a Qwen3-family model (one of {sorted(KIT_MODEL_KINDS)}), "
                         f"got {_describe(model)} ({error})") from None
    return module


# On unless FAST_HUGE_PAGES=0; `huge_pages.enabled(False)` builds weights without them (the
# benchmarks time both). Weights already built keep the memory they were built in.
huge_pages = native.Switch("FAST_HUGE_PAGES")

HUGE_PAGE = 2 << 20     # bytes: the page transparent huge pages give on x86-64 (and 4 KB-page arm64)


def huge_pages_mode() -> str:
    """Linux's transparent huge page mode ("always", "madvise" or "never"), or why there is none."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return f"none on {sys.platform}"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as modes:
            text = modes.read()
    except OSError as error:
        return f"unknown ({error.strerror})"
    # "always [madvise] never": the chosen mode in brackets
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def _huge_block(nbytes: int) -> torch.Tensor:
    """nbytes of fresh memory starting on a 2 MB boundary, its whole 2 MB pages advised for huge
    pages: a private anonymous mapping one page longer than asked, so that a boundary falls in it.
    The part before the boundary and the tail after nbytes are never touched, so they take no
    memory; the tail short of a whole page stays on 4 KB pages (advising it would round it up to
    2 MB of memory). The mapping lives as long as a tensor viewing it (torch.frombuffer holds it)."""
    block = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(block, dtype=torch.uint8)          # [nbytes + HUGE_PAGE]
    skip = -whole.data_ptr() % HUGE_PAGE
    try:
        block.madvise(mmap.MADV_HUGEPAGE, skip, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError:     # a kernel built without huge pages: the memory is still good memory
        pass
    return whole[skip:skip + nbytes]


def huge_page_bytes(weights: "ModelWeights") -> int:
    """Bytes of the weights' matrices that Linux holds on huge pages now (0 elsewhere): the
    AnonHugePages of every mapping their memory overlaps, from /proc/self/smaps. What was asked
    for is only advice; this is what the kernel granted."""
    spans = [(m.data_ptr(), m.data_ptr() + m.numel() * m.element_size())
             for layer in weights.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    spans.append((weights.lm_head.data_ptr(),
                  weights.lm_head.data_ptr() + weights.lm_head.numel() * weights.lm_head.element_size()))
    try:
        with open("/proc/self/smaps") as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return 0
    total, overlaps = 0, False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and ":" not in head:     # "start-end perms offset ...": a new mapping
            start, end = (int(bound, 16) for bound in head.split("-"))
            overlaps = any(a < end and b > start for a, b in spans)
        elif overlaps and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def _matrices(groups: list) -> list:
    """Each group of matrices stacked by rows into one (q, k, v -> qkv), detached. On huge pages
    (the module's docstring) when they are on and granted, the matrices are CPU tensors of one
    dtype and fill at least one: every matrix is then a copy in one shared block, each starting
    on a 64-byte line. Otherwise a group of one is the parameter itself, not a copy."""
    parts = [p for group in groups for p in group]
    dtype, itemsize = parts[0].dtype, parts[0].element_size()
    line = 64 // itemsize
    sizes = [-(-sum(p.numel() for p in group) // line) * line for group in groups]
    if (not huge_pages.on or sum(sizes) * itemsize < HUGE_PAGE
            or any(p.device.type != "cpu" or p.dtype != dtype or p.dim() != 2 for p in parts)
            or huge_pages_mode() not in ("always", "madvise")):
        return [torch.cat(group).detach() if len(group) > 1 else group[0].detach() for group in groups]
    flat = _huge_block(sum(sizes) * itemsize).view(dtype)     # [sum(sizes)]
    stacked, start = [], 0
    for group, size in zip(groups, sizes):
        rows, width = sum(p.shape[0] for p in group), group[0].shape[1]
        matrix = flat[start:start + rows * width].view(rows, width)
        torch.cat([p.detach() for p in group], out=matrix)
        stacked.append(matrix)
        start += size
    return stacked


# Fused copies per decoder layer: layer module -> (fingerprint, LayerWeights).
_FUSED = weakref.WeakKeyDictionary()


def _fingerprint(module) -> tuple:
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in module.parameters())


def kept(store, owner, key: tuple, build):
    """build()'s result, made once per owner and kept in store (a WeakKeyDictionary owner ->
    (key, result)) while key -- a fingerprint of the owner's weights -- stays the same: the fast
    copies of a module's weights, rebuilt when they change in place or are replaced."""
    hit = store.get(owner)
    if hit is not None and hit[0] == key:
        return hit[1]
    made = build()
    store[owner] = (key, made)
    return made


def _fuse_layer(block) -> LayerWeights:
    return kept(_FUSED, block, _fingerprint(block) + (huge_pages.on,), lambda: _fused_of(block))


def _fused_of(block) -> LayerWeights:
    attn, mlp = block.self_attn, block.mlp
    head_dim = attn.q_norm.weight.shape[0]
    heads, kv_heads = attn.q_proj.weight.shape[0] // head_dim, attn.k_proj.weight.shape[0] // head_dim
    with torch.no_grad():
        qkv, o, gate_up, down = _matrices([
            [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], [attn.o_proj.weight],
            [mlp.gate_proj.weight, mlp.up_proj.weight], [mlp.down_proj.weight]])
        fused = LayerWeights(
            input_norm=block.input_layernorm.weight.detach(),
            qkv=qkv,
            qk_norm=torch.cat([attn.q_norm.weight.expand(heads, -1),
                               attn.k_norm.weight.expand(kv_heads, -1)]).detach(),
            o=o,
            post_norm=block.post_attention_layernorm.weight.detach(),
            gate_up=gate_up,
            down=down,
        )
    return fused


# The output head per model: lm_head module -> (fingerprint, matrix), as for the layers.
_HEADS = weakref.WeakKeyDictionary()


def _head(lm_head) -> torch.Tensor:
    def build():
        with torch.no_grad():
            return _matrices([[lm_head.weight]])[0]
    return kept(_HEADS, lm_head, _fingerprint(lm_head) + (huge_pages.on,), build)


def model_weights(model, argument: str = "model") -> ModelWeights:
    """The weights of a (possibly wrapped) Qwen3-family model, q/k/v and gate/up fused."""
    module = check_model(model, argument)
    config = module.config
    layers = _layers_of(module)
    eps = float(getattr(config, "rms_norm_eps", 1e-6))
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    shape = Shape(vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_heads=heads,
                  num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=_rope_theta(config), eps=eps,
                  num_layers=len(layers))
    return ModelWeights(shape=shape, embed=module.model.embed_tokens.weight.detach(),
                        layers=[_fuse_layer(block) for block in layers],
                        norm=module.model.norm.weight.detach(), lm_head=_head(module.lm_head))
