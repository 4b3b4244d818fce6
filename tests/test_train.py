"""The Ray Train runner: worker groups, fault tolerance, resume, run directories."""

from __future__ import annotations

import pytest
import torch

from nshot.method import NshotError, get
from nshot.train import Scaling, fit, load_checkpoint

pytestmark = pytest.mark.usefixtures("ray_session")


def _weights(path):
    return load_checkpoint(path).weights()


def _assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_killed_worker_resumes_from_last_checkpoint(tmp_path):
    """Two Ray Train workers; rank 1 dies at step 30 (checkpoint every 25): the group restarts,
    resumes from step 25 and ends with exactly the weights of an uninterrupted run."""
    cfg = get("tail").config("smoke", steps=50, checkpoint_every=25, log_every=10)
    faulty = fit(
        "tail",
        cfg.replace(fail_at_step=30, fail_rank=1),
        scaling=Scaling(workers=2),
        storage=tmp_path,
        name="faulty",
        max_failures=1,
    )
    ckpt = load_checkpoint(faulty.checkpoint)
    assert ckpt.step == 50
    assert ckpt.extra["resumed_from"] == [25]
    steps = [h["step"] for h in ckpt.extra["history"]]
    assert steps == [10, 20, 25, 30, 40, 50]  # none repeated, none lost
    clean = fit("tail", cfg, scaling=Scaling(workers=2), storage=tmp_path, name="clean")
    _assert_same_weights(_weights(faulty.checkpoint), _weights(clean.checkpoint))


def test_fault_without_retries_fails(tmp_path):
    cfg = get("tail").config("smoke", steps=10, fail_at_step=5)
    with pytest.raises(RuntimeError, match="injected fault"):
        fit("tail", cfg, scaling=Scaling(workers=0), storage=tmp_path, name="dies")


def test_local_resume_continues_the_run(tmp_path):
    method = get("tail")
    short = method.config("smoke", steps=25, checkpoint_every=25)
    first = fit("tail", short, storage=tmp_path, name="run")
    assert load_checkpoint(first.checkpoint).step == 25
    with pytest.raises(NshotError, match="already exists.*--resume"):
        fit("tail", short, storage=tmp_path, name="run")
    resumed = fit("tail", short.replace(steps=50), storage=tmp_path, name="run", resume=True)
    ck = load_checkpoint(resumed.checkpoint)
    assert ck.step == 50 and ck.extra["resumed_from"] == [25]
    straight = fit("tail", short.replace(steps=50), storage=tmp_path, name="straight")
    _assert_same_weights(_weights(resumed.checkpoint), _weights(straight.checkpoint))


def test_resume_without_a_run_is_an_error(tmp_path):
    with pytest.raises(NshotError, match="no run to resume"):
        fit("tail", get("tail").config("smoke"), storage=tmp_path, name="x", resume=True)


def test_bad_scaling_is_rejected(tmp_path):
    from nshot.method import ConfigError

    with pytest.raises(ConfigError, match="--workers"):
        fit("tail", get("tail").config("smoke"), scaling=Scaling(workers=-1), storage=tmp_path)
    with pytest.raises(ConfigError, match="unknown preset"):
        Scaling.preset("huge")


def test_progress_line_says_step_of_total_and_eta():
    from nshot.train.session import RunInfo, _progress_line

    info = RunInfo(method="tail", method_version="1", config={"steps": 200})
    info.started -= 10
    first = _progress_line(info, 50, {"loss": 0.5, "step": 50.0})
    assert first.startswith("[nshot tail] step 50/200 (25%) loss=0.5 | 10s")
    assert "ETA" not in first  # no pace yet
    info._progress_start = (50, info._progress_start[1] - 20)  # 20 s for 50 steps: 100 left
    later = _progress_line(info, 100, {"loss": 0.4})
    assert "step 100/200 (50%)" in later and "ETA 40s" in later


def test_benign_ray_error_lines_are_dropped_and_others_printed(monkeypatch):
    from ray._private import worker as ray_worker
    from ray._private.ray_logging import WorkerStandardStreamDispatcher

    from nshot.train.runner import _drop_benign_ray_lines

    printed: list[list[str]] = []
    dispatcher = WorkerStandardStreamDispatcher()
    dispatcher.add_handler("ray_print_logs", lambda data: printed.append(data["lines"]))
    monkeypatch.setattr(ray_worker, "global_worker_stdstream_dispatcher", dispatcher)
    monkeypatch.delenv("NSHOT_VERBOSE", raising=False)
    _drop_benign_ray_lines()
    _drop_benign_ray_lines()  # idempotent: one filter
    benign = (
        "[E core_worker.cc:2465] Actor with class name: 'PreemptionWatcher' and ID: 'ab' has "
        "constructor arguments in the object store and max_restarts > 0."
    )
    dispatcher.emit({"lines": [benign, "a real error"], "pid": 1, "is_err": True})
    dispatcher.emit({"lines": [benign], "pid": 1, "is_err": True})
    assert printed == [["a real error"]]


def test_a_run_records_where_rays_own_logs_are(ray_session, tmp_path, capsys):
    """Ray's INFO lines leave the terminal; the run's marker and the last line say where they
    are kept."""
    import json
    from pathlib import Path

    from nshot.cli import main

    argv = ["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--name", "r"]
    assert main([*argv, "--set", "steps=4", "--set", "log_every=2", "--set",
                 "checkpoint_every=2"]) == 0  # fmt: skip
    marker = json.loads((tmp_path / "r" / "nshot_run.json").read_text())
    assert Path(marker["ray_logs"]).is_dir()
    # rich wraps long lines, inside a long path too: compare without any whitespace
    out = "".join(capsys.readouterr().out.split())
    assert f"Ray'ssessionlogs:{marker['ray_logs']}" in out
    # the run's own Ray lines are copied into the run folder
    copied = tmp_path / "r" / "ray_logs"
    assert f"Ray'sownlogsofthisrun:{copied}" in out
    assert any(p.suffix in (".out", ".err", ".log") for p in copied.iterdir())


def test_embedded_rays_workers_know_its_address(ray_session):
    """Ray's State API (polled by Ray Train's placement-group cleaner in a worker) must find
    this cluster even when the machine runs several Ray instances: the embedded Ray's workers
    carry RAY_ADDRESS, the address of its own GCS."""
    import os

    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("connected to an external cluster")

    @ray_session.remote
    def address() -> str | None:
        return os.environ.get("RAY_ADDRESS")

    got = ray_session.get(address.remote())
    assert got is not None and got == ray_session.get_runtime_context().gcs_address
    assert "RAY_GCS_SERVER_PORT" not in os.environ  # set only while ray.init ran
