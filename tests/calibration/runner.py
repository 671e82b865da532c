"""Many runs, on worker processes: each task is one run (tests.calibration.collect) of one
family on one implementation, correct or deviating by a stated total variation (deviate.py).

Runs are written one JSON line each to OUT/runs.jsonl as they finish, so a batch stopped by its
time limit (``minutes``) keeps what it did; tasks go out run index first, so that a stopped batch
has about as many runs of every family."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path


def _init_worker():
    import torch
    torch.set_num_threads(1)


def _task(task: dict) -> dict:
    try:
        return _run_task(task)
    except Exception as exc:     # noqa: BLE001 - a broken set-up is reported, the batch goes on
        return {"family": task["family"], "impl": task["impl"], "delta": task.get("delta", 0.0),
                "batch": task["batch"], "seed": task["seed"], "seconds": 0.0, "failed": False,
                "setup_error": f"{type(exc).__name__}: {exc}", "failures": [], "records": []}


def _run_task(task: dict) -> dict:
    from tests.calibration import collect, engines
    if task.get("delta") and task["impl"] == "served":
        impl = engines.get("served", task["delta"])     # the server itself deviates
        impl.spec = f"served deviating by TV {task['delta']}"
    elif task.get("delta"):
        from tests.calibration import deviate
        impl = deviate.deviating(engines.get(task["impl"]), task["family"], task["delta"])
    else:
        impl = engines.get(task["impl"])
    tests = [name for name, _ in collect.statistical_tests(task["family"])]
    if task.get("tests"):
        tests = [name for name in tests if name in task["tests"]]
    result = collect.run_once(task["family"], impl, task["seed"], tests=tests)
    result.update(impl=engines.short(task["impl"]), delta=task.get("delta", 0.0),
                  batch=task["batch"])
    return result


def tasks(families, runs: int, seed: int, batch: str, deltas=(0.0,), impls=None,
          tests=None) -> list[dict]:
    """The tasks of a batch: runs x families x their implementations x deltas. Each (family,
    implementation, delta, run) takes its own Hypothesis seed from `seed`; `tests`: only these
    test names (None: every statistical test of the family)."""
    from tests.calibration import engines
    out = []
    for r in range(runs):
        for family in families:
            specs = engines.CORRECT[family] if batch == "null" else impls
            if batch == "null" and impls:       # a filter on each family's own list
                specs = [s for s in specs if s in impls or engines.short(s) in impls]
            for spec in specs:
                for delta in deltas:
                    out.append({"family": family, "impl": spec, "delta": delta, "batch": batch,
                                "seed": seed + r, "tests": tests})
    return out


def run(task_list: list[dict], out: Path, workers: int = 2, minutes: float | None = None,
        echo=print) -> int:
    """Run the tasks, appending each result to out/runs.jsonl. Returns the runs finished."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    done = 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, maxtasksperchild=None) as pool, \
            open(out / "runs.jsonl", "a") as sink:
        for result in pool.imap_unordered(_task, task_list):
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            done += 1
            ps = [r["p"] for r in result["records"]]
            if result.get("setup_error"):
                echo(f"{result['family']} on {result['impl']}: NOT RUN: {result['setup_error']}")
                continue
            echo(f"[{done}/{len(task_list)}] {result['family']} on {result['impl']}"
                 f"{' deviating ' + str(result['delta']) if result['delta'] else ''} seed "
                 f"{result['seed']}: {len(ps)} checks, min p {min(ps) if ps else float('nan'):.3g}, "
                 f"{'NOT CONFORMANT' if result['failed'] else 'passed'} ({result['seconds']:.0f} s)")
            if deadline is not None and time.monotonic() > deadline:
                echo(f"time limit of {minutes} min reached: {len(task_list) - done} runs not done")
                pool.terminate()
                break
    return done
