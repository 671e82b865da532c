"""Record real responses of an engine's server, for the dialect tests (tests/test_serve_dialects.py).

    python tests/recorded/capture.py vllm        # needs `make engine-vllm`
    python tests/recorded/capture.py llamacpp    # needs `make engine-llamacpp`
    python tests/recorded/capture.py ENGINE      # any engine of the table, its make target

Starts the engine with the early-exit draft model (the kit's launcher), sends the requests
below exactly as the kit's client words them, and writes tests/recorded/ENGINE.json: the
engine's version, and for each request the body sent and the body answered, verbatim, plus
the engine's /metrics page around one greedy request where it has one. Nothing in the file
is written by hand: the tests read it back through the client and compare with the kit's
float64 models.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from properties import engines  # noqa: E402
from properties.export import kit as export  # noqa: E402
from properties.adapters.client import Client, Request  # noqa: E402
from properties.serve.server import Server  # noqa: E402
from reference.sampling import SamplingParams  # noqa: E402

# name -> the request (token ids; temperature 0 is greedy)
REQUESTS = {
    "greedy": Request((3, 9, 27, 3, 9, 27), 12),
    "greedy_random_prompt": Request((30, 1, 17, 8, 12), 12),
    "greedy_stop": Request((3, 9, 27, 3, 9, 27), 12, SamplingParams(stop_ids=(27,))),
    "greedy_two_stops": Request((30, 1, 17, 8, 12), 12, SamplingParams(stop_ids=(31, 3))),
    "greedy_stop_never_met": Request((3, 9, 27, 3, 9, 27), 6, SamplingParams(stop_ids=(0,))),
    # the greedy continuation 5 27 30 5 27 30 11 ...: llama.cpp's end-of-sequence id 11 comes
    # inside a block a draft proposes and the target accepts
    "greedy_end_of_sequence": Request((18, 15, 27), 12),
    # the greedy continuation 1 7 3 31 19 ...: the vocabulary's last id, which an engine
    # that needs an end-of-sequence id is given (the kit's models have none), comes early
    "greedy_through_last_token": Request((30, 22, 13, 8), 12),
    "sampled_seeded": Request((1, 2, 3), 6, SamplingParams(temperature=1.0, seed=7)),
    "sampled_seeded_again": Request((1, 2, 3), 6, SamplingParams(temperature=1.0, seed=7)),
    "sampled_n4": Request((1, 2, 3), 3, SamplingParams(temperature=0.8, seed=11, n=4)),
    "sampled_top_p": Request((5, 6, 5, 6, 5), 3, SamplingParams(temperature=1.3, top_p=0.9, seed=12)),
}


def capture(name: str) -> dict:
    engine = engines.get(name)
    env = engine.find()
    version = engine.version(env)
    work = Path(tempfile.mkdtemp(prefix=f"capture-{name}-"))
    export.export(work / "export")
    if engine.prepare is not None:
        engine.prepare(env, work / "export", work / "prepare.log")
    method = engine.method("draft-early-exit")
    server = Server(f"{name}-capture", lambda port: engine.command(env, work / "export", method,
                                                                   port), work,
                    start_timeout=engine.start_timeout)
    record = {"engine": name, "version": version, "method": method.name, "exchanges": {}}
    with server:
        client = Client(server.url, dialect=engine.dialect, timeout=120)
        client.resolve()
        post = client.post
        for key, req in REQUESTS.items():
            # every exchange the dialect makes for the request (a continuation past an end of
            # sequence is a second one), in order
            sent = []
            client.post = lambda body: sent.append((body, post(body))) or sent[-1][1]
            engine.dialect.complete(client, req)
            client.post = post
            (body, answer), later = sent[0], sent[1:]
            record["exchanges"][key] = {"request": {"prompt": req.prompt, "max_tokens": req.max_tokens,
                                                   **dataclasses.asdict(req.sampling)}, "body": body,
                                        "answer": answer}
            if later:
                record["exchanges"][key]["continued"] = [{"body": b, "answer": a} for b, a in later]
        if not engine.dialect.per_response:   # server-wide counters: the page around one request
            pages = []
            for _ in range(2):
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as page:
                    pages.append(page.read().decode())
                if len(pages) == 1:
                    client.post(client.body(REQUESTS["greedy"]))
            record["metrics_before_after_greedy"] = [
                "\n".join(line for line in p.splitlines() if "spec_decode" in line)
                for p in pages]
    return record


def main(argv) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    record = capture(argv[0])
    out = Path(__file__).with_name(f"{argv[0]}.json")
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({record['engine']} {record['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
