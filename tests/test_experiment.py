"""The one experiment runner: a grid of Ray tasks (or, with NSHOT_IN_PROCESS, of calls in this
process), gathered and aggregated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nshot.errors import NshotError
from nshot.experiment import Job, aggregate, fetch, grid, run_jobs, share, submit
from nshot.method import ResultsTable


@pytest.fixture(autouse=True)
def _by_value():
    """Ray pickles a function by reference to its module; this test module is not importable
    on the workers, so its functions travel by value (a method's live in its package)."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _score(system: str, seed: int, offset: float = 0.0) -> dict[str, float]:
    import os

    base = {"a": 1.0, "b": 2.0}[system]
    return {"acc": base + seed + offset, "pid": float(os.getpid())}


def _boom(system: str, seed: int) -> dict[str, float]:
    if seed == 1:
        raise ValueError("diverged")
    return {"acc": 1.0}


def test_grid_runs_as_ray_tasks_and_aggregates_per_system(ray_session, capsys):
    keys = grid(["a", "b"], [0, 1, 2])
    assert keys[:2] == [("a", 0), ("a", 1)] and len(keys) == 6
    jobs = [Job(k, _score, k, {"offset": 0.5}, num_cpus=0.5) for k in keys]
    results = run_jobs(jobs, description="toy")
    assert list(results) == keys
    assert results[("b", 2)]["acc"] == 4.5
    assert all(r["pid"] != float(__import__("os").getpid()) for r in results.values())  # tasks
    assert "toy" in capsys.readouterr().err  # the progress bar
    rows, stds, samples = aggregate({k: {"acc": v["acc"]} for k, v in results.items()})
    assert rows["a"]["acc"] == pytest.approx(2.5) and rows["b"]["acc"] == pytest.approx(3.5)
    assert stds["a"]["acc"] == pytest.approx(math.sqrt(2 / 3))
    assert samples["a"]["acc"] == [1.5, 2.5, 3.5]  # seed order, paired across systems
    table = ResultsTable("toy", "smoke", 3, {"acc": True}, rows, stds, samples=samples)
    assert table.to_json()["samples"]["b"]["acc"] == [2.5, 3.5, 4.5]


def test_a_failed_job_is_named(ray_session):
    with pytest.raises(NshotError, match=r"job \('a', 1\) failed: ValueError: diverged"):
        run_jobs([Job(k, _boom, k) for k in grid(["a"], [0, 1, 2])], progress=False)
    with pytest.raises(NshotError, match="share a key"):
        run_jobs([Job(("a", 0), _boom), Job(("a", 0), _boom)], progress=False)


def _threads(system: str, seed: int) -> dict[str, float]:
    import os

    import torch

    return {"threads": float(torch.get_num_threads()), "pid": float(os.getpid())}


def test_in_process_runs_the_jobs_here_in_order_with_their_threads(monkeypatch, capsys):
    import os

    import torch

    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    before = torch.get_num_threads()
    keys = grid(["a", "b"], [0, 1])
    jobs = [Job(k, _score, k, {"offset": 0.5}) for k in keys]
    results = run_jobs(jobs, description="toy here")
    assert list(results) == keys and results[("b", 1)]["acc"] == 3.5
    assert {r["pid"] for r in results.values()} == {float(os.getpid())}  # no Ray task
    assert "toy here" in capsys.readouterr().err
    one = run_jobs([Job(("a", 0), _threads, ("a", 0), num_cpus=1)], progress=False)
    assert one[("a", 0)]["threads"] == 1.0  # a one-CPU job's thread count, as in a Ray task
    assert torch.get_num_threads() == before  # and the process's own afterwards
    with pytest.raises(NshotError, match=r"job \('a', 1\) failed: ValueError: diverged"):
        run_jobs([Job(k, _boom, k) for k in grid(["a"], [0, 1, 2])], progress=False)
    assert torch.get_num_threads() == before
    monkeypatch.setenv("NSHOT_IN_PROCESS", "maybe")
    with pytest.raises(NshotError, match="NSHOT_IN_PROCESS='maybe'"):
        run_jobs(jobs, progress=False)


def test_progress_writes_plain_lines_where_stderr_is_not_a_terminal(monkeypatch, capsys):
    """A log file (``ray job submit``'s, a nohup log) gets a few plain lines with counts, not
    a bar that draws nothing until the end: the start, the first job, every twentieth, the last."""
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    run_jobs([Job(("a", s), _score, ("a", s)) for s in range(45)], description="toy log")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[nshot] toy log: 45 jobs"
    done = [ln for ln in lines if " done | " in ln]
    counts = [int(ln.split(": ", 1)[1].split("/")[0]) for ln in done]
    assert counts == [1, *range(3, 46, 3)]  # every ceil(45 / 20) = 3 jobs, and the last
    assert done[-1].startswith("[nshot] toy log: 45/45 done | ") and "ETA" not in done[-1]
    assert all(", ETA " in ln for ln in done[:-1])
    assert done[-1].endswith("(last: a/44)")
    assert len(lines) == 1 + len(done)


def test_in_process_fetches_object_refs_as_a_task_would(ray_session, monkeypatch):
    import os

    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    ref = ray_session.put(0.25)
    out = run_jobs([Job(("b", 1), _score, ("b", 1), {"offset": ref})], progress=False)
    assert out[("b", 1)] == {"acc": 3.25, "pid": float(os.getpid())}


def _on_top(pre: dict[str, float], seed: int, offset: float) -> dict[str, float]:
    import os

    return {"acc": pre["acc"] + seed + offset, "pid": float(os.getpid())}


def _share_and_submit(expect_here: bool) -> None:
    import os

    pre = submit(Job(("pre",), _score, ("a", 0), num_cpus=0.5))  # starts now
    offset = share(0.25)  # stored once for both jobs
    jobs = [Job(("b", s), _on_top, (pre, s, offset), num_cpus=0.5) for s in (0, 1)]
    out = run_jobs(jobs, progress=False)
    assert [r["acc"] for r in out.values()] == [1.25, 2.25]  # each job got the values
    first = fetch(pre)
    assert first["acc"] == 1.0 and fetch(offset) == 0.25
    here = float(os.getpid())
    assert (first["pid"] == here) is expect_here  # a Ray task, or this process
    assert all((r["pid"] == here) is expect_here for r in out.values())


def test_share_and_submit_feed_later_jobs_as_ray_tasks(ray_session):
    import ray

    assert isinstance(share([1, 2]), ray.ObjectRef)
    _share_and_submit(expect_here=False)


def test_share_and_submit_in_process_are_the_values_themselves(monkeypatch):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    data = [1, 2]
    assert share(data) is data and fetch(data) is data
    _share_and_submit(expect_here=True)


def test_aggregate_ci95_and_missing_values():
    res = {("s", 0): {"m": 1.0, "x": None}, ("s", 1): {"m": 3.0, "x": 1.0}}
    rows, stds, samples = aggregate(res, spread="ci95")
    assert rows["s"]["m"] == 2.0
    assert stds["s"]["m"] == pytest.approx(1.96 * math.sqrt(2.0) / math.sqrt(2))
    assert rows["s"]["x"] is None and stds["s"]["x"] is None  # a job without a value: no mean
    assert samples["s"]["x"] == [None, 1.0]
    with pytest.raises(ValueError):
        aggregate(res, spread="iqr")


def test_aggregate_sample_std_is_numpys_ddof1_and_none_for_one_seed():
    res = {("a", 0): {"x": 1.0}, ("a", 1): {"x": 2.5}, ("a", 2): {"x": 4.0}, ("b", 0): {"x": 3.0}}
    rows, stds, _ = aggregate(res, spread="sample_std")
    assert stds["a"]["x"] == float(np.std(np.array([1.0, 2.5, 4.0]), ddof=1)) == 1.5
    assert rows["b"]["x"] == 3.0 and stds["b"]["x"] is None


def _dies_once(marker: str) -> dict[str, float]:
    import os
    from pathlib import Path

    if not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)  # the worker process dies under the job, as under the OOM killer
    return {"acc": 1.0}


def test_a_job_whose_worker_dies_runs_again_and_without_retries_is_named(ray_session, tmp_path):
    once = str(tmp_path / "once")
    out = run_jobs([Job(("a", 0), _dies_once, (once,), num_cpus=0.5)], progress=False)
    assert out[("a", 0)] == {"acc": 1.0} and (tmp_path / "once").read_text() == "died"
    never = str(tmp_path / "never")
    with pytest.raises(NshotError, match=r"job \('a', 0\) failed: .*Worker"):
        run_jobs([Job(("a", 0), _dies_once, (never,), num_cpus=0.5)], progress=False, max_retries=0)
    assert fetch(submit(Job(("s",), _dies_once, (str(tmp_path / "sub"),), num_cpus=0.5))) == {
        "acc": 1.0
    }


def test_planning_lists_the_grid_with_its_resources_and_runs_nothing():
    """``nshot reproduce --dry-run``: submitted jobs and the grid are recorded, nothing runs,
    and under a GPU scale the jobs that train a network take the scale's CPUs, GPUs and
    threads while the others keep their own request."""
    from nshot.experiment import JobScale, PlanComplete, planning, scaled

    def comparison():
        ahead = submit(Job(("pre",), _boom, ("a", 1), trains=True))
        assert ahead is None  # never run
        run_jobs(
            [
                Job(("a", 0), _boom, ("a", 1), trains=True),
                Job(("b", 0), _boom, ("b", 1), num_cpus=2),
            ]
        )
        raise AssertionError("run_jobs returned while planning")

    with scaled(JobScale.preset("gpu8")), planning() as plan:
        with pytest.raises(PlanComplete):
            comparison()
    assert [p["key"] for p in plan] == [["pre"], ["a", "0"], ["b", "0"]]
    assert [(p["cpus"], p["gpus"], p["threads"]) for p in plan] == [
        (8.0, 1.0, 8),
        (8.0, 1.0, 8),
        (2, 0.0, 2),
    ]
    with planning() as plan:  # no scale: as declared
        with pytest.raises(PlanComplete):
            comparison()
    assert [(p["cpus"], p["gpus"]) for p in plan] == [(1.0, 0.0), (1.0, 0.0), (2, 0.0)]


def test_a_scaled_training_job_runs_with_the_scales_threads_in_process(monkeypatch):
    from nshot.experiment import JobScale, scaled

    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")

    def threads() -> int:
        import torch

        return torch.get_num_threads()

    with scaled(JobScale("t", 2.0, 0.0)):
        got = run_jobs([Job(("t",), threads, trains=True), Job(("o",), threads)], progress=False)
    assert got == {("t",): 2, ("o",): 1}
