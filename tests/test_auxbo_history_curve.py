"""aux-BO's history curve on nshot's own sweeps (``experiment=history_curve``) and the searcher's
GP-only option it compares against."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nshot.errors import ConfigError, NshotError
from nshot.method import get
from nshot.tune import Float, SearchSpace


def _curve_cfg(**kw):
    return get("auxbo").config(
        "smoke",
        experiment="history_curve",
        history_method="tail",
        **kw,
    )


def test_best_so_far_skips_failed_trials_in_both_directions():
    from nshot.methods.auxbo.history_curve import best_so_far

    got = best_so_far([None, 0.3, 0.1, None, 0.5, 0.4], "max")
    assert np.isnan(got[0]) and got[1:].tolist() == [0.3, 0.3, 0.3, 0.5, 0.5]
    assert best_so_far([2.0, 3.0, 1.0, None], "min").tolist() == [2.0, 2.0, 1.0, 1.0]


def test_summarise_normalises_per_task_over_every_system():
    from nshot.methods.auxbo.history_curve import summarise

    sweeps = {  # two tasks on different scales; b finds task 0's best at its 2nd trial
        "a": [{"f": [0.1, 0.2, 0.3]}, {"f": [10.0, 20.0, 40.0]}],
        "b": [{"f": [0.2, 0.5, None]}, {"f": [30.0, 10.0, 20.0]}],
    }
    out = summarise(sweeps, (1, 3), "max")
    assert out["best"]["a"][3].tolist() == [0.3, 40.0]
    np.testing.assert_allclose(out["norm"]["a"][1], [0.0, 0.0])  # each task's worst value
    np.testing.assert_allclose(out["norm"]["b"][3], [1.0, (30 - 10) / (40 - 10)])
    np.testing.assert_allclose(out["norm"]["a"][3], [0.5, 1.0])
    assert len(out["curves"]["b"]) == 3
    # minimising: lower is better, the normalised score still rises to 1
    low = summarise({"a": [{"f": [3.0, 1.0]}], "b": [{"f": [2.0, 2.0]}]}, (1, 2), "min")
    np.testing.assert_allclose(low["norm"]["a"][2], [1.0])
    np.testing.assert_allclose(low["norm"]["b"][2], [0.5])
    assert low["best"]["a"][2].tolist() == [1.0]


def test_tasks_are_seeded_by_index_and_the_config_checks_the_experiment():
    from nshot.methods.auxbo.history_curve import checkpoints, curve_systems, task_spec

    cfg = _curve_cfg(curve_vary={"max_ways": [2, 3, 4, 5], "train_tasks": ["A", "A+mixed"]})
    specs = [task_spec(cfg, i) for i in range(12)]
    assert [s["seed"] for s in specs] == list(range(12))
    assert specs == [task_spec(cfg.replace(curve_tasks=9), i) for i in range(12)]
    assert len({(s["max_ways"], s["train_tasks"]) for s in specs}) > 3  # the draws vary
    assert curve_systems(cfg) == ("random", "optuna_tpe", "gp", "auxbo_h5", "auxbo_h20")
    assert curve_systems(cfg.replace(curve_baselines=["gp", "random"])) == (
        "random", "gp", "auxbo_h5", "auxbo_h20",
    )  # fmt: skip
    assert checkpoints(cfg) == (5, 10, 20) and checkpoints(cfg.replace(curve_trials=7)) == (5, 7)
    with pytest.raises(ValueError, match="history_method"):
        get("auxbo").config("smoke", experiment="history_curve")
    with pytest.raises(ValueError, match="curve_history"):
        _curve_cfg(curve_history=[5, 5])
    with pytest.raises(ValueError, match="curve_vary"):
        _curve_cfg(curve_vary={"max_ways": []})
    with pytest.raises(ValueError, match="curve_m_targets"):
        _curve_cfg(curve_history_trials=5, curve_m_targets=5)


def test_surrogate_false_is_the_gp_even_where_a_surrogate_exists(tmp_path, monkeypatch):
    """``surrogate=False`` (``--search-option surrogate=false``): the GP, even with a
    surrogate meta-trained for the space in the cache — aux-BO with no history."""
    from nshot.methods.auxbo.model import TNP, TNPConfig, save_tnp
    from nshot.methods.auxbo.searcher import (
        AuxBOSearcher,
        default_surrogate_dir,
        searcher_factory,
    )
    from nshot.tune.searchers import SearchContext

    monkeypatch.setenv("NSHOT_CACHE", str(tmp_path))
    space = SearchSpace({"a": Float(0, 1), "b": Float(0, 1)})
    tnp = TNP(TNPConfig(x_dim=2, h_len=3, h_dim=1, d=8, heads=2, layers_h=1, layers=1))
    stats = {"f_mean": 0.0, "f_std": 1.0, "h_mean": [0.0], "h_std": [1.0]}
    save_tnp(tnp, stats, default_surrogate_dir(space), extra={"space_hash": space.schema_hash()})
    assert AuxBOSearcher(space).summary()["backend"].startswith("tnp:")
    assert AuxBOSearcher(space, surrogate=False).summary()["backend"] == "gp"
    with pytest.raises(ConfigError, match="takes no checkpoint"):
        AuxBOSearcher(space, surrogate=False, checkpoint=tmp_path)
    for value in (False, "false", "0"):
        ctx = SearchContext(space=space, options={"surrogate": value, "warm": "false"})
        assert searcher_factory(ctx).summary()["backend"] == "gp"
    with pytest.raises(ConfigError, match="surrogate must be true or false"):
        searcher_factory(SearchContext(space=space, options={"surrogate": "maybe"}))


@pytest.mark.ray
def test_history_curve_end_to_end_and_a_rerun_reads_its_records(ray_session, tmp_path, monkeypatch):
    """A tiny history curve through `nshot tune` on TAIL: history sweeps land in the run's own
    history, the surrogate is meta-trained on them, every system sweeps every held-out task,
    and the results carry the rows, paired samples and the experiment's name; a second call on
    the same folder reads the finished sweeps back instead of running them again."""
    from nshot.methods.auxbo.history_curve import run_history_curve

    monkeypatch.setenv("NSHOT_CACHE", str(tmp_path / "cache"))
    cfg = _curve_cfg(
        curve_set={"steps": 6, "log_every": 3, "checkpoint_every": 6, "torch_threads": 1},
        curve_vary={"max_ways": [2, 3]},
        curve_history=[1],
        curve_history_trials=4,
        curve_m_targets=2,
        curve_tasks=2,
        curve_trials=5,
        curve_concurrency=3,
        curve_surrogate_steps=4,
        curve_baselines=["gp"],  # random and TPE are Tune's own; their rows cost two sweeps a task
    )
    res = run_history_curve(cfg, tmp_path / "run")
    data = res.to_json()
    assert data["experiment"] == "history_curve"
    assert list(data["rows"]) == ["gp", "auxbo_h1"]
    assert set(data["metrics"]) == {"norm_at_5", "best_at_5"}
    for s, row in data["rows"].items():
        assert 0.0 <= row["norm_at_5"] <= 1.0, s
        assert len(data["samples"][s]["norm_at_5"]) == 2
    extra = data["extra"]
    assert extra["trial_errors"] == 0 and len(extra["history_tasks"]) == 1
    assert all(len(f) == 5 for fs in extra["trials"].values() for f in fs)
    for p in (tmp_path / "run" / "records").glob("*.json"):  # in the order of the proposals
        assert json.loads(p.read_text())["index"] == sorted(json.loads(p.read_text())["index"])
    records = sorted((tmp_path / "run" / "records").glob("*.json"))
    assert len(records) == 1 + 2 * 2
    backends = {json.loads(p.read_text())["name"]: json.loads(p.read_text())["searcher"]
                for p in records}  # fmt: skip
    assert backends["gp-task001"]["backend"] == "gp"
    assert backends["auxbo_h1-task001"]["backend"].startswith("tnp:")
    assert backends["auxbo_h1-task001"]["warm_starts"] == 1
    # its first trial is the warm start: the best config of the one earlier sweep
    hist = json.loads((tmp_path / "run" / "records" / "history-000.json").read_text())
    best = hist["configs"][int(np.nanargmax([np.nan if f is None else f for f in hist["f"]]))]
    first = json.loads((tmp_path / "run" / "records" / "auxbo_h1-task001.json").read_text())
    assert first["configs"][0] == pytest.approx(best)
    assert not (tmp_path / "cache" / "history").exists()  # nothing in the user's history
    again = run_history_curve(cfg, tmp_path / "run").to_json()
    assert again["rows"] == data["rows"] and again["extra"]["trials"] == extra["trials"]
    other = cfg.replace(curve_set={**cfg.curve_set, "steps": 9})  # not what the records hold
    with pytest.raises(NshotError, match="a sweep of other settings is recorded"):
        run_history_curve(other, tmp_path / "run")


def test_the_example_builds_the_experiment_from_its_arguments(
    run_example, monkeypatch, tmp_path, capsys
):
    """examples/auxbo_history_curve.py: TAIL's committed settings by default, `--quick` a small
    history, any method and task variation from the command line; it prints every row."""
    import nshot.reproduce

    seen = []

    def fake_run(method, cfg, out):
        seen.append(cfg)
        rows = {s: {f"norm_at_{k}": 0.5 for k in (5, 10)} for s in ("random", "gp")}
        return {"metrics": {"norm_at_5": {}, "norm_at_10": {}}, "rows": rows, "notes": ["n"]}

    monkeypatch.setattr(nshot.reproduce, "run", fake_run)
    run_example("auxbo_history_curve", ["--quick", "--out", str(tmp_path)])
    run_example("auxbo_history_curve",
                ["--method", "timemode", "--vary", '{"data_seed": [0, 1]}', "--out", str(tmp_path)])  # fmt: skip
    quick, other = seen
    assert quick.experiment == "history_curve" and quick.history_method == "tail"
    assert quick.curve_history == [3] and quick.curve_set["steps"] == 150
    assert "train_tasks" in quick.curve_vary
    assert other.history_method == "timemode" and other.curve_vary == {"data_seed": [0, 1]}
    assert other.curve_set == {} and other.curve_history == [5, 20]
    assert "gp" in capsys.readouterr().out
