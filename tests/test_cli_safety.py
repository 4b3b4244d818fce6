"""Command-line and runner safety: nothing written or deleted outside ``<storage>/<name>``,
every bad command line one ``nshot: error:`` line with exit status 2 (checked before Ray
starts), Ctrl-C during training one line that says how to resume, ``nshot eval --set`` never
contradicting the checkpoint's weights.

Most tests replace ``ensure_ray`` (and, where training would begin, Ray Train's
``TorchTrainer``) by stand-ins that raise: a check that happens only after Ray has started
fails the test instead of starting Ray.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nshot.cli import main
from nshot.method import ConfigError, NshotError, available, get
from nshot.train import fit


class RayStarted(Exception):
    """Raised by the stand-in for ``ensure_ray``: the command got past its checks."""


class TrainingStarted(Exception):
    """Raised by the stand-in ``TorchTrainer.fit``: training would have begun."""


@pytest.fixture
def no_ray(monkeypatch):
    """``ensure_ray`` raises: the checks under test must fail before Ray starts."""

    import nshot.tune.run  # noqa: F401 - imported first, so it binds the real ensure_ray

    def refuse(**_kw):
        raise RayStarted

    monkeypatch.setattr("nshot.train.runner.ensure_ray", refuse)
    monkeypatch.setattr("nshot.tune.run.ensure_ray", refuse)


@pytest.fixture
def fake_trainer(monkeypatch):
    """Ray is never started; ``TorchTrainer.fit`` records what the run directory held when
    training would have begun, then raises :class:`TrainingStarted`."""
    import ray.train.torch

    import nshot.tune.run  # noqa: F401 - imported first, so it binds the real ensure_ray

    seen: dict = {}

    class FakeTrainer:
        def __init__(self, fn, *, train_loop_config, scaling_config, run_config):
            self.run_dir = Path(run_config.storage_path) / run_config.name

        def fit(self):
            seen["run_dir"] = self.run_dir
            seen["files"] = sorted(p.name for p in self.run_dir.iterdir())
            marker = self.run_dir / "nshot_run.json"
            seen["marker"] = json.loads(marker.read_text()) if marker.is_file() else None
            raise TrainingStarted

    monkeypatch.setattr("nshot.train.runner.ensure_ray", lambda **_kw: None)
    monkeypatch.setattr(ray.train.torch, "TorchTrainer", FakeTrainer)
    return seen


def _smoke():
    return get("tail").config("smoke")


def _victim(path: Path) -> Path:
    """A directory a user cares about (one file in it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "precious.txt").write_text("do not delete")
    return path


def _intact(path: Path) -> bool:
    return (path / "precious.txt").read_text() == "do not delete"


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("nshot: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- 1. names, overwrite


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize(
    "name", ["../victim", "VICTIM_ABS", "sub/run", "a\\b", "..", ".", "", "a\0b"]
)
def test_run_name_is_one_path_component(tmp_path, name):
    storage = tmp_path / "storage"
    victim = _victim(tmp_path / "victim")
    if name == "VICTIM_ABS":
        name = str(victim)
    with pytest.raises(ConfigError, match="--name"):
        fit("tail", _smoke(), storage=storage, name=name, overwrite=True)
    assert _intact(victim)


@pytest.mark.usefixtures("no_ray")
def test_cli_name_outside_storage_deletes_nothing(tmp_path, capsys):
    victim = _victim(tmp_path / "victim")
    storage = tmp_path / "storage"
    for name in (str(victim), "../victim"):
        argv = ["train", "tail", "--preset", "smoke", "--storage", str(storage), "--name", name]
        assert main([*argv, "--overwrite"]) == 2
        assert "--name" in _one_error_line(capsys.readouterr().err)
        assert _intact(victim)


@pytest.mark.usefixtures("no_ray")
def test_overwrite_refuses_a_directory_that_is_not_an_nshot_run(tmp_path):
    storage = tmp_path / "storage"
    victim = _victim(storage / "photos")
    with pytest.raises(NshotError, match="not an nshot run.*nshot_run.json"):
        fit("tail", _smoke(), storage=storage, name="photos", overwrite=True)
    assert _intact(victim)
    # a marker that is a link, or not a JSON object, is no marker
    (victim / "nshot_run.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"method": "tail"}')
    with pytest.raises(NshotError, match="not an nshot run"):
        fit("tail", _smoke(), storage=storage, name="photos", overwrite=True)
    (victim / "nshot_run.json").unlink()
    (victim / "nshot_run.json").write_text("[1, 2]")
    with pytest.raises(NshotError, match="not an nshot run"):
        fit("tail", _smoke(), storage=storage, name="photos", overwrite=True)
    assert _intact(victim)


@pytest.mark.usefixtures("no_ray")
def test_run_directory_that_is_a_symlink_is_refused(tmp_path):
    storage = tmp_path / "storage"
    victim = _victim(tmp_path / "victim")
    (victim / "nshot_run.json").write_text('{"method": "tail"}')  # even a marked one
    storage.mkdir()
    (storage / "link").symlink_to(victim, target_is_directory=True)
    for kw in ({"overwrite": True}, {"resume": True}):
        with pytest.raises(NshotError, match="symbolic link"):
            fit("tail", _smoke(), storage=storage, name="link", **kw)
    assert _intact(victim)


def test_remote_run_directory_marker_and_name(tmp_path):
    """Behind a URI (pyarrow's file system; ``file://`` here, the same code as ``s3://``) a
    run is recognised by its marker alone, and a name is one component before any I/O."""
    from nshot.train.runner import _RunDir

    _victim(tmp_path / "photos")
    run = _RunDir(f"file://{tmp_path}", "photos")
    assert run.has_files() and not run.is_run()
    (tmp_path / "photos" / "nshot_run.json").write_text('{"method": "tail"}')
    assert run.is_run()
    for name in ("../x", "a/b", ".."):
        with pytest.raises(ConfigError, match="--name"):
            _RunDir("s3://bucket/runs", name)


def test_marker_is_written_before_training_on_a_fresh_run(tmp_path, fake_trainer):
    with pytest.raises(TrainingStarted):
        fit("tail", _smoke(), storage=tmp_path, name="fresh")
    assert fake_trainer["marker"]["method"] == "tail"
    assert fake_trainer["marker"]["format"] == "nshot-run/1"
    assert fake_trainer["files"] == ["nshot_run.json"]


def test_overwrite_replaces_an_nshot_run(tmp_path, fake_trainer):
    run = tmp_path / "run"
    run.mkdir()
    (run / "nshot_run.json").write_text('{"method": "tail", "config": {}}')  # an older marker
    (run / "checkpoint_00000025").mkdir()
    with pytest.raises(TrainingStarted):
        fit("tail", _smoke(), storage=tmp_path, name="run", overwrite=True)
    assert fake_trainer["files"] == ["nshot_run.json"]  # the old run is gone, a new marker
    assert fake_trainer["marker"]["config"]["preset"] == "smoke"


def test_prune_never_deletes_through_a_link(tmp_path):
    from nshot.train.runner import _prune_local

    victim = _victim(tmp_path / "victim")
    (victim / "ckpt").mkdir()
    (victim / "ckpt" / "state.json").write_text('{"step": 1}')
    run = tmp_path / "run"
    for step in (2, 3):
        (run / f"checkpoint_{step}").mkdir(parents=True)
        (run / f"checkpoint_{step}" / "state.json").write_text(json.dumps({"step": step}))
    (run / "linked").symlink_to(victim, target_is_directory=True)
    _prune_local(run, keep=1)
    assert (victim / "ckpt" / "state.json").is_file() and _intact(victim)
    assert not (run / "checkpoint_2").exists() and (run / "checkpoint_3").exists()


@pytest.mark.usefixtures("no_ray")
def test_sweep_name_is_one_path_component(tmp_path):
    from nshot.tune.run import tune

    for name in ("../sweep", str(tmp_path / "abs"), "a/b"):
        with pytest.raises(ConfigError, match="--name"):
            tune("tail", _smoke(), storage=tmp_path / "tune", name=name, num_samples=1)
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "abs").exists()


# --------------------------------------------------------------------------- 11/12. bad arguments


@pytest.mark.usefixtures("no_ray")
def test_storage_that_cannot_be_a_directory_fails_before_ray(tmp_path, capsys):
    a_file = tmp_path / "hostname"
    a_file.write_text("host\n")
    for storage in (a_file / "runs", Path("/proc/nshot-no-such/runs"), Path("/proc")):
        argv = ["train", "tail", "--preset", "smoke", "--storage", str(storage), "--name", "r"]
        assert main(argv) == 2
        assert f"--storage {storage}" in _one_error_line(capsys.readouterr().err)
    # the run directory itself is a file
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "r").write_text("x")
    with pytest.raises(NshotError, match="not a directory"):
        fit("tail", _smoke(), storage=tmp_path / "s", name="r", overwrite=True)


@pytest.mark.usefixtures("no_ray")
def test_empty_storage_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "tail", "--preset", "smoke", "--storage", ""]) == 2
    assert "--storage" in _one_error_line(capsys.readouterr().err)
    with pytest.raises(ConfigError, match="--storage"):
        fit("tail", _smoke(), storage="  ")
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


@pytest.mark.usefixtures("no_ray")
def test_negative_max_failures_is_refused(tmp_path, capsys):
    argv = ["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--max-failures"]
    assert main([*argv, "-5"]) == 2
    assert "--max-failures" in _one_error_line(capsys.readouterr().err)


def _corrupt(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    state = json.loads((dst / "state.json").read_text())
    edit(state)
    (dst / "state.json").write_text(json.dumps(state))
    return dst


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(step="abc"),
        lambda s: s.pop("config"),
        lambda s: s.update(files=list(s["files"])),
    ],
    ids=["step-abc", "no-config", "files-list"],
)
def test_malformed_state_json_is_one_line(untrained_tail_checkpoint, tmp_path, capsys, edit):
    ckpt = _corrupt(untrained_tail_checkpoint, tmp_path / "ckpt", edit)
    assert main(["eval", "tail", "--checkpoint", str(ckpt)]) == 2
    _one_error_line(capsys.readouterr().err)


class ServeStarted(Exception):
    pass


@pytest.fixture
def fake_serve(monkeypatch):
    """``nshot.serve.start`` records its arguments and raises: nothing is served."""
    seen: dict = {}

    def start(method, checkpoint, **kw):
        seen.update(method=method, checkpoint=checkpoint, **kw)
        raise ServeStarted

    monkeypatch.setattr("nshot.serve.start", start)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return seen


def _serve(ckpt, *extra) -> list[str]:
    return ["serve", "tail", "--checkpoint", str(ckpt), *extra]


def test_serve_bad_port_and_host_are_one_line(untrained_tail_checkpoint, fake_serve, capsys):
    for port in ("99999", "0", "-1"):
        assert main(_serve(untrained_tail_checkpoint, "--port", port)) == 2
        assert "--port" in _one_error_line(capsys.readouterr().err)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(_serve(untrained_tail_checkpoint, "--port", str(port))) == 2
        assert "already in use" in _one_error_line(capsys.readouterr().err)
    # 192.0.2.1 (TEST-NET-1) is never an address of this host
    assert main(_serve(untrained_tail_checkpoint, "--host", "192.0.2.1", "--port", "8123")) == 2
    assert "--host 192.0.2.1" in _one_error_line(capsys.readouterr().err)
    assert not fake_serve  # never started
    with socket.socket() as free:  # a free port passes the checks
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ServeStarted):
        main(_serve(untrained_tail_checkpoint, "--port", str(port)))
    assert (
        fake_serve["port"] == port and Path(fake_serve["checkpoint"]) == untrained_tail_checkpoint
    )


@pytest.mark.usefixtures("fake_serve")
def test_unknown_method_is_named_first(untrained_tail_checkpoint, capsys):
    for cmd in ("serve", "eval"):
        assert main([cmd, "nosuch", "--checkpoint", str(untrained_tail_checkpoint)]) == 2
        assert "unknown method 'nosuch'" in _one_error_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- 12. eval overrides


class Evaluated(Exception):
    pass


@pytest.fixture
def fake_evaluate(monkeypatch):
    """TAIL's ``evaluate`` records the config it was given and raises (no episodes run)."""
    seen: dict = {}

    def evaluate(self, checkpoint, cfg):
        seen["cfg"] = cfg
        raise Evaluated

    monkeypatch.setattr(type(get("tail")), "evaluate", evaluate)
    return seen


def test_eval_refuses_overrides_that_shape_the_model(
    untrained_tail_checkpoint, fake_evaluate, capsys
):
    ck = ["eval", "tail", "--checkpoint", str(untrained_tail_checkpoint)]
    assert main([*ck, "--set", "depth=2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "field 'depth' shapes the model and is fixed by the checkpoint (1)" in line
    assert main([*ck, "--set", "eval_episodes=3", "--set", "d_label=64"]) == 2
    assert "field 'd_label'" in _one_error_line(capsys.readouterr().err)
    assert "cfg" not in fake_evaluate
    # evaluation knobs, and a model field at the checkpoint's own value, are accepted
    with pytest.raises(Evaluated):
        main([*ck, "--set", "eval_episodes=3", "--set", "eval_draws=2", "--set", "depth=1"])
    cfg = fake_evaluate["cfg"]
    assert (cfg.eval_episodes, cfg.eval_draws, cfg.depth) == (3, 2, 1)


def test_eval_fields_are_fields_and_never_shape_the_model():
    from nshot.method import MethodConfig

    assert {"seed", "torch_threads", "log_every"} <= MethodConfig.EVAL_FIELDS
    shaping = {"depth", "heads", "mlp_dim", "d_data", "d_label", "width", "layers", "d", "k",
               "model", "rank", "d_z", "ff", "dictionary_size", "patch", "canvas", "steps", "lr"}  # fmt: skip
    for name in available():
        cls = get(name).Config
        assert cls.EVAL_FIELDS <= set(cls.model_fields), name
        assert not cls.EVAL_FIELDS & shaping, (name, cls.EVAL_FIELDS & shaping)
    assert {"eval_episodes", "eval_draws", "features_path"} <= get("tail").Config.EVAL_FIELDS


# --------------------------------------------------------------------------- 3. earlier checkpoints


def _run_with_broken_latest(src: Path, run: Path) -> Path:
    shutil.copytree(src, run / "checkpoint_00000001")
    broken = run / "checkpoint_00000002"
    shutil.copytree(src, broken)
    (broken / "state.json").unlink()
    (run / "nshot_run.json").write_text('{"method": "tail"}')
    return run / "checkpoint_00000001"


def test_allow_earlier_checkpoint_flag(
    untrained_tail_checkpoint, tmp_path, fake_evaluate, fake_serve, capsys
):
    earlier = _run_with_broken_latest(untrained_tail_checkpoint, tmp_path / "run")
    run = str(tmp_path / "run")
    assert main(["eval", "tail", "--checkpoint", run]) == 2
    assert "state.json" in _one_error_line(capsys.readouterr().err)
    with pytest.raises(Evaluated):
        main(["eval", "tail", "--checkpoint", run, "--allow-earlier-checkpoint"])
    assert "nshot: warning: " in capsys.readouterr().err  # the earlier one, said in one line
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert main(["serve", "tail", "--checkpoint", run, "--port", str(port)]) == 2
    assert "state.json" in _one_error_line(capsys.readouterr().err)
    with pytest.raises(ServeStarted):
        main(
            [
                "serve",
                "tail",
                "--checkpoint",
                run,
                "--port",
                str(port),
                "--allow-earlier-checkpoint",
            ]
        )
    assert Path(fake_serve["checkpoint"]) == earlier


# --------------------------------------------------------------------------- 11. Ctrl-C


def _default_sigint():  # a child of a shell's background job inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_training_says_how_to_resume(tmp_path):
    storage = tmp_path / "runs"
    argv = ["train", "tail", "--preset", "smoke", "--set", "steps=1000000", "--workers", "0",
            "--storage", str(storage), "--name", "r"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "nshot.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.time() + 150
        while not list(storage.glob("r/checkpoint_*/state.json")):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    line = next(ln for ln in err.splitlines() if ln.startswith("nshot: "))
    assert line.startswith("nshot: interrupted: ")
    ckpts = sorted(storage.glob("r/checkpoint_*"))
    assert str(ckpts[-1]) in line
    resume = line.split("resume with: ", 1)[1]
    assert resume == "nshot " + " ".join(argv) + " --resume"


def test_resume_refuses_a_newest_checkpoint_without_state(
    untrained_tail_checkpoint, tmp_path, fake_trainer, capsys
):
    """--resume would silently continue from an earlier checkpoint; it says so first, and
    --allow-earlier-checkpoint (in-process runs) continues from the earlier one."""
    _run_with_broken_latest(untrained_tail_checkpoint, tmp_path / "tail-smoke")
    base = ["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--resume"]
    assert main(base) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "checkpoint_00000002" in line and "state.json" in line
    assert "fit" not in fake_trainer  # refused before training
    with pytest.raises(TrainingStarted):
        main([*base, "--allow-earlier-checkpoint"])
    assert "using the earlier checkpoint" in capsys.readouterr().err
    assert main([*base, "--workers", "2", "--allow-earlier-checkpoint"]) == 2
    assert "in-process runs (--workers 0) only" in _one_error_line(capsys.readouterr().err)
