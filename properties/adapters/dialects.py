"""How one engine's server speaks: what the kit must send so that it samples by the convention,
and how its answers are read back into token ids.

A dialect is never a defect. Servers differ in habits that have nothing to do with lossless
speculation: a matched stop token is kept in `token_ids` or dropped from `text`; default
sampling settings (repetition penalties, min_p, a top-k of 40, a generation config read from
the checkpoint) apply unless the request overrides them; `n` may be ignored. Each engine's
module declares its Dialect; the client sends `neutral` with every request (so the server's
defaults cannot change the law) and reads choices by `stop_in_ids` / `stop_in_text`.
The readings are shown right by tests against responses recorded from the real servers
(tests/recorded/, written by tests/recorded/capture.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Dialect:
    name: str
    # request shape: "openai" (vLLM/SGLang completions with token-id prompts),
    # "transformers" (text prompt + generation_config), "llamacpp" (llama-server /completion)
    api: str
    # sent with every request: the server's own defaults must not change the law
    neutral: dict = field(default_factory=dict)
    # a matched stop id: kept at the end of token_ids? left in the text? (None: either)
    stop_in_ids: bool | None = None
    stop_in_text: bool | None = None
    # the server honours `n` (several completions per request)
    honours_n: bool | None = None
    # where the engine reports its own speculation counters: "metrics" (Prometheus /metrics),
    # "timings" (per-response draft_n / draft_n_accepted), or None
    counters: str | None = None
    notes: tuple = ()


GENERIC = Dialect("generic", "auto")

VLLM = Dialect(
    "vllm", "openai",
    # vLLM applies the checkpoint's generation_config.json (--generation-config auto) and its
    # own defaults unless a request names each setting (its CompletionRequest).
    neutral={"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
             "min_p": 0.0, "ignore_eos": True, "skip_special_tokens": False,
             "include_stop_str_in_output": False},
    stop_in_ids=True, stop_in_text=False, honours_n=True, counters="metrics",
    notes=("a matched stop id ends token_ids but is left out of text",
           "top_k=0 in the kit means off; vLLM takes 0 or -1 for off"))

LLAMACPP = Dialect(
    "llama.cpp", "llamacpp",
    # llama-server's defaults are top_k 40, top_p 0.95, min_p 0.05, temperature 0.8 and a
    # sampler chain that applies temperature last; the kit names every setting and puts the
    # chain in the conventional order (temperature, then top-k, then top-p).
    neutral={"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 0,
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
             "xtc_probability": 0.0, "top_n_sigma": -1.0, "mirostat": 0,
             "dynatemp_range": 0.0, "ignore_eos": False, "cache_prompt": False,
             "return_tokens": True, "n_probs": 0,
             "samplers": ["temperature", "top_k", "top_p"]},
    stop_in_ids=None, stop_in_text=False, honours_n=False, counters="timings",
    notes=("stops are strings (one character per kit token); the stop word is cut from the text",
           "draft statistics per response: timings.draft_n, timings.draft_n_accepted",
           "a BPE vocabulary without an end-of-sequence token gets llama.cpp's default, id 11, "
           "and ignore_eos would forbid that token (a -inf bias): the kit leaves ignore_eos "
           "off and continues a completion that stopped at id 11 by a new request from the "
           "prefix (the chain rule keeps the law and the greedy output exact)"))

TRANSFORMERS = Dialect("transformers", "transformers", honours_n=False,
                       notes=("text only; stop ids as generation_config eos_token_id",))
