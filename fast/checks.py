"""Argument validation for the fast engine, done before any work.

Every bad argument is a ValueError that names the argument and shows the value, so a caller
sees what to fix; nothing is silently clamped. The round loop itself never validates (that
would read device values on the host every round).
"""

import torch

from reference.sampling import check_sampling_args


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_k(k, max_k: int | None = None) -> int:
    if not _is_int(k) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if max_k is not None and k > max_k:
        raise ValueError(f"k={k} is larger than this engine's captured steps allow (max_k={max_k})")
    return k


def check_prompts(prompts, vocab_size: int, name: str = "prompts") -> list[list[int]]:
    if torch.is_tensor(prompts) and prompts.dim() == 2:
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"{name} must be a non-empty list of token-id lists, got {prompts!r}")
    return [check_prompt(prompt, vocab_size, f"{name}[{i}]") for i, prompt in enumerate(prompts)]


def check_prompt(prompt, vocab_size: int, name: str = "prompt_ids") -> list[int]:
    if torch.is_tensor(prompt):
        if prompt.is_floating_point() or prompt.dim() > 2 or (prompt.dim() == 2 and prompt.shape[0] != 1):
            raise ValueError(f"{name} must be a 1-D integer tensor or a list of ints, got "
                             f"{prompt.dtype} tensor of shape {tuple(prompt.shape)}")
        prompt = prompt.reshape(-1).tolist()
    if not isinstance(prompt, (list, tuple)) or not all(_is_int(t) for t in prompt):
        raise ValueError(f"{name} must be a list of int token ids, got {prompt!r}")
    if len(prompt) == 0:
        raise ValueError(f"{name} must hold at least one token, got an empty prompt {prompt!r}")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} has token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    return list(prompt)


def check_max_new(max_new_tokens, batch: int) -> list[int]:
    if _is_int(max_new_tokens):
        values = [max_new_tokens] * batch
    elif isinstance(max_new_tokens, (list, tuple)):
        if len(max_new_tokens) != batch:
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries but there are {batch} "
                             f"prompts: {list(max_new_tokens)!r}")
        values = list(max_new_tokens)
    else:
        raise ValueError(f"max_new_tokens must be an int >= 0 or a list of them, got {max_new_tokens!r}")
    for i, value in enumerate(values):
        if not _is_int(value) or value < 0:
            raise ValueError(f"max_new_tokens must be ints >= 0, got {value!r} (entry {i})")
    return values


def check_stop_ids(stop_ids, vocab_size: int) -> list[int]:
    if _is_int(stop_ids):
        stop_ids = [stop_ids]
    try:
        values = list(stop_ids)
    except TypeError:
        raise ValueError(f"stop_ids must be a collection of int token ids, got {stop_ids!r}") from None
    for value in values:
        if not _is_int(value) or not 0 <= value < vocab_size:
            raise ValueError(f"stop_ids must be ints in [0, {vocab_size}), got {value!r} in {stop_ids!r}")
    return sorted(set(values))


def check_sampling(temperature, top_k, top_p) -> None:
    check_sampling_args(temperature, top_k, top_p)  # ValueError naming the argument


def check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")


def check_cuda_graphs(cuda_graphs) -> None:
    if cuda_graphs not in (None, True, False):
        raise ValueError(f"cuda_graphs must be None (on when CUDA is available), True or False, "
                         f"got {cuda_graphs!r}")


def check_pair(target_weights, draft_vocab: int) -> None:
    vocab = target_weights.shape.vocab_size
    if draft_vocab != vocab:
        raise ValueError(f"draft has vocab_size={draft_vocab} but the target has vocab_size={vocab}: "
                         "they must share a tokenizer")


def check_room(prompts: list[list[int]], max_new: list[int], width: int, capacity: int,
               width_name: str, width_value, capacity_label: str = "") -> None:
    """Every row must fit: its prompt, its new tokens, and one speculative block of `width`."""
    limit = capacity_label or "the cache"
    label = f"{capacity_label}={capacity}" if capacity_label else f"max_cache_len={capacity}"
    for i, prompt in enumerate(prompts):
        if len(prompt) > capacity:
            raise ValueError(f"prompts[{i}] has {len(prompt)} tokens, longer than {limit} "
                             f"({label})")
    for i, (prompt, new) in enumerate(zip(prompts, max_new)):
        if new == 0:
            continue  # a row with nothing to generate only needs its prompt prefilled
        if len(prompt) + width > capacity:
            raise ValueError(f"{width_name}={width_value!r} does not fit {limit}: prompts[{i}] has "
                             f"{len(prompt)} tokens, and a block of {width} more needs "
                             f"{len(prompt) + width} > {label}")
        if len(prompt) + new + width - 1 > capacity:
            raise ValueError(f"max_new_tokens={new} for prompts[{i}] ({len(prompt)} tokens) does not fit "
                             f"{limit}: with a block of {width} it needs {len(prompt) + new + width - 1} "
                             f"slots > {label}")
