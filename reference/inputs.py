"""What the public generate functions accept: every argument is checked, none is clamped."""

import torch


def vocab_size(model):
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None)


def device_of(model):
    return next(model.parameters()).device


def prompt_tensor(prompt_ids):
    """One sequence of token ids, [T] or a batch of one [1, T]; anything nested is refused
    rather than flattened (a batch of prompts is not one prompt)."""
    try:
        ids = torch.as_tensor(prompt_ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"prompt_ids must be a sequence of token ids, got {prompt_ids!r} "
                         f"({error})") from None
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"prompt_ids must be one sequence of token ids ([T] or [1, T]), got "
                         f"shape {tuple(ids.shape)}: {prompt_ids!r}")
    return ids


def stop_set(stop_ids):
    if isinstance(stop_ids, (str, bytes)) or not hasattr(stop_ids, "__iter__"):
        hint = f"; write ({stop_ids!r},)" if isinstance(stop_ids, int) else ""
        raise TypeError(f"stop_ids must be a collection of token ids, got {stop_ids!r} "
                        f"({type(stop_ids).__name__}){hint}")
    stop = set()
    for s in stop_ids:
        if torch.is_tensor(s) and s.numel() == 1 and not s.is_floating_point():
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"stop_ids must hold int token ids, got {s!r} "
                            f"({type(s).__name__}) in {stop_ids!r}")
        stop.add(s)
    return stop


def check_generate_args(target, prompt_ids, max_new_tokens, stop_ids):
    """-> (prompt ids as a long tensor [T], stop ids as a set)."""
    ids = prompt_tensor(prompt_ids)
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty: speculation needs at least one prompt token")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"prompt_ids must be integer token ids, got dtype {ids.dtype}")
    vocab = vocab_size(target)
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0].item()
        raise ValueError(f"prompt_ids holds token id {bad}, outside the vocabulary [0, {vocab})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return ids.long(), stop_set(stop_ids)


def check_k(k):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")


def check_same_vocabulary(draft, target):
    if vocab_size(draft) != vocab_size(target):
        raise ValueError(f"draft and target must share a vocabulary: draft vocab_size="
                         f"{vocab_size(draft)}, target vocab_size={vocab_size(target)}")
