"""nshot's Python API (nshot.api): the command line's subcommands as functions.

The examples of docs/python-api.md run here, in order and in one namespace, on the smoke
presets; the rest checks what they cannot show: nothing heavy is imported by ``import nshot``,
bad arguments are refused before Ray starts with the closest names, ``nshot.load`` reads only
the checkpoint (no pickle) and answers as the checkpoint loaded the long way, and
``nshot.train``/``tune``/``reproduce`` stay the subpackages and module they were.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _compare import json_close

import nshot
from nshot.errors import CheckpointError, ConfigError, NshotError, UnknownMethodError

DOC = Path(__file__).parents[1] / "docs" / "python-api.md"


def _doc_examples() -> list[tuple[str, str]]:
    """(the section's heading, the code) of every ```python block of docs/python-api.md."""
    text = DOC.read_text()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        heads = re.findall(r"^## (.+)$", text[: m.start()], flags=re.M)
        out.append((heads[-1] if heads else "top", m.group(1)))
    return out


def _answer(pred) -> dict:
    body = pred.example_request()
    assert body is not None
    return json.loads(pred(pred.Request.model_validate(body)).model_dump_json())


def _long_way(checkpoint) -> object:
    from nshot.method import get
    from nshot.train.checkpoint import load_checkpoint

    return get("tail").predictor(load_checkpoint(checkpoint, method="tail"))


# --------------------------------------------------------------------------- no Ray


def test_import_nshot_imports_neither_torch_nor_ray():
    code = (
        "import nshot, sys\n"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules\n"
        "nshot.load, nshot.list_methods, nshot.NshotError, nshot.TrainedRun\n"  # api: still light
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'nshot.api'\n"
        "assert {'train', 'tune', 'reproduce', 'load', 'evaluate'} <= set(dir(nshot))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_submodules_stay_modules_and_are_callable_whichever_is_imported_first():
    """`nshot.train` is the subpackage (its attributes, `import nshot.train.x`, monkeypatch
    paths, pickling by name) and, called, `nshot.api.train`; also when a submodule was
    imported before anything touched the package's attributes."""
    code = (
        "import nshot.train.runner, nshot.tune.run, nshot.reproduce, nshot, pickle\n"
        "from nshot import api, reproduce\n"
        "assert callable(nshot.train) and callable(nshot.tune) and callable(reproduce)\n"
        "assert nshot.train.fit is nshot.train.runner.fit and reproduce.run\n"
        "import nshot.train as t\n"
        "assert t is nshot.train and pickle.loads(pickle.dumps(t)) is t\n"
        "assert pickle.loads(pickle.dumps(nshot)) is nshot\n"
        "import inspect\n"
        "assert inspect.signature(nshot.tune) == inspect.signature(api.tune)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    # and here, where the package and its submodules are imported in the suite's order
    import inspect

    from ray import cloudpickle

    import nshot.train.runner
    from nshot import api

    assert nshot.train.fit is nshot.train.runner.fit
    assert "preset" in inspect.signature(nshot.train).parameters
    for mod in (nshot, nshot.train, nshot.tune, nshot.reproduce):
        assert pickle.loads(pickle.dumps(mod)) is mod
    # a function pickled by value (a script's, sent to a Ray worker) may name the package
    fn = eval("lambda: (nshot.train.fit, nshot.api.load)", {"nshot": nshot})
    assert cloudpickle.loads(cloudpickle.dumps(fn))() == (nshot.train.runner.fit, api.load)


def test_list_methods_names_every_registered_method_with_its_title():
    from nshot.method import available, get

    methods = nshot.list_methods()
    assert list(methods) == available() and "tail" in methods and len(methods) >= 19
    assert all(methods[n] == get(n).paper and methods[n] for n in methods)


def test_bad_arguments_are_refused_before_ray_starts_with_the_closest_names(monkeypatch):
    import nshot.tune.run  # noqa: F401 - imported first, so it binds the real ensure_ray

    def refuse(**_kw):
        raise AssertionError("Ray was started for arguments that should have been refused")

    monkeypatch.setattr("nshot.train.runner.ensure_ray", refuse)
    monkeypatch.setattr("nshot.tune.run.ensure_ray", refuse)
    cases = [
        (lambda: nshot.train("tial", "smoke"), UnknownMethodError, "did you mean 'tail'?"),
        (lambda: nshot.tune("tial"), UnknownMethodError, "unknown method 'tial'"),
        (lambda: nshot.reproduce("caso", "smoke"), UnknownMethodError, "did you mean 'caos'?"),
        (lambda: nshot.train("tail", "smok"), ConfigError, "did you mean 'smoke'?"),
        (lambda: nshot.reproduce("caos", "huge"), ConfigError, "unknown preset 'huge'"),
        (
            lambda: nshot.train("tail", "smoke", overrides={"step": 3}),
            ConfigError,
            "field 'step': unknown field (did you mean 'steps'?)",
        ),
        (lambda: nshot.train("tail", "smoke", overrides=["depth=0"]), ConfigError, "'depth'"),
        (lambda: nshot.train("tail", overrides={"preset": "x"}), ConfigError, "preset="),
        (lambda: nshot.train("tail", "smoke", workers=-1), ConfigError, "--workers"),
        (lambda: nshot.train("tail", "smoke", name="a/b"), ConfigError, "one path component"),
        (lambda: nshot.tune("tail", "smoke", search="randm"), ConfigError, "'random'?"),
        (
            lambda: nshot.tune(
                "tail", "smoke", space={"depth": {"type": "int", "low": 1, "high": 99}}
            ),
            NshotError,
            "parameter 'depth'",
        ),
        (lambda: nshot.evaluate("/no/such/run"), CheckpointError, "/no/such/run"),
        (lambda: nshot.load(None), CheckpointError, "path of a checkpoint"),
    ]
    for call, kind, fragment in cases:
        with pytest.raises(kind) as err:
            call()
        assert fragment in str(err.value), (fragment, str(err.value))


def test_load_refuses_a_path_that_is_neither_a_checkpoint_nor_a_run_naming_it(
    tmp_path, untrained_tail_checkpoint
):
    (tmp_path / "file.txt").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    (tmp_path / "other" / "sub").mkdir(parents=True)
    (tmp_path / "other" / "sub" / "notes.md").write_text("x")
    half = tmp_path / "run" / "checkpoint_00000002"  # a checkpoint without its state.json
    shutil.copytree(untrained_tail_checkpoint, half)
    (half / "state.json").unlink()
    for path, fragment in [
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "file.txt", "is not a directory"),
        (tmp_path / "empty", "no nshot checkpoint"),
        (tmp_path / "other", "no nshot checkpoint"),
        (half, "has no state.json"),
        (half.parent, "has no state.json"),
    ]:
        with pytest.raises(CheckpointError) as err:
            nshot.load(path)
        assert str(path) in str(err.value) and fragment in str(err.value), str(err.value)
    # a run whose newest checkpoint is incomplete: the earlier one, when asked for
    shutil.copytree(untrained_tail_checkpoint, tmp_path / "run" / "checkpoint_00000001")
    with pytest.warns(UserWarning, match="earlier"):
        assert nshot.load(half.parent, allow_earlier=True) is not None
    with pytest.raises(CheckpointError, match="belongs to method 'tail', not 'caos'"):
        nshot.load(untrained_tail_checkpoint, method="caos")


def test_load_reads_only_the_checkpoint_and_never_unpickles(
    tmp_path, untrained_tail_checkpoint, monkeypatch
):
    """A run folder with pickles beside and inside its checkpoint: nshot.load opens only files
    of the checkpoint (state.json, model.safetensors) and calls no unpickler; a checkpoint file
    that is a symbolic link to a file outside is refused."""
    import builtins

    import torch

    import nshot.train.checkpoint as ckpt_mod

    ckpt = tmp_path / "run" / "checkpoint_00000001"
    shutil.copytree(untrained_tail_checkpoint, ckpt)
    torch.save({"evil": 1}, ckpt / "model.pt")
    (tmp_path / "run" / "weights.pkl").write_bytes(pickle.dumps({"evil": 2}))

    def unpickler(*_a, **_kw):
        raise AssertionError("nshot.load called an unpickler")

    for target in ("pickle.load", "pickle.loads", "pickle.Unpickler", "torch.load"):
        monkeypatch.setattr(target, unpickler)
    opened: list[Path] = []

    def spy(real):
        def call(path, *a, **kw):
            if isinstance(path, str | os.PathLike):
                opened.append(Path(path).resolve())
            return real(path, *a, **kw)

        return call

    monkeypatch.setattr(builtins, "open", spy(builtins.open))
    monkeypatch.setattr(os, "open", spy(os.open))
    monkeypatch.setattr(ckpt_mod, "load_file", spy(ckpt_mod.load_file))
    pred = nshot.load(tmp_path / "run")
    monkeypatch.undo()
    root = ckpt.resolve()
    assert opened and all(p.parent == root for p in opened), opened
    assert {p.name for p in opened} == {"state.json", "model.safetensors"}
    assert json_close(_answer(pred), _answer(_long_way(untrained_tail_checkpoint)))

    outside = tmp_path / "outside.safetensors"
    shutil.move(ckpt / "model.safetensors", outside)
    (ckpt / "model.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match="symbolic link"):
        nshot.load(tmp_path / "run")


def test_load_of_a_checkpoint_folder_answers_as_the_long_way(untrained_tail_checkpoint):
    pred = nshot.load(untrained_tail_checkpoint)
    assert type(pred).__name__ == "TailPredictor"
    assert json_close(_answer(pred), _answer(_long_way(untrained_tail_checkpoint)))
    ckpt = nshot.load_checkpoint(untrained_tail_checkpoint, method="tail")
    assert ckpt.method == "tail" and ckpt.step == 1


# --------------------------------------------------------------------------- on the shared Ray


@pytest.mark.ray
def test_trained_run_loads_answers_evaluates_as_the_long_way(ray_session, tmp_path):
    run = nshot.train("tail", "smoke", storage=tmp_path, name="r", workers=0)
    assert isinstance(run, nshot.TrainedRun) and run.method == "tail" and run.preset == "smoke"
    assert run.run_dir == tmp_path / "r" and run.metrics["step"] == 50.0
    assert Path(run.checkpoint).name == "checkpoint_00000050"
    assert run.config["preset"] == "smoke" and json.loads(json.dumps(run.to_json()))
    # the run folder, its checkpoint and the TrainedRun give the same predictor's answers
    expected = _answer(_long_way(run.checkpoint))
    for given in (run.run_dir, str(run.run_dir), run.checkpoint, run):
        assert json_close(_answer(nshot.load(given)), expected), given
    assert json_close(_answer(run.load()), expected)

    metrics = nshot.evaluate(run.run_dir, overrides={"eval_episodes": 5}, method="tail")
    assert metrics and all(isinstance(v, float) for v in metrics.values())
    assert 0.0 <= metrics["acc_seen_5w5s"] <= 1.0
    assert run.evaluate(["eval_episodes=5"]) == pytest.approx(metrics)  # the same seed
    with pytest.raises(ConfigError, match="field 'depth' shapes the model"):
        nshot.evaluate(run, overrides={"depth": 2})
    with pytest.raises(ConfigError, match="did you mean 'eval_episodes'"):
        nshot.evaluate(run, overrides={"eval_episode": 5})
    with pytest.raises(CheckpointError, match="belongs to method 'tail', not 'caos'"):
        nshot.evaluate(run.run_dir, method="caos")
    with pytest.raises(NshotError, match="already exists: pass --resume"):
        nshot.train("tail", "smoke", storage=tmp_path, name="r")


@pytest.mark.ray
def test_the_documented_examples_run(ray_session, tmp_path, monkeypatch):
    """Every ```python block of docs/python-api.md, in order, in one namespace, with the
    runs, the sweep and the results under tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NSHOT_STORAGE", str(tmp_path / "runs"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    in_process = os.environ.get("NSHOT_IN_PROCESS")
    examples = _doc_examples()
    heads = [h for h, _ in examples]
    assert heads == [
        "List the methods",
        "Train",
        "Load a predictor",
        "Evaluate",
        "Tune",
        "Reproduce the paper's comparison",
        "Errors",
    ]
    ns: dict = {}
    printed: dict[str, str] = {}
    for head, code in examples:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, f"{DOC.name} [{head}]", "exec"), ns)
            except Exception as err:
                raise AssertionError(f"the example of {head!r} failed: {err!r}") from err
        printed[head] = out.getvalue()
    assert re.search(r"^\d+ methods; tail: TAIL", printed["List the methods"], flags=re.M)
    assert ns["run"].run_dir == tmp_path / "runs" / "tail-api"
    assert printed["Train"].splitlines()[-1] == "50.0"
    assert len(ns["answer"].labels) == len(ns["body"]["query_x"])
    assert set(ns["metrics"]) >= {"acc_seen_5w5s", "acc_20way"}
    sweep = ns["sweep"]
    assert len(sweep.trials) == 2 and sweep.best is not None and sweep.best.f is not None
    assert sweep.best in sweep.trials and sweep.best_config == sweep.best.config
    best = max(t.f for t in sweep.trials) if sweep.mode == "max" else min(t.f for t in sweep.trials)
    assert sweep.best_f == best and sweep.metric == "episode_acc"
    assert (tmp_path / "runs" / "tune" / "tail-api-sweep").is_dir()
    for f in ("results.json", "results.md", "results.png"):
        assert (tmp_path / "results" / "caos-smoke" / f).stat().st_size > 0
    assert list(ns["results"]["rows"])[0] == "caos"
    assert os.environ.get("NSHOT_IN_PROCESS") == in_process  # in_process=True set it for the call
    assert "unknown method 'tial' (did you mean 'tail'?)" in printed["Errors"]
