"""nshot.tune: search spaces, the history, f/h reporting, sweeps on the local Ray."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nshot.method import get
from nshot.tune import Choice, Float, Int, SearchSpace, SearchSpaceError
from nshot.tune.history import HistoryError, Trial, load_tasks, save_task
from nshot.tune.report import CurveTracker


def space() -> SearchSpace:
    return SearchSpace(
        {
            "lr": Float(1e-4, 1e-1, log=True),
            "momentum": Float(0.5, 0.99),
            "width": Int(8, 128, log=True),
            "layers": Int(1, 4),
            "act": Choice(["relu", "gelu", "tanh"]),
        }
    )


def test_encode_decode_round_trip_and_scales():
    s = space()
    assert s.dim == 4 + 3
    cfg = {"lr": 1e-2, "momentum": 0.7, "width": 32, "layers": 3, "act": "gelu"}
    x = s.encode(cfg)
    assert x.shape == (7,) and np.all((x >= 0) & (x <= 1))
    assert x[0] == pytest.approx(2 / 3)  # log scale: 1e-2 is two thirds of the way 1e-4 → 1e-1
    assert x[4:].tolist() == [0.0, 1.0, 0.0]
    back = s.decode(x)
    assert back["lr"] == pytest.approx(1e-2) and back["width"] == 32 and back["act"] == "gelu"
    assert isinstance(back["layers"], int) and back["layers"] == 3
    # every uniform point decodes into the box, integers stay integers
    for cfg in s.sample(np.random.default_rng(0), 50):
        assert 1e-4 <= cfg["lr"] <= 1e-1 and 8 <= cfg["width"] <= 128
        assert isinstance(cfg["width"], int) and cfg["act"] in ("relu", "gelu", "tanh")


def test_tune_domains_round_trip():
    s = space()
    back = SearchSpace.from_tune({**s.to_tune(), "fixed_key": 3})
    assert back == s and back.fixed == {"fixed_key": 3}
    assert back.schema_hash() == s.schema_hash()
    assert SearchSpace.from_json(json.dumps(s.to_json())) == s


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"lr": Float(1e-2, 1e-3)}, "'lr': low"),
        ({"lr": Float(0.0, 1.0, log=True)}, "'lr': a log scale needs low > 0"),
        ({"n": Int(1.5, 4)}, "'n': integer bounds"),
        ({"a": Choice(["x"])}, "'a': a choice needs"),
        ({"a": Float(0, math.inf)}, "'a': bounds must be finite"),
    ],
)
def test_bad_spaces_name_the_parameter(params, fragment):
    with pytest.raises(SearchSpaceError, match=fragment):
        SearchSpace(params)


def test_bad_space_json_and_tune_domains():
    from ray import tune

    with pytest.raises(SearchSpaceError, match="'lr': unknown type 'gaussian'"):
        SearchSpace.from_json({"lr": {"type": "gaussian", "low": 0, "high": 1}})
    with pytest.raises(SearchSpaceError, match="'lr': missing key 'high'"):
        SearchSpace.from_json({"lr": {"type": "float", "low": 0}})
    with pytest.raises(SearchSpaceError, match="not valid JSON"):
        SearchSpace.from_json("{lr:")
    with pytest.raises(SearchSpaceError, match="'b': quantized"):
        SearchSpace.from_tune({"b": tune.quniform(0, 1, 0.1)})
    with pytest.raises(SearchSpaceError, match="'opt': nested"):
        SearchSpace.from_tune({"opt": {"lr": tune.uniform(0, 1)}})


def test_space_is_validated_against_the_config():
    tail = get("tail")
    cfg = tail.config("smoke")
    cls = type(cfg)
    with pytest.raises(SearchSpaceError, match="'no_such_field' is not a field of TailConfig"):
        SearchSpace({"no_such_field": Float(0, 1)}).validate_for(cls, cfg.model_dump())
    with pytest.raises(SearchSpaceError, match="'lr': value 5.0 is not a valid config"):
        SearchSpace({"lr": Float(1e-4, 5.0)}).validate_for(cls, cfg.model_dump())
    cls.TUNE.search_space().validate_for(cls, cfg.model_dump())  # the declared one is valid


def test_curve_tracker_builds_f_and_h():
    t = CurveTracker("val_acc", "max", ("val_acc", "loss"))
    assert t.update({"loss": 1.0}) == {}  # no objective yet
    out = t.update({"val_acc": 0.5, "loss": 0.9})
    assert out == {"f": 0.5, "h": [[0.5, 0.9]]}
    out = t.update({"val_acc": 0.7})  # a missing curve metric carries its last value
    assert out["f"] == 0.7 and out["h"] == [[0.5, 0.9], [0.7, 0.9]]


def test_history_round_trip_and_corruption(tmp_path):
    s = space()
    trials = [
        Trial("t0", {"lr": 1e-3, "momentum": 0.9, "width": 16, "layers": 1, "act": "relu"}, 0.8,
              np.arange(6.0).reshape(3, 2)),
        Trial("t1", {"lr": 1e-2, "momentum": 0.6, "width": 64, "layers": 2, "act": "tanh"}, 0.6,
              np.arange(4.0).reshape(2, 2)),
        Trial("t2", {"lr": 1e-2, "momentum": 0.6, "width": 64, "layers": 2, "act": "tanh"}, float("nan"),
              np.zeros((1, 2))),
    ]  # fmt: skip
    path = save_task(trials, method="m", preset="smoke", space=s, metric="acc", mode="max",
                     directory=tmp_path)  # fmt: skip
    [task] = load_tasks(tmp_path)
    assert task.path == path and task.method == "m" and len(task.configs) == 2  # NaN f skipped
    assert task.space_hash == s.schema_hash()
    np.testing.assert_allclose(task.X[0], s.encode(trials[0].config))
    h, mask = task.h_padded()
    assert h.shape == (2, 3, 2) and mask.tolist() == [[True] * 3, [True, True, False]]
    assert load_tasks(tmp_path, method="other") == []
    path.write_bytes(b"not parquet")
    with pytest.raises(HistoryError, match="not a readable Parquet"):
        load_tasks(tmp_path)


@pytest.mark.ray
def test_sweep_reports_f_and_h_into_the_history(ray_session, tmp_path, capfd):
    from nshot.tune.run import tune

    tail = get("tail")
    cfg = tail.config("smoke", steps=20, log_every=5, checkpoint_every=20)
    res = tune("tail", cfg, search="random", num_samples=2, max_concurrent=2,
               storage=tmp_path / "runs", history_dir=tmp_path / "hist", verbose=0)  # fmt: skip
    assert len(res.trials) == 2 and all(t.error is None for t in res.trials)
    [task] = load_tasks(tmp_path / "hist", method="tail")
    assert len(task.configs) == 2 and task.metric == "episode_acc"
    for t, h in zip(res.trials, task.h_list):
        assert h.shape == (4, 2)  # 4 reports (every 5 of 20 steps) × (episode_acc, loss)
        assert t.f == pytest.approx(float(h[-1, 0]))  # f is the last value of the curve
        assert np.all(h[:, 1] > 0)  # the loss column
    # the terminal shows nshot's line per finished trial, not Tune's tables or the trials' steps
    err = capfd.readouterr().err
    assert "[nshot tune] trial 1/2" in err and "[nshot tune] trial 2/2" in err, err[-2000:]
    assert "Trial status" not in err and "[nshot tail] step" not in err, err[-2000:]
    # the same sweep name again is refused instead of mixing two sweeps
    from nshot.method import NshotError

    with pytest.raises(NshotError, match="already exists"):
        tune("tail", cfg, search="random", num_samples=1, storage=tmp_path / "runs",
             history_dir=tmp_path / "hist", verbose=0)  # fmt: skip


@pytest.mark.ray
def test_trials_reusing_a_process_give_the_results_of_fresh_processes(ray_session, tmp_path):
    """In-process trials reuse a finished trial's process by default (no start-up and imports
    per trial); every trial seeds itself from its config, so the objective is the same as with
    a new process per trial (`--no-reuse-actors`)."""
    from nshot.tune.run import tune

    cfg = get("tail").config("smoke", steps=10, log_every=5, checkpoint_every=10)
    runs = {}
    for reuse in (None, False):  # one trial at a time: trial 2 reuses trial 1's process
        res = tune("tail", cfg, search="random", num_samples=2, max_concurrent=1,
                   storage=tmp_path / "runs", name=f"reuse-{reuse}", save_history=False,
                   reuse_actors=reuse, progress=False)  # fmt: skip
        runs[reuse] = sorted((json.dumps(t.config, sort_keys=True), t.f) for t in res.trials)
    assert runs[None] == runs[False] and all(f is not None for _, f in runs[None])


def test_trials_are_listed_in_the_order_they_were_proposed():
    """A searcher's trials have random ids; the proposal index is the head of Tune's tag."""
    from nshot.tune.run import _trial_index

    assert _trial_index("15_depth=1,lr=0.0002") == 15 and _trial_index("0") == 0
    assert _trial_index(None) is None and _trial_index("lr=0.1") is None


def test_unknown_searcher_is_rejected():
    from nshot.tune.searchers import SearchContext, UnknownSearcherError, build_searcher

    with pytest.raises(UnknownSearcherError, match="unknown searcher 'nope'.*auxbo"):
        build_searcher("nope", SearchContext(space=space()))


def test_cli_rejects_a_bad_space_before_starting_anything(capsys):
    from nshot.cli import main

    bad = '{"lr": {"type": "float", "low": 0, "high": 0.1, "log": true}}'
    assert main(["tune", "tail", "--preset", "smoke", "--space", bad]) == 2
    assert "parameter 'lr': a log scale needs low > 0" in capsys.readouterr().err
    worse = '{"depth": {"type": "int", "low": 1, "high": 99}}'
    assert main(["tune", "tail", "--preset", "smoke", "--space", worse]) == 2
    assert "parameter 'depth': value 99 is not a valid config" in capsys.readouterr().err
    assert main(["tune", "tail", "--preset", "smoke", "--search", "nope"]) == 2
    assert "unknown searcher 'nope'" in capsys.readouterr().err


def test_sweep_progress_line_tracks_best_and_eta_and_pickles():
    import pickle
    import sys

    from nshot.tune.progress import SweepProgress

    p = SweepProgress(4, "min", stream=sys.stderr)
    p._start = 100.0
    p._finished = 1
    first = p.line("a", 0.5, failed=False, now=110.0)
    assert first.startswith("[nshot tune] trial 1/4 a done  f=0.5  best f=0.5 (trial a)")
    assert first.endswith("| 10s, ETA 30s")
    p._finished = 2
    assert "best f=0.5 (trial a)" in p.line("b", 0.9, failed=False, now=120.0)
    p._finished = 3
    assert "best f=0.2 (trial c)" in p.line("c", 0.2, failed=False, now=130.0)
    p._finished = 4
    last = p.line("d", None, failed=True, now=140.0)
    assert "trial 4/4 d failed" in last and "ETA" not in last
    clone = pickle.loads(pickle.dumps(p))  # Tune stores the callbacks with the sweep
    assert clone.stream is None and clone._best == (0.2, "c")
