"""transformers: under assisted decoding (shown with prompt lookup) a stop string that
completes inside a block of accepted tokens does not end the output where it completes.

`_assisted_decoding` appends the whole accepted block, cut only for max_length and EOS, and then
asks the stopping criteria once; StopStringCriteria only looks for a stop string that ends at
the last token. A stop string completed before the block's last token is missed, and the output
runs on until a later block happens to end on one, or to max_new_tokens.

Run: python reproduce.py [--no-serve]   (transformers 5.x with its [serving] extra, torch; CPU)
Writes a tiny random Qwen3 (../tiny.py), takes its greedy output for a fixed prompt, and uses
each distinct 2- and 3-character piece of it as a stop string (the tokenizer has one character a
token), through `generate` without speculation and with prompt lookup
(prompt_lookup_num_tokens=4); then the same requests to a freshly started `transformers serve` of the same checkpoint, with
prompt lookup turned on per request (generation_config) and off. Prints REPRODUCED (exit 0)
when every output without speculation ends where its stop string first completes and at least
one output with speculation does not; NOT REPRODUCED (exit 1) otherwise.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny import complete, free_port, healthy, stop, tiny_models  # noqa: E402

PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]   # 'abcabcab'
MAX_NEW = 12
LOOKUP = {"prompt_lookup_num_tokens": 4}


def expected(greedy: str, stop_string: str) -> str:
    """transformers' convention: the output ends with the token that completes the stop string
    (kept). One character a token, so characters count tokens."""
    return greedy[:greedy.index(stop_string) + len(stop_string)]


def in_process(target_dir: Path, stop_strings: list, greedy: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant.generation_config.num_assistant_tokens = 4
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    ids = torch.tensor([PROMPT])
    ways = {"without speculation": {}, "prompt lookup": dict(LOOKUP)}
    wrong = {}
    for way, extra in ways.items():
        wrong[way] = []
        for s in stop_strings:
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=MAX_NEW, stop_strings=[s], tokenizer=tokenizer,
                                  pad_token_id=0, **extra)
            text = tokenizer.decode(out[0, len(PROMPT):])
            if text != expected(greedy, s):
                wrong[way].append(s)
                print(f"  generate, {way}: stop {s!r}: expected {expected(greedy, s)!r}, "
                      f"got {text!r}")
        print(f"generate, {way}: {len(wrong[way])} of {len(stop_strings)} outputs wrong")
    # an assistant model goes through the same loop, but its own generate gets the stop strings
    # (a copy of the generation config) without the tokenizer: a side note, not the verdict
    try:
        target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                        max_new_tokens=MAX_NEW, stop_strings=[stop_strings[0]],
                        tokenizer=tokenizer, pad_token_id=0, assistant_model=assistant)
        print("generate, assistant model (the target itself): answers with stop strings")
    except ValueError as error:
        print(f"generate, assistant model (the target itself), any stop string: "
              f"ValueError: {str(error)[:100]}...")
    return wrong


def served(target_dir: Path, stop_strings: list, greedy: str, log: Path) -> dict:
    program = Path(sys.executable).parent / "transformers"
    argv = ([str(program)] if program.exists() else
            [sys.executable, "-c", "from transformers.cli.transformers import main; main()"])
    port = free_port()
    argv += ["serve", str(target_dir), "--host", "127.0.0.1", "--port", str(port),
             "--device", "cpu", "--dtype", "float32"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"transformers serve did not come up; see {log}")
            time.sleep(1)
        print(f"transformers serve on port {port}: POST /v1/completions, prompt "
              f"'abcabcab', max_tokens {MAX_NEW}, greedy, `stop`")
        wrong = {}
        for way, config in (("without speculation", {}), ("prompt lookup", LOOKUP)):
            wrong[way] = []
            for s in stop_strings:
                body = {"prompt": "abcabcab", "max_tokens": MAX_NEW, "stop": [s],
                        "generation_config": json.dumps({"do_sample": False, **config})}
                status, answer = complete(url, body, model=str(target_dir))
                if status != 200:
                    sys.exit(f"HTTP {status}: {answer}")
                choice = answer["choices"][0]
                if choice["text"] != expected(greedy, s):
                    wrong[way].append(s)
                    print(f"  serve, {way}: stop {s!r}: expected {expected(greedy, s)!r}, got "
                          f"{choice['text']!r} (finish_reason {choice.get('finish_reason')!r})")
            print(f"serve, {way}: {len(wrong[way])} of {len(stop_strings)} outputs wrong")
        return wrong
    finally:
        stop(process)
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-serve", action="store_true", help="generate() only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="tf-assisted-stop-"))
    try:
        target_dir, _ = tiny_models(work)
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        ids = torch.tensor([PROMPT])
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=MAX_NEW, pad_token_id=0)[0, len(PROMPT):]
        looked = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=MAX_NEW, pad_token_id=0, **LOOKUP)[0, len(PROMPT):]
        greedy = tokenizer.decode(plain)
        print(f"transformers {transformers.__version__}, torch {torch.__version__}\n"
              f"prompt {PROMPT} ('abcabcab'); greedy output {plain.tolist()} ({greedy!r})")
        if not torch.equal(plain, looked):
            print(f"prompt lookup changes the greedy output ({looked.tolist()}): inconclusive")
            print("NOT REPRODUCED")
            return 1
        stop_strings = list(dict.fromkeys(greedy[i:i + n] for n in (2, 3)
                                          for i in range(len(greedy) - n + 1)))
        wrong = in_process(target_dir, stop_strings, greedy)
        if not args.no_serve:
            wrong |= {f"serve, {k}": v for k, v in
                      served(target_dir, stop_strings, greedy, work / "serve.log").items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plain_ok = all(not v for k, v in wrong.items() if k.endswith("without speculation"))
    spec_wrong = any(v for k, v in wrong.items() if not k.endswith("without speculation"))
    reproduced = plain_ok and spec_wrong
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
