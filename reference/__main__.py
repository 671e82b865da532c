"""python -m reference speculate --k 4: the chapter's demonstration, one JSON line per draft.

--model random (the default): both models are random (a 6-layer tiny Qwen3 as target), so the
numbers show the mechanics, not real-world speed.
--model trained: the committed trained pair (reference/trained/, `make models`): a target
trained on the Python standard library's sources, its early exit and a small separately trained
draft, continuing a held-out prompt (text the models never saw); the text is printed.

--draft eagle, eagle3, medusa, mtp: a feature-level head (reference/heads/), drafting from the
target's hidden states; random weights with --model random, the trained EAGLE-3 head
(reference/trained/eagle3, make models-heads) with --model trained.

Every draft's greedy output is compared with the target's own greedy output.
"""

import argparse
import json

import torch

from reference.heads import KINDS as HEAD_KINDS
from reference.heads.random import random_head
from reference.model import EarlyExit, random_model
from reference.speculative import PromptLookup, greedy_generate, sample_generate, speculative_generate

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
DRAFTS = ("all", "perfect", "early-exit", "small", "prompt-lookup", *HEAD_KINDS)


def _heads(target, small, trained_head):
    """--draft KIND: random heads for the random target, the trained EAGLE-3 head for the
    trained one."""
    if small is None:
        return {kind: [(f"{kind} head (random weights)", random_head(kind, target, seed=1))]
                for kind in HEAD_KINDS}
    if trained_head is None:
        return {}
    size = sum(p.numel() for p in trained_head.parameters())
    return {"eagle3": [(f"EAGLE-3 head trained on the target ({size:,} parameters)",
                        trained_head)]}


def _drafts(target, which, early_layers, small=None, trained_head=None):
    perfect = ("target itself (perfect draft)", target)
    early = (f"first {early_layers} of {len(target.layers)} layers",
             EarlyExit(target, early_layers).eval())
    lookup = ("prompt lookup (last 3 tokens)", PromptLookup(3))
    choices = {"perfect": [perfect], "early-exit": [early], "prompt-lookup": [lookup],
               "all": [perfect, early]}
    if small is not None:
        choices["small"] = [(f"small trained draft ({sum(p.numel() for p in small.parameters()):,} "
                             f"parameters)", small)]
        choices["all"] = [early, choices["small"][0], lookup]
    choices |= _heads(target, small, trained_head)
    if small is not None and "eagle3" in choices:
        choices["all"].append(choices["eagle3"][0])
    if which not in choices:
        if which == "small":
            raise ValueError(f"--draft {which} needs --model trained (the random models have "
                             f"no separately trained draft)")
        raise ValueError(f"--draft {which}: the trained target has no trained {which} head "
                         f"(an EAGLE-3 head is trained by make models-heads); use --model "
                         f"random for a head with random weights")
    return choices[which]


def _models(args):
    """(target, small draft or None, prompt ids, decode or None, trained EAGLE-3 head or None)."""
    if args.model == "random":
        return random_model("tiny", seed=args.seed, dtype=torch.float64), None, PROMPT, None, None
    from reference.pretrained import load
    pair = load()
    prompts = pair.prompts()
    if not 0 <= args.prompt < len(prompts):
        raise ValueError(f"--prompt must be in [0, {len(prompts) - 1}] (held-out prompts), got "
                         f"{args.prompt}")
    if args.early_layers is None:
        args.early_layers = pair.exit_layers
    head = pair.head("eagle3") if pair.has_head("eagle3") else None
    return pair.target, pair.small, prompts[args.prompt], pair.decode, head


def speculate(args) -> list[dict]:
    target, small, prompt, decode, head = _models(args)
    early_layers = 2 if args.early_layers is None else args.early_layers
    sampling = args.temperature > 0
    lines = []
    if decode is not None:
        lines.append({"prompt_text": decode(prompt)})
    if not sampling:
        reference = greedy_generate(target, prompt, args.max_new_tokens)
    for name, draft in _drafts(target, args.draft, early_layers, small, head):
        generator = torch.Generator().manual_seed(args.seed)
        tokens, stats = speculative_generate(
            target, draft, prompt, args.max_new_tokens, k=args.k, temperature=args.temperature,
            generator=generator, top_k=args.top_k, top_p=args.top_p, adaptive=args.adaptive,
            tree=args.tree)
        line = {"draft": name}
        if not sampling and draft is not target:
            line["identical_to_target_greedy"] = tokens == reference
        line |= {"rounds": stats["rounds"], "acceptance_rate": round(stats["acceptance_rate"], 3),
                 "tokens_per_target_call": round(stats["tokens_per_target_call"], 2)}
        if decode is not None:
            line["text"] = decode(tokens)
        elif sampling:
            line["tokens"] = tokens
        lines.append(line)
    if sampling:
        # For comparison: plain sampling from the target (same distribution, other draws).
        generator = torch.Generator().manual_seed(args.seed)
        plain = sample_generate(target, prompt, args.max_new_tokens, args.temperature,
                                generator=generator, top_k=args.top_k, top_p=args.top_p)
        lines.append({"draft": "none (target sampling)"} |
                     ({"text": decode(plain)} if decode is not None else {"tokens": plain}))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reference")
    commands = parser.add_subparsers(dest="command", required=True)
    spec = commands.add_parser("speculate", help="speculative decoding on tiny models")
    spec.add_argument("--model", choices=["random", "trained"], default="random",
                      help="random tiny models, or the committed trained pair")
    spec.add_argument("--k", type=int, default=4, help="draft tokens per round (the largest k with --adaptive)")
    spec.add_argument("--max-new-tokens", type=int, default=32)
    spec.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    spec.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    spec.add_argument("--top-p", type=float, default=1.0, help="1 disables top-p")
    spec.add_argument("--draft", choices=DRAFTS, default="all",
                      help="small needs --model trained; all: every draft of the model kind")
    spec.add_argument("--early-layers", type=int, default=None,
                      help="layers in the early-exit draft (default 2; the trained pair: the "
                           "exit layer it was trained for)")
    spec.add_argument("--prompt", type=int, default=0,
                      help="which held-out prompt (--model trained)")
    spec.add_argument("--adaptive", action="store_true", help="choose k each round by expected speedup")
    spec.add_argument("--tree", action="store_true",
                      help="tree verification, 2 children at 3 depths (greedy, or exact sampling "
                           "with --temperature)")
    spec.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        for line in speculate(args):
            print(json.dumps(line))
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
