"""Storage errors while a run writes a checkpoint (a full volume, permission denied, a read-only
mount, a vanished directory) end ``nshot train`` with one ``nshot: error:`` line naming the
path, what happened, the newest complete checkpoint and the command that resumes; a write that
fails half way is never taken as the newest checkpoint by any reader.

The faults are injected with the test-only ``NSHOT_TEST_CHECKPOINT_FAULT`` (``<ERRNO>@<step>``:
every checkpoint of that step or later fails half way through, ``model.safetensors`` cut to half
its size), which the runner hands to Ray Train workers too.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from nshot.cli import main
from nshot.errors import NshotError, StorageError
from nshot.method import get
from nshot.train import Scaling, fit, load_checkpoint
from nshot.train import checkpoint as ckpt_mod
from nshot.train.checkpoint import (
    FAULT_ENV,
    CheckpointWriteError,
    find_checkpoints,
    has_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from nshot.train.runner import _check_resumable, train_command
from nshot.train.storage_errors import (
    CheckpointStorageError,
    StorageFault,
    find_storage_fault,
    storage_error_message,
)


def _tail(path: Path, step: int, *, optimizer: bool = True) -> Path:
    """A checkpoint of a `smoke` TAIL model (a registered method, so every reader takes it)."""
    from nshot.methods.tail.model import TailModel

    tail = get("tail")
    cfg = tail.config("smoke")
    torch.manual_seed(step)
    model = TailModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer else None
    if opt is not None:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    return save_checkpoint(
        path,
        method="tail",
        method_version=tail.version,
        config=cfg.model_dump(),
        step=step,
        model_state=model.state_dict(),
        optimizer_state=opt.state_dict() if opt is not None else None,
    )


def _newest_everywhere(storage: Path, run: Path, expected: Path) -> None:
    """Every reader takes ``expected`` as the run's newest checkpoint."""
    from nshot.serve.runs import find_runs

    assert find_checkpoints(run)[-1] == expected
    assert resolve_checkpoint(run) == expected
    assert load_checkpoint(run).path == expected
    load_checkpoint(run).weights()
    assert find_runs(storage).chosen == {"tail": expected}
    _check_resumable(run, local=True, allow_earlier=False)  # resume: no complaint
    _check_resumable(run, local=False, allow_earlier=False)


def _only_entries(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


# --------------------------------------------------------------------------- the message


FAULT_PATH = "/data/runs/r/checkpoint_00000030/model.safetensors"
COMMAND = ["nshot", "train", "tail", "--preset", "smoke", "--name", "r", "--resume"]


@pytest.mark.parametrize(
    ("code", "name", "what", "todo"),
    [
        (errno.ENOSPC, "ENOSPC", "no space left on device", "free space on the volume of"),
        (errno.EACCES, "EACCES", "permission denied", "writable for this user"),
        (errno.EPERM, "EPERM", "operation not permitted", "writable for this user"),
        (errno.EROFS, "EROFS", "read-only file system", "read-write"),
        (errno.ENOENT, "ENOENT", "a directory vanished", "restore the missing directory"),
    ],
)
def test_the_message_names_path_cause_newest_checkpoint_and_resume_command(code, name, what, todo):
    fault = StorageFault(code, FAULT_PATH, "/data/runs/r/checkpoint_00000030", OSError(code, "x"))
    newest = (Path("/data/runs/r/checkpoint_00000020"), 20)
    msg = storage_error_message(fault, storage="/data/runs", newest=newest, command=COMMAND)
    assert "\n" not in msg
    assert "writing checkpoint /data/runs/r/checkpoint_00000030" in msg
    assert f"{what} ({name} on {FAULT_PATH})" in msg
    assert "storage: /data/runs" in msg and todo in msg
    assert "newest complete checkpoint: /data/runs/r/checkpoint_00000020 (step 20)" in msg
    assert msg.endswith("resume with: " + shlex.join(COMMAND))
    nothing = storage_error_message(fault, storage="/data/runs", newest=None, command=COMMAND)
    assert "newest complete checkpoint: none yet" in nothing


def test_a_run_whose_folder_vanished_is_started_again():
    fault = StorageFault(errno.ENOENT, "/data/runs/r", None, OSError(errno.ENOENT, "x"))
    msg = storage_error_message(
        fault, storage="/data/runs", newest=None, command=COMMAND[:-1], resume=False
    )
    assert "storage error writing the run" in msg
    assert msg.endswith("start the run again with: " + shlex.join(COMMAND[:-1]))


def test_the_worker_failure_is_unwrapped_from_ray_trains_errors(tmp_path):
    """A worker's exception reaches the driver inside ``WorkerGroupError`` (per rank, wrapped
    with its traceback text, pickled across processes); a controller's inside
    ``ControllerError``; only storage errors are recognised."""
    from ray.train import ControllerError, WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    run = tmp_path / "r"
    written = CheckpointWriteError(
        errno.ENOSPC, "No space left on device", f"{run}/ck/model.safetensors", checkpoint="ck"
    )
    group = WorkerGroupError(
        "rank 1 failed", {1: UserExceptionWithTraceback(written, "Traceback ...")}
    )
    group = pickle.loads(pickle.dumps(group))  # as it crosses from the worker
    fault = find_storage_fault(group, run)
    assert (fault.errno, fault.path, fault.checkpoint) == (
        errno.ENOSPC,
        f"{run}/ck/model.safetensors",
        "ck",
    )
    snapshot = OSError(errno.EROFS, "Read-only file system", str(run / "snapshot.json"))
    fault = find_storage_fault(ControllerError(snapshot), run)
    assert fault.errno == errno.EROFS and fault.checkpoint is None
    # not storage errors: a bug, and a missing file outside the run directory
    assert find_storage_fault(WorkerGroupError("x", {0: ValueError("bug")}), run) is None
    missing = FileNotFoundError(errno.ENOENT, "No such file", "/elsewhere/data.parquet")
    assert find_storage_fault(missing, run) is None


def test_train_command_reads_back_as_the_same_training(tmp_path):
    from nshot.cli import _config, build_parser

    cfg = get("tail").config("smoke", steps=60, lr=2.5e-4, train_tasks="A")
    argv = train_command(
        "tail", cfg, Scaling(workers=2), tmp_path, "r", max_failures=1, resume=True
    )
    assert argv[:5] == ["nshot", "train", "tail", "--preset", "smoke"]
    args = build_parser().parse_args(argv[1:])
    assert args.resume and args.workers == 2 and args.max_failures == 1
    assert args.storage == str(tmp_path) and args.name == "r"
    assert _config("tail", args) == cfg


# --------------------------------------------------------------------------- atomic writes


def _fail_state_json_flush(monkeypatch):
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("state.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(ckpt_mod.os, "fsync", fsync)


def _fail_optimizer_file(monkeypatch):
    real = ckpt_mod.save_file

    def save_file(tensors, filename, *a, **kw):
        if filename.endswith("optimizer.safetensors"):
            Path(filename).write_bytes(b"\x10\x00\x00")  # a few bytes, then the volume is full
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        return real(tensors, filename, *a, **kw)

    monkeypatch.setattr(ckpt_mod, "save_file", save_file)


def _fail_rename(monkeypatch):
    real = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".checkpoint_"):
            raise OSError(errno.EACCES, "Permission denied", str(dst))
        return real(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "rename", rename)


@pytest.mark.parametrize(
    ("stage", "code"),
    [
        ("model file cut half way", errno.ENOSPC),
        ("optimizer file (safetensors' I/O error)", errno.ENOSPC),
        ("state.json not flushed", errno.ENOSPC),
        ("rename refused", errno.EACCES),
    ],
)
def test_a_write_that_fails_half_way_is_never_the_newest(tmp_path, monkeypatch, stage, code):
    storage = tmp_path / "runs"
    run = storage / "r"
    earlier = _tail(run / "checkpoint_00000010", 10)
    if stage.startswith("model"):
        monkeypatch.setenv(FAULT_ENV, "ENOSPC@20")
    elif stage.startswith("optimizer"):
        _fail_optimizer_file(monkeypatch)
    elif stage.startswith("state"):
        _fail_state_json_flush(monkeypatch)
    else:
        _fail_rename(monkeypatch)
    with pytest.raises(CheckpointWriteError) as info:
        _tail(run / "checkpoint_00000020", 20)
    monkeypatch.undo()
    err = info.value
    assert isinstance(err, OSError) and err.errno == code
    assert err.checkpoint == str(run / "checkpoint_00000020")
    assert err.filename.startswith(str(run / "checkpoint_00000020"))
    # nothing of the failed write is left, not even the hidden temporary directory
    assert _only_entries(run) == ["checkpoint_00000010"]
    _newest_everywhere(storage, run, earlier)


def test_a_step_saved_again_keeps_the_old_checkpoint_when_the_new_one_fails(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "r"
    first = _tail(run / "checkpoint_00000010", 10)
    before = load_checkpoint(first).weights()
    real = os.rename

    def rename(src, dst):  # the old one goes aside, then the new one cannot come in
        if Path(src).name.startswith(".checkpoint_00000010.") and ".old." not in str(src):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "rename", rename)
    with pytest.raises(CheckpointWriteError):
        _tail(run / "checkpoint_00000010", 10, optimizer=False)
    monkeypatch.undo()
    assert _only_entries(run) == ["checkpoint_00000010"]
    after = load_checkpoint(run).weights()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_leftovers_of_a_writer_that_died_are_never_read(tmp_path):
    """A process killed while writing leaves its hidden temporary directory (a truncated
    model file; with or without state.json): no reader takes it."""
    storage = tmp_path / "runs"
    run = storage / "r"
    earlier = _tail(run / "checkpoint_00000010", 10)
    done = _tail(tmp_path / "elsewhere" / "checkpoint_00000020", 20)
    for suffix, keep_state in (("abc", False), ("xyz", True)):
        left = run / f".checkpoint_00000020.{suffix}"
        left.mkdir()
        model = (done / "model.safetensors").read_bytes()
        (left / "model.safetensors").write_bytes(model[: len(model) // 2])
        if keep_state:
            (left / "state.json").write_text((done / "state.json").read_text())
    assert has_checkpoints(run)
    _newest_everywhere(storage, run, earlier)


def test_a_safetensors_io_error_keeps_its_errno(tmp_path, monkeypatch):
    def save_file(*a, **kw):
        raise SafetensorError(
            "Error while serializing: I/O error: Read-only file system (os error 30)"
        )

    monkeypatch.setattr(ckpt_mod, "save_file", save_file)
    with pytest.raises(CheckpointWriteError) as info:
        _tail(tmp_path / "checkpoint_00000001", 1)
    assert info.value.errno == errno.EROFS
    assert info.value.filename == str(tmp_path / "checkpoint_00000001" / "model.safetensors")
    assert isinstance(info.value.__cause__, SafetensorError)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the command line


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nshot: ")]


@pytest.mark.parametrize("verbose", [False, True])
def test_the_cli_says_it_in_one_line_and_shows_a_traceback_only_when_verbose(
    tmp_path, monkeypatch, capsys, verbose
):
    """``nshot train`` spells the resume command as it was typed (plus --name and --resume);
    ``--verbose`` prints the worker's traceback (carried inside Ray Train's error) first."""
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    import nshot.train

    monkeypatch.delenv("NSHOT_VERBOSE", raising=False)

    def fake_fit(method, cfg, *, storage, **kw):
        run = Path(storage) / "tail-smoke"
        written = CheckpointWriteError(
            errno.ENOSPC, "No space left on device", str(run / "c" / "m"), checkpoint="c"
        )
        group = WorkerGroupError("x", {0: UserExceptionWithTraceback(written, "worker tb")})
        fault = find_storage_fault(group, run)
        try:
            raise group
        except WorkerGroupError as cause:
            raise CheckpointStorageError(
                fault,
                storage=storage,
                run_dir=run,
                newest=None,
                command=["nshot", "api-spelling"],
                resume=True,
            ) from cause

    monkeypatch.setattr(nshot.train, "fit", fake_fit)
    argv = ["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--overwrite"]
    assert main([*argv, *(["--verbose"] if verbose else [])]) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert len(lines) == 1 and err.rstrip().endswith(lines[0])
    again = ["nshot", "train", "tail", "--preset", "smoke", "--storage", str(tmp_path)]
    again += [*(["--verbose"] if verbose else []), "--name", "tail-smoke", "--resume"]
    assert lines[0].endswith("resume with: " + shlex.join(again))
    assert "no space left on device" in lines[0] and "none yet" in lines[0]
    assert ("Traceback" in err) is verbose
    assert ("worker tb" in err) is verbose


# --------------------------------------------------------------------------- real runs


def _straight_weights(tmp_path, cfg, scaling):
    return load_checkpoint(
        fit("tail", cfg, scaling=scaling, storage=tmp_path / "clean", name="clean").checkpoint
    ).weights()


@pytest.mark.usefixtures("ray_session")
def test_nshot_train_out_of_space_says_how_to_resume_and_the_resume_finishes(
    tmp_path, monkeypatch, capsys
):
    """`nshot train tail --preset smoke` (in-process) whose storage fills up at the third
    checkpoint: one error line, the two checkpoints before it intact, and the command it
    prints, run once there is space again, finishes the run as if nothing had happened."""
    storage = tmp_path / "runs"
    run = storage / "r"
    argv = ["train", "tail", "--preset", "smoke", "--set", "checkpoint_every=10",
            "--storage", str(storage), "--name", "r"]  # fmt: skip
    monkeypatch.setenv(FAULT_ENV, "ENOSPC@30")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "SafetensorError" not in err, err
    (line,) = _error_lines(err)
    assert line.startswith("nshot: error: storage error writing checkpoint ")
    assert f"{run / 'checkpoint_00000030'}: no space left on device (ENOSPC on " in line
    assert f"storage: {storage}" in line
    assert f"newest complete checkpoint: {run / 'checkpoint_00000020'} (step 20)" in line
    command = line.split("resume with: ", 1)[1]
    assert command == "nshot " + " ".join(argv) + " --resume"

    assert [p.name for p in find_checkpoints(run)] == ["checkpoint_00000010", "checkpoint_00000020"]
    assert not [p for p in run.iterdir() if p.name.startswith(".checkpoint")]
    for step in (10, 20):
        kept = load_checkpoint(run / f"checkpoint_{step:08d}", "tail")
        assert kept.step == step and kept.weights()
    monkeypatch.delenv(FAULT_ENV)  # space again
    assert main(shlex.split(command)[1:]) == 0
    done = load_checkpoint(run, "tail")
    assert done.step == 50 and done.extra["resumed_from"] == [20]
    cfg = get("tail").config("smoke", checkpoint_every=10)
    straight = _straight_weights(tmp_path, cfg, Scaling())
    resumed = done.weights()
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


@pytest.mark.usefixtures("ray_session")
def test_a_worker_groups_storage_error_reaches_the_api_as_one_error(tmp_path, monkeypatch):
    """On a Ray Train worker group the fault happens in the worker process; the error that
    reaches `fit` is unwrapped from Ray Train's and names the newest complete checkpoint; a
    resume with the same arguments finishes."""
    storage = tmp_path / "runs"
    run = storage / "w"
    cfg = get("tail").config("smoke", checkpoint_every=10)
    monkeypatch.setenv(FAULT_ENV, "EACCES@20")
    with pytest.raises(StorageError) as info:
        fit("tail", cfg, scaling=Scaling(workers=1), storage=storage, name="w")
    err = info.value
    assert isinstance(err, NshotError) and isinstance(err, CheckpointStorageError)
    msg = str(err)
    assert "\n" not in msg and "permission denied (EACCES on " in msg
    assert f"newest complete checkpoint: {run / 'checkpoint_00000010'} (step 10)" in msg
    expected = train_command("tail", cfg, Scaling(workers=1), storage, "w")
    assert msg.endswith("resume with: " + shlex.join(expected))
    assert "--workers 1" in msg and msg.endswith("--resume")
    assert not [p for p in run.glob("*checkpoint_0*") if p.name != "checkpoint_00000010"]
    assert load_checkpoint(run, "tail").step == 10

    monkeypatch.delenv(FAULT_ENV)
    done = fit("tail", cfg, scaling=Scaling(workers=1), storage=storage, name="w", resume=True)
    final = load_checkpoint(done.checkpoint, "tail")
    assert final.step == 50 and final.extra["resumed_from"] == [10]
    assert json.loads((run / "nshot_run.json").read_text())["method"] == "tail"
