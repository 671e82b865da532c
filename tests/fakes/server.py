"""A small in-process OpenAI-compatible server for testing the served-engine kit itself.

It answers /v1/models, /v1/completions (both dialects: token-id prompts with token_ids back,
or text prompts with a generation_config string) and /metrics, computing from the kit's
float64 target, and can be told to misbehave in one named way:

    None              correct: exact greedy, exact sampling seeded by `seed`, stops, lengths
    "wrong_model"     serves the random draft instead of the target
    "wrong_token"     greedy outputs carry a wrong token at position 3
    "ignore_stop"     goes on past a stop id
    "ignore_seed"     draws from a process-wide generator, ignoring `seed`
    "fixed_seed"      every request sampled with seed 0, whatever it asks
    "hot"             samples at twice the requested temperature (a law the kit must reject)
    "http_500"        every completion answers HTTP 500
    "slow"            sleeps `delay` seconds before answering
    "partial_accept"  /metrics reports 3 of every 4 drafted tokens accepted
    "text_only"       rejects token-id prompts (HTTP 422), like transformers serve
    "die_on_top_k"    the process exits (a crash, as an engine's would) at the first sampled
                      request with top_k > 0: the kit's self-test of a server that dies

Penalties, min_p, logit_bias, stop strings and logprobs follow the OpenAI API's formula
(reference.penalties.OPENAI, vLLM's): a matched stop string's tokens end token_ids and the
text is cut before it; logprobs are the raw target's.

With `trained` (``--trained DRAFT``) it serves the committed trained pair instead, greedy and
token ids only: the float64 trained target, speculating with DRAFT (draft-early-exit,
draft-small, target; "none": the baseline) k = 4 per round, its /metrics counting what its
rounds drafted and accepted (behaviours "wrong_token" and "partial_accept" apply there too).
With `trained_dir` (``--trained-dir DIR``) the pair at DIR instead of the committed one (the
weight-bound pair of --models trained-large).

Run as a process (``python -m tests.fakes.server --port P [--behaviour B]``, from the checkout's
root) it is the `fake` engine of ``python -m properties.serve run`` (tests/fakes/engine.py): the
launcher's own self-test.
Its /metrics counters (its own names, which the `fake` engine's dialect reads) follow a perfect draft with k = 4 drafted per round ("full" schedule).
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch

from properties import oracle
from tests.fakes.engine import ACCEPTED, DRAFTED
from properties.models import tokenizer
from reference.penalties import OPENAI
from reference.sampling import SamplingParams, probs_from_logits

BEHAVIOURS = (None, "wrong_model", "wrong_token", "ignore_stop", "ignore_seed", "fixed_seed",
              "hot", "http_500", "slow", "partial_accept", "text_only", "die_on_top_k")
K = 4


class FakeServer:
    """``with FakeServer(behaviour) as fake: fake.url`` (http://127.0.0.1:PORT/v1)."""

    def __init__(self, behaviour=None, delay: float = 2.0, trained: str | None = None,
                 trained_dir=None):
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour={behaviour!r}: choose from {BEHAVIOURS}")
        self.behaviour = behaviour
        self.trained = None if trained is None else TrainedSpeculator(trained, trained_dir)
        self.delay = delay
        self.drafted = 0
        self.accepted = 0
        self.lock = threading.Lock()
        self.shared_rng = random.Random(12345)
        self.httpd = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, payload, content_type="application/json"):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, {"status": "ok"})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "kit-target"}]})
                elif self.path == "/metrics":
                    text = (f"# TYPE {DRAFTED} counter\n"
                            f'{DRAFTED}{{server="0"}} {fake.drafted}.0\n'
                            f"# TYPE {ACCEPTED} counter\n"
                            f'{ACCEPTED}{{server="0"}} {fake.accepted}.0\n')
                    self._send(200, text.encode(), "text/plain")
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path != "/v1/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                try:
                    status, payload = fake.complete(body)
                except Exception as exc:  # a bad request: answered, never a dropped connection
                    status, payload = 400, {"error": f"{type(exc).__name__}: {exc}"}
                self._send(status, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", getattr(self, "port", 0)), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # ----------------------------------------------------------------- generation

    def complete(self, body: dict):
        b = self.behaviour
        if b == "http_500":
            return 500, {"error": "internal error (fake)"}
        if b == "slow":
            time.sleep(self.delay)
        if self.trained is not None:
            return self.complete_trained(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids, text_mode = tokenizer.encode(prompt), True
            config = json.loads(body.get("generation_config") or "{}")
            temperature = config.get("temperature", 1.0) if config.get("do_sample") else 0.0
            top_k, top_p = config.get("top_k") or 0, config.get("top_p", 1.0)
            stops = config.get("eos_token_id") or []
            stops = [stops] if isinstance(stops, int) else stops
        else:
            if b == "text_only":
                return 422, {"detail": "prompt must be a string"}
            ids, text_mode = list(prompt), False
            temperature = body.get("temperature", 1.0)
            top_k, top_p = body.get("top_k", 0), body.get("top_p", 1.0)
            stops = body.get("stop_token_ids") or []
            try:
                params = self.params(body, temperature, top_k, top_p)
            except ValueError as exc:   # answered as the API answers a bad field: a 400
                return 400, {"error": {"message": str(exc), "type": "BadRequestError"}}
        if b == "die_on_top_k" and temperature > 0 and (top_k or 0) > 0:
            import os
            with self.lock:   # one crash message, even when requests arrive together
                print(f"FakeEngineError: sampling with top_k={top_k} kills this engine",
                      flush=True)
                os._exit(1)
        max_tokens, n = int(body["max_tokens"]), int(body.get("n", 1)) if not text_mode else 1
        seed = body.get("seed")
        choices = []
        for i in range(n):
            rng = self._rng(seed, i)
            if text_mode or not params.shaped and not params.stop_strings:
                tokens = self._generate(ids, max_tokens, temperature, top_k, top_p, set(stops),
                                        rng)
                cut = None
            else:
                tokens, cut = self._generate_shaped(ids, max_tokens, params, set(stops), rng)
            reason = ("stop" if cut is not None or tokens and tokens[-1] in stops
                      and len(tokens) < max_tokens else "length")
            # a matched stop string: its tokens end token_ids, the text is cut before it
            text = tokenizer.decode(tokens)
            choice = {"index": i, "text": text if cut is None else text[:cut],
                      "finish_reason": reason}
            if not text_mode:
                choice["token_ids"] = tokens
                if params.logprobs is not None:
                    choice["logprobs"] = self.logprobs(ids, tokens, params.logprobs)
            choices.append(choice)
        with self.lock:
            drafted = sum(K * _rounds(len(c.get("token_ids", c["text"]))) for c in choices)
            self.drafted += drafted
            self.accepted += drafted * 3 // 4 if b == "partial_accept" else drafted
        return 200, {"object": "text_completion", "model": "kit-target", "choices": choices}

    def complete_trained(self, body: dict):
        """A greedy request to the trained pair: its tokens, the rounds' counts on /metrics."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) or float(body.get("temperature", 1.0)) != 0.0:
            return 400, {"error": {"message": "the fake serves the trained pair greedy "
                                              "(temperature 0) with token-id prompts only",
                                   "type": "BadRequestError"}}
        stops = set(body.get("stop_token_ids") or ())
        out, drafted, accepted = self.trained.generate(list(prompt), int(body["max_tokens"]),
                                                       stops)
        if self.behaviour == "wrong_token" and len(out) > 3:
            out[3] = (out[3] + 1) % self.trained.vocab
        with self.lock:
            self.drafted += drafted
            self.accepted += accepted * 3 // 4 if self.behaviour == "partial_accept" else accepted
        reason = "stop" if out and out[-1] in stops else "length"
        # no text: the kit's side reads token_ids (the text would need the trained tokenizer)
        return 200, {"object": "text_completion", "model": "kit-target",
                     "choices": [{"index": 0, "token_ids": out, "finish_reason": reason}]}

    # ------------------------------------------------------------- sampling parameters
    # The OpenAI API's formula (reference.penalties.OPENAI, vLLM's): the bias, the penalties
    # (presence and frequency over the output), temperature, min_p, top-k, top-p. Each step
    # is a method, so a test's broken server overrides exactly one.

    def params(self, body, temperature, top_k, top_p) -> SamplingParams:
        bias = body.get("logit_bias") or {}
        return SamplingParams(
            temperature=float(temperature), top_k=int(top_k or 0), top_p=float(top_p),
            repetition_penalty=float(body.get("repetition_penalty", 1.0)),
            presence_penalty=float(body.get("presence_penalty", 0.0)),
            frequency_penalty=float(body.get("frequency_penalty", 0.0)),
            min_p=float(body.get("min_p", 0.0)),
            logit_bias=tuple((int(t), float(b)) for t, b in bias.items()),
            stop_strings=tuple(body.get("stop") or ()), logprobs=body.get("logprobs"))

    def history(self, ids, out) -> tuple:
        """(prompt, generated) the penalties see: the committed tokens."""
        return tuple(ids), tuple(out)

    def next_probs(self, logits, ids, out, params):
        prompt, generated = self.history(ids, out)
        return params.probs_after(logits, prompt, generated, OPENAI)

    def next_greedy(self, logits, ids, out, params) -> int:
        prompt, generated = self.history(ids, out)
        return int(torch.argmax(params.adjusted(logits, prompt, generated, OPENAI)))

    def stop_at(self, out, strings) -> int | None:
        """The offset in the output's text where a stop string completed by the last token
        starts, or None: generation ends at the token that completes it."""
        text = tokenizer.decode(out)
        found = [text.find(x) for x in strings if x in text]
        return min(found) if found else None

    def logprobs(self, ids, tokens, top: int) -> dict:
        """The completions API's logprobs object: the raw target's log-softmax per generated
        token, with its `top` most probable alternatives (vLLM's raw_logprobs)."""
        rows = torch.log_softmax(self.logprob_rows(ids, tokens), -1)
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        for row, t in zip(rows, tokens):
            best = torch.topk(row, top).indices.tolist() if top else []
            out["tokens"].append(tokenizer.decode([t]))
            out["token_logprobs"].append(float(row[t]))
            out["top_logprobs"].append({tokenizer.decode([j]): float(row[j]) for j in best})
        return out

    def logprob_rows(self, ids, tokens):
        return oracle.served_logits(tuple(ids), tuple(tokens))

    def _generate_shaped(self, ids, max_tokens, params, stops, rng):
        """(tokens, text offset of a matched stop string or None) under `params`."""
        seq, out = list(ids), []
        while len(out) < max_tokens:
            logits = oracle.served_next_logits([seq], "target")[0]
            if params.greedy:
                token = self.next_greedy(logits, ids, out, params)
            else:
                probs = self.next_probs(logits, ids, out, params).numpy()
                token = int(rng.choice(len(probs), p=probs / probs.sum()))
            out.append(token)
            seq.append(token)
            if params.stop_strings:
                cut = self.stop_at(out, params.stop_strings)
                if cut is not None:
                    return out, cut
            if token in stops:
                break
        return out, None

    def _rng(self, seed, i):
        if self.behaviour == "ignore_seed" or seed is None:
            with self.lock:
                return np.random.default_rng(self.shared_rng.getrandbits(63))
        if self.behaviour == "fixed_seed":
            return np.random.default_rng([0, i])
        return np.random.default_rng([int(seed), i])

    def _generate(self, ids, max_tokens, temperature, top_k, top_p, stops, rng):
        model = "draft-random" if self.behaviour == "wrong_model" else "target"
        if self.behaviour == "hot":
            temperature *= 2
        seq, out = list(ids), []
        while len(out) < max_tokens:
            logits = oracle.served_next_logits([seq], model)[0]
            if temperature == 0:
                token = int(torch.argmax(logits))
                if self.behaviour == "wrong_token" and len(out) == 3:
                    token = (token + 1) % logits.numel()
            else:
                probs = probs_from_logits(logits, temperature, top_k, top_p).numpy()
                token = int(rng.choice(len(probs), p=probs / probs.sum()))
            out.append(token)
            seq.append(token)
            if token in stops and self.behaviour != "ignore_stop":
                break
        return out


class TrainedSpeculator:
    """The committed trained pair (or the pair at `path`) in float64: greedy decoding,
    speculative with `draft`: the first token from the prefill, then rounds of K greedy
    proposals (K also when fewer tokens remain: the "full" schedule), each verified by one
    target forward over the context and the proposals, committing the agreeing prefix and the
    target's next token."""

    def __init__(self, draft: str, path=None):
        from reference.pretrained import load, load_dir
        pair = load(torch.float64) if path is None else load_dir(path, torch.float64)
        self.target = pair.target
        self.vocab = pair.target.config.vocab_size
        choices = {"none": None, "target": pair.target, "draft-small": pair.small,
                   "draft-early-exit": pair.early_exit()}
        if draft not in choices:
            raise ValueError(f"trained={draft!r}: choose from {tuple(choices)}")
        self.draft = choices[draft]

    @staticmethod
    @torch.inference_mode()
    def rows(model, seq) -> torch.Tensor:
        """[len(seq), V]: the model's logits after each prefix of seq."""
        ids = torch.tensor([list(seq)])
        return model(ids, model.new_cache(1, ids.shape[1]))[0]

    def generate(self, prompt, max_tokens: int, stops=()) -> tuple[list, int, int]:
        """(tokens, drafted, accepted) of one greedy request."""
        out = [int(self.rows(self.target, prompt)[-1].argmax())]
        drafted = accepted = 0
        while len(out) < max_tokens and out[-1] not in stops:
            context = list(prompt) + out
            if self.draft is None:
                out.append(int(self.rows(self.target, context)[-1].argmax()))
                continue
            proposals = []
            for _ in range(K):
                proposals.append(int(self.rows(self.draft, context + proposals)[-1].argmax()))
            # row i: the target's logits after the context and proposals[:i]
            verify = self.rows(self.target, context + proposals)[len(context) - 1:]
            a = 0
            while a < K and int(verify[a].argmax()) == proposals[a]:
                a += 1
            drafted, accepted = drafted + K, accepted + a
            for token in proposals[:a] + [int(verify[a].argmax())]:
                out.append(token)
                if len(out) >= max_tokens or token in stops:
                    break
        return out, drafted, accepted


def _rounds(length: int) -> int:
    """Rounds of a perfect draft for an output of `length`: the prefill gives the first token,
    each round k accepted tokens and one more."""
    committed, rounds = 1, 0
    while committed < length:
        rounds, committed = rounds + 1, committed + K + 1
    return rounds


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--behaviour", default=None, choices=[b for b in BEHAVIOURS if b])
    parser.add_argument("--trained", default=None, metavar="DRAFT",
                        help="serve the trained pair, speculating with DRAFT (none: baseline)")
    parser.add_argument("--trained-dir", default=None, metavar="DIR",
                        help="with --trained: the pair at DIR (default the committed pair)")
    parser.add_argument("--trained-only", default=None, metavar="METHOD",
                        help="refuse to start: METHOD serves the trained pair only")
    args = parser.parse_args(argv)
    if args.trained_only:
        print(f"the fake's method {args.trained_only} serves the trained pair only: pass "
              f"--models trained or --models trained-large", flush=True)
        return 2
    fake = FakeServer(args.behaviour, trained=args.trained, trained_dir=args.trained_dir)
    fake.port = args.port
    with fake:
        print(f"fake engine ({args.behaviour or 'correct'}) on {fake.url}", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
