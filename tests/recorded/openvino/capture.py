"""Record real answers of OpenVINO GenAI's LLMPipeline behind the kit's worker, for
tests/test_engine_openvino.py:

    KIT_ENGINES_DIR=.engines python tests/recorded/openvino/capture.py   # needs make engine-openvino
    KIT_ENGINES_DIR=.engines python tests/recorded/openvino/capture.py --batches   # adds batches

Exports the kit's models, converts them (the engine's `prepare`), starts the worker for the
baseline and for three methods (the early-exit draft, the perfect draft, prompt lookup), sends
the requests below exactly as the kit's client words them, and writes
tests/recorded/openvino/openvino.json: the engine's version, and per method and request the
body sent and the answer (or the error) verbatim. `--batches` adds (or replaces) only the
"batches" part: the BATCH requests sent at once to the baseline and to a speculating method,
with the worker's /metrics page around them. Nothing in the file is written by hand.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from properties import engines  # noqa: E402
from properties.adapters.client import Client, Request  # noqa: E402
from properties.adapters.protocol import HttpError  # noqa: E402
from properties.export import kit as export  # noqa: E402
from properties.serve.server import Server  # noqa: E402
from reference.sampling import SamplingParams  # noqa: E402

NAME = "openvino"
METHODS = (None, "draft-early-exit", "perfect-draft", "prompt-lookup")
# the greedy requests every engine's recording shares (tests/recorded/capture.py), then this
# engine's own; name -> the request (token ids; temperature 0 is greedy)
_SHARED = importlib.util.spec_from_file_location("shared_capture", ROOT / "tests" / "recorded"
                                                 / "capture.py")
shared = importlib.util.module_from_spec(_SHARED)
_SHARED.loader.exec_module(shared)
REQUESTS = {
    **{name: shared.REQUESTS[name] for name in ("greedy", "greedy_random_prompt", "greedy_stop",
                                                "greedy_two_stops", "greedy_stop_never_met")},
    # the greedy output 5 27 5 27 ...: "B" (27) first completes at its second token, "fB"
    # (5 27) at its second too but begins at the first
    "greedy_stop_string": Request((3, 9, 27, 3, 9, 27), 12, SamplingParams(stop_strings=("B",))),
    "greedy_stop_string_at_start": Request((3, 9, 27, 3, 9, 27), 12,
                                           SamplingParams(stop_strings=("fB",))),
    # one round of the capped schedule per length: 1 + 4 + 1, 1 + 4, 1 + 4 + 4 + 2
    "greedy_7": Request((30, 1, 17, 8, 12), 7),
    "greedy_6": Request((30, 1, 17, 8, 12), 6),
    "greedy_11": Request((30, 1, 17, 8, 12), 11),
    "sampled_seeded": Request((1, 2, 3), 6, SamplingParams(temperature=1.0, seed=7)),
    "sampled_seeded_again": Request((1, 2, 3), 6, SamplingParams(temperature=1.0, seed=7)),
    "sampled_top_p": Request((5, 6, 5, 6, 5), 3, SamplingParams(temperature=1.3, top_p=0.9,
                                                               seed=12)),
}


def capture() -> dict:
    engine = engines.get(NAME)
    env = engine.find()
    work = Path(tempfile.mkdtemp(prefix=f"capture-{NAME}-"))
    export.export(work / "export")
    engine.prepare(env, work / "export", work / "prepare.log")
    record = {"engine": NAME, "version": engine.version(env), "methods": {}}
    for name in METHODS:
        method = engine.method(name) if name else None
        dialect = engine.dialect_for(method)
        server = Server(f"{NAME}-capture-{name or 'baseline'}",
                        lambda port: engine.command(env, work / "export", method, port), work,
                        start_timeout=engine.start_timeout)
        exchanges = {}
        with server:
            client = Client(server.url, dialect=dialect, timeout=120)
            client.resolve()
            for key, req in REQUESTS.items():
                body = client.body(req)
                try:
                    answer = client.post(body)
                except HttpError as exc:
                    answer = {"http_error": exc.status, "message": str(exc)}
                exchanges[key] = {"request": {"prompt": req.prompt, "max_tokens": req.max_tokens,
                                              **dataclasses.asdict(req.sampling)},
                                  "body": body, "answer": answer}
        record["methods"][name or "baseline"] = exchanges
    return record


# requests sent at once (`--batches`): the worker answers them with one
# ContinuousBatchingPipeline call; greedy and sampled rows mixed, prompts and lengths ragged
BATCH = (Request((3, 9, 27, 3, 9, 27, 3, 9), 16), Request((30, 1, 17, 8, 12), 12),
         Request((1, 2, 3), 6, SamplingParams(temperature=1.0, seed=7)),
         Request((1, 2, 3, 1, 2, 3, 1, 2, 3, 4), 7, SamplingParams(stop_ids=(3,))),
         Request((7, 7, 7, 7), 2), Request((2, 4), 5))
BATCH_METHODS = (None, "draft-early-exit-no-prefix-caching")


def capture_batches(record: dict) -> dict:
    """record["batches"]: per method, the BATCH requests sent at once (the bodies and the
    answers, verbatim), with the worker's /metrics page before and after them."""
    engine = engines.get(NAME)
    env = engine.find()
    work = Path(tempfile.mkdtemp(prefix=f"capture-{NAME}-batches-"))
    export.export(work / "export")
    engine.prepare(env, work / "export", work / "prepare.log")
    if record["version"] != engine.version(env):
        raise SystemExit(f"the recording is of {record['version']}, the engine here is "
                         f"{engine.version(env)}: capture everything again")
    record["batches"] = {}
    for name in BATCH_METHODS:
        method = engine.method(name) if name else None
        server = Server(f"{NAME}-capture-batch-{name or 'baseline'}",
                        lambda port: engine.command(env, work / "export", method, port), work,
                        start_timeout=engine.start_timeout)
        with server:
            client = Client(server.url, dialect=engine.dialect_for(method), timeout=120)
            client.resolve()
            bodies = [client.body(req) for req in BATCH]
            before = client.get_root_text("/metrics")
            with ThreadPoolExecutor(len(BATCH)) as pool:
                answers = list(pool.map(client.post, bodies))
            after = client.get_root_text("/metrics")
            record["batches"][name or "baseline"] = {
                "requests": [{"prompt": req.prompt, "max_tokens": req.max_tokens,
                              **dataclasses.asdict(req.sampling)} for req in BATCH],
                "bodies": bodies, "answers": answers, "metrics_before": before,
                "metrics_after": after}
    return record


def main() -> int:
    out = Path(__file__).with_name(f"{NAME}.json")
    if sys.argv[1:] == ["--batches"]:   # only the batches, the rest of the recording kept
        record = capture_batches(json.loads(out.read_text()))
    else:
        record = capture()
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({record['engine']} {record['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
