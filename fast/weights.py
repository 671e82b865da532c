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
"""

import weakref
from dataclasses import dataclass

import torch

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


# Fused copies per decoder layer: layer module -> (fingerprint, LayerWeights).
_FUSED = weakref.WeakKeyDictionary()


def _fingerprint(module) -> tuple:
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in module.parameters())


def _fuse_layer(block) -> LayerWeights:
    key = _fingerprint(block)
    hit = _FUSED.get(block)
    if hit is not None and hit[0] == key:
        return hit[1]
    attn, mlp = block.self_attn, block.mlp
    head_dim = attn.q_norm.weight.shape[0]
    heads, kv_heads = attn.q_proj.weight.shape[0] // head_dim, attn.k_proj.weight.shape[0] // head_dim
    with torch.no_grad():
        fused = LayerWeights(
            input_norm=block.input_layernorm.weight.detach(),
            qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
            qk_norm=torch.cat([attn.q_norm.weight.expand(heads, -1),
                               attn.k_norm.weight.expand(kv_heads, -1)]).detach(),
            o=attn.o_proj.weight.detach(),
            post_norm=block.post_attention_layernorm.weight.detach(),
            gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
            down=mlp.down_proj.weight.detach(),
        )
    _FUSED[block] = (key, fused)
    return fused


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
                        norm=module.model.norm.weight.detach(), lm_head=module.lm_head.weight.detach())
