"""``nshot reproduce --dry-run``: every method's ``paper`` comparison, planned under a GPU
scale, asks for a GPU for every job that trains a network, and no method's job pins torch to
one thread (the runner gives a job one thread per CPU it holds)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nshot.method import available, get

METHODS = available()
ROOT = Path(__file__).resolve().parents[1]

#: methods whose comparison trains no network (a closed-form bank, an estimator)
NO_NETWORK = {"caos", "unpaired_iv"}


def _plan(name: str) -> dict:
    from nshot import reproduce

    return reproduce.plan(name, get(name).config("paper"), "gpu8")


@pytest.mark.parametrize("name", METHODS)
def test_the_paper_plan_under_gpu8_gives_every_training_job_a_gpu(name):
    plan = _plan(name)
    jobs = plan["jobs"]
    assert jobs, f"{name}: the plan lists no job"
    training = [j for j in jobs if j["trains"]]
    if name not in NO_NETWORK:
        assert training, f"{name}: no job of its comparison is marked as training a network"
    for j in training:
        assert j["gpus"] >= 1 and j["cpus"] == 8 and j["threads"] == 8, (name, j)


#: where a method may still set one torch thread, and why (never inside a job's own code)
ONE_THREAD_ALLOWED = {
    "methods/auxbo/surrogate.py": "the GP fit's own block, restored after it",
    "methods/tail/evaluation.py": "the in-process evaluation without Ray, restored after it",
    "methods/tail/bench.py": "the benchmark's measured setting",
    "methods/urs/bench.py": "the benchmark's measured setting",
}


def test_no_job_pins_one_thread():
    """A job's threads come from the runner (one per CPU it holds), so a GPU scale's 8 CPUs
    are used; a method's code does not set one thread itself."""
    pinned = []
    for path in sorted((ROOT / "methods").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ONE_THREAD_ALLOWED:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"set_num_threads\(\s*1\s*\)", line):
                pinned.append(f"{rel}:{i}")
    assert not pinned, f"torch pinned to one thread in: {pinned}"


def test_no_method_code_names_a_device():
    """Method code takes its device from the trainer (``Recipe.device``, the model's own) or
    from ``nshot.train.trainer.local_device()`` outside a Ray Train worker, never names one:
    the same code then runs on a worker's GPU and on a laptop's CPU."""
    pattern = re.compile(r"torch\.device\(\s*[\"']cuda|\.cuda\(\)|device\s*=\s*[\"']cuda")
    named = []
    for path in sorted((ROOT / "methods").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                named.append(f"{rel}:{i}")
    assert not named, f"a device named in method code: {named}"
