"""A head's checkpoint: config.json (its kind, the target's shapes, the hidden-state convention
and the kind's options) and model.safetensors (the head's own weights only: a head that borrows
the target's embedding, norm or lm_head is loaded beside that target)."""

import json
from dataclasses import asdict, fields
from pathlib import Path

from reference.checkpoint import _DTYPE_NAMES, _safetensors
from reference.heads import KINDS
from reference.heads.dflash import DFlashHead
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads
from reference.heads.mtp import MTPLayer
from reference.hidden import HiddenStates
from reference.model import Config


def save_head(head, path, dtype=None) -> Path:
    """Write `head` to the folder `path`, its weights in `dtype` (default: as they are)."""
    kind = next((k for k, cls in KINDS.items() if isinstance(head, cls)), None)
    if kind is None:
        raise TypeError(f"save_head needs a reference head ({', '.join(KINDS)}), got "
                        f"{type(head).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    dtype = dtype or next(t.dtype for t in state.values() if t.is_floating_point())
    state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    options = {}
    if isinstance(head, MedusaHeads):
        options = {"num_heads": head.num_heads, "num_layers": len(head.blocks[0].layers)}
    elif isinstance(head, MTPLayer):
        options = {"order": head.order, "recycle": head.recycle} | (
            {"lead": True} if head.lead else {}) | ({"mask0": True} if head.mask0 else {})
    elif isinstance(head, Eagle3Head) and not head.qk_norm:
        options = {"qk_norm": False}
    elif isinstance(head, DFlashHead):
        options = {"block_size": head.block_size, "mask_token_id": head.mask_token_id,
                   "num_layers": len(head.layers), "own_lm_head": head.own_lm_head}
        if hasattr(head, "markov_rank"):        # DSpark
            options["markov_rank"] = head.markov_rank
    config = {"kind": kind, "target": asdict(_target_config(head)),
              "hidden": asdict(head.hidden) | {"layers": list(head.hidden.layers)},
              "options": options, "torch_dtype": _DTYPE_NAMES[dtype]}
    if getattr(head, "draft_to_target", None) is not None:
        config["draft_vocab_size"] = len(head.draft_to_target)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _safetensors().save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_head(path, target, dtype=None):
    """The head saved at `path`, for `target` (whose shapes it must have), in `dtype` (default:
    the target's), in eval mode without gradients."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    kind = config.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{path}/config.json has kind={kind!r}, expected one of {sorted(KINDS)}")
    shapes = Config(**{f.name: config["target"][f.name] for f in fields(Config)
                       if f.name in config["target"]})
    if shapes != target.config:
        raise ValueError(f"the head at {path} was made for a target of config {shapes}, not "
                         f"this one ({target.config})")
    hidden = HiddenStates(tuple(config["hidden"]["layers"]), config["hidden"]["where"],
                          config["hidden"]["normed"])
    state = _safetensors().load_file(str(path / "model.safetensors"))
    options = dict(config.get("options", {}))
    if kind == "eagle3":
        d2t = state.get("draft_to_target")
        head = Eagle3Head(shapes, hidden, None if d2t is None else d2t.tolist(), **options)
    elif kind == "medusa":
        head = MedusaHeads(shapes, hidden=hidden, **options)
    else:
        head = KINDS[kind](target, hidden, **options)
    head.load_state_dict(state, strict=True)
    dtype = dtype or target.lm_head.weight.dtype
    return head.to(dtype=dtype, device=target.lm_head.weight.device).eval().requires_grad_(False)


def _target_config(head) -> Config:
    """The config of the target the head was made for (the convention is checked against its
    depth): EAGLE-3 keeps it, Medusa's config is it, the others hold the target."""
    if isinstance(head, Eagle3Head):
        return head.target_config
    if isinstance(head, MedusaHeads):
        return head.config
    return head.target.config
