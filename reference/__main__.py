"""python -m reference speculate --k 4: the chapter's demonstration, one JSON line per draft.

Both models are random (a 6-layer tiny Qwen3 as target), so the numbers show the mechanics,
not real-world speed. Every draft's output is compared with the target's own greedy output.
"""

import argparse
import json

import torch

from reference.model import EarlyExit, random_model
from reference.speculative import PromptLookup, greedy_generate, sample_generate, speculative_generate

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def _drafts(target, which, early_layers):
    perfect = ("target itself (perfect draft)", target)
    early = (f"first {early_layers} of {len(target.layers)} layers", EarlyExit(target, early_layers))
    lookup = ("prompt lookup (last 3 tokens)", PromptLookup(3))
    return {"all": [perfect, early], "perfect": [perfect], "early-exit": [early],
            "prompt-lookup": [lookup]}[which]


def speculate(args) -> list[dict]:
    target = random_model("tiny", seed=args.seed, dtype=torch.float64)
    sampling = args.temperature > 0
    if not sampling:
        reference = greedy_generate(target, PROMPT, args.max_new_tokens)
    lines = []
    for name, draft in _drafts(target, args.draft, args.early_layers):
        generator = torch.Generator().manual_seed(args.seed)
        tokens, stats = speculative_generate(
            target, draft, PROMPT, args.max_new_tokens, k=args.k, temperature=args.temperature,
            generator=generator, top_k=args.top_k, top_p=args.top_p, adaptive=args.adaptive,
            tree=args.tree)
        line = {"draft": name}
        if not sampling and draft is not target:
            line["identical_to_target_greedy"] = tokens == reference
        line |= {"rounds": stats["rounds"], "acceptance_rate": round(stats["acceptance_rate"], 3),
                 "tokens_per_target_call": round(stats["tokens_per_target_call"], 2)}
        if sampling:
            line["tokens"] = tokens
        lines.append(line)
    if sampling:
        # For comparison: plain sampling from the target (same distribution, other draws).
        generator = torch.Generator().manual_seed(args.seed)
        lines.append({"draft": "none (target sampling)", "tokens": sample_generate(
            target, PROMPT, args.max_new_tokens, args.temperature, generator=generator,
            top_k=args.top_k, top_p=args.top_p)})
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reference")
    commands = parser.add_subparsers(dest="command", required=True)
    spec = commands.add_parser("speculate", help="speculative decoding on random tiny models")
    spec.add_argument("--k", type=int, default=4, help="draft tokens per round (the largest k with --adaptive)")
    spec.add_argument("--max-new-tokens", type=int, default=32)
    spec.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    spec.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    spec.add_argument("--top-p", type=float, default=1.0, help="1 disables top-p")
    spec.add_argument("--draft", choices=["all", "perfect", "early-exit", "prompt-lookup"], default="all")
    spec.add_argument("--early-layers", type=int, default=2, help="layers in the early-exit draft")
    spec.add_argument("--adaptive", action="store_true", help="choose k each round by expected speedup")
    spec.add_argument("--tree", action="store_true",
                      help="tree verification, 2 children at 3 depths (greedy, or exact sampling "
                           "with --temperature)")
    spec.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        for line in speculate(args):
            print(json.dumps(line))
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
