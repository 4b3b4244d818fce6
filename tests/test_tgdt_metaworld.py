"""tgdt's Meta-World track: the config and the missing extra (always), and, with the metaworld
extra installed, the collection with the scripted policies (goal told to the policy, hidden in
the stored states), the batched simulator against a single environment, and a tiny run trained,
evaluated and served on Ray."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nshot.errors import ConfigError
from nshot.methods.tgdt.config import TGDTConfig


def tiny(**kw) -> TGDTConfig:
    """A few reach tasks, short episodes, the smoke model."""
    base = dict(env="metaworld", n_train_tasks=4, n_test_tasks=2, episodes_per_quality=2,
                horizon=60, rtg_scale=100.0, tasks_per_step=2, share_k=1)  # fmt: skip
    return TGDTConfig.from_preset("smoke", **{**base, **kw})


def test_config_and_the_missing_extra(monkeypatch):
    mw = TGDTConfig.from_preset("small-metaworld")
    assert (mw.env, mw.mw_env, mw.n_tasks, mw.horizon) == ("metaworld", "reach-v3", 50, 60)
    assert (mw.state_dim, mw.act_dim, mw.goal_dim, mw.max_action) == (39, 4, 3, 1.0)
    small = TGDTConfig.from_preset("small")
    assert (small.state_dim, small.act_dim, small.goal_dim, small.max_action) == (2, 2, 2, 0.1)
    with pytest.raises(ConfigError, match="n_train_tasks.*50 tasks"):
        TGDTConfig.from_preset("small-metaworld", n_train_tasks=51)
    with pytest.raises(ConfigError, match="mw_env"):
        TGDTConfig.from_preset("small-metaworld", mw_env="reach")
    from nshot.methods.tgdt.data import describe
    from nshot.methods.tgdt.metaworld import require

    text = describe(np.array([0.01, 0.855, -0.2]), "medium", 199.06, 60, "metaworld", "reach-v3")
    assert text == ("Reach with the robot arm's gripper to the goal at x=+0.01, y=+0.85, "
                    "z=-0.20. The data is medium with return 199.1 over 60 steps.")  # fmt: skip
    # ML10: as many tasks of each class; held out: its test classes
    ml10 = TGDTConfig.from_preset("small-metaworld", mw_benchmark="ML10", n_train_tasks=20)
    assert ml10.n_tasks == 30
    with pytest.raises(ConfigError, match="n_train_tasks.*multiple of 10"):
        TGDTConfig.from_preset("small-metaworld", mw_benchmark="ML10", n_train_tasks=45)
    with pytest.raises(ConfigError, match="n_test_tasks.*multiple of 5"):
        TGDTConfig.from_preset("small-metaworld", mw_benchmark="ML10", n_test_tasks=12)
    from types import SimpleNamespace

    from nshot.methods.tgdt.metaworld import _per_class

    tasks = [SimpleNamespace(env_name=n, i=i) for i, n in enumerate("ababcabc")]
    picked = _per_class(tasks, ["a", "b", "c"], 6)  # two of each class, class by class
    assert [(t.env_name, t.i) for t in picked] == [("a", 0), ("a", 2), ("b", 1), ("b", 3),
                                                    ("c", 4), ("c", 7)]  # fmt: skip
    monkeypatch.setitem(sys.modules, "metaworld", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"nshot\[metaworld\]"):
        require()


def test_collection_follows_the_protocol():
    pytest.importorskip("metaworld")
    from nshot.methods.tgdt.data import load_data

    cfg = tiny()
    d = load_data(cfg)
    assert load_data(cfg).states.tobytes() == d.states.tobytes()  # cached, same table
    assert d.states.shape == (6, 3, 2, 60, 39) and d.actions.shape == (6, 3, 2, 60, 4)
    np.testing.assert_array_equal(d.states[..., 36:], 0.0)  # the goal never reaches the data
    assert np.abs(d.actions).max() <= 1.0
    # reach's goal box, and the held-out goals are ML1's test tasks (none a training goal)
    assert (d.goals.min(0) >= [-0.1, 0.8, 0.05]).all() and (d.goals.max(0) <= [0.1, 0.9, 0.3]).all()
    assert min(np.linalg.norm(d.goals[4:, None] - d.goals[None, :4], axis=-1).ravel()) > 1e-3
    r = d.returns.mean(-1)  # expert > medium > random on every task
    assert (r[:, 0] > r[:, 1]).all() and (r[:, 1] > r[:, 2]).all()
    assert d.success[:, 0].mean() >= 0.75 and d.success[:, 2].mean() == 0.0
    assert "z=" in d.test_description(4) and "expert" in d.test_description(4)


def test_simulator_equals_a_single_environment():
    pytest.importorskip("metaworld")
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.metaworld import benchmark

    cfg = tiny()
    d = load_data(cfg)
    # the expert's first stored episode, replayed through the batched simulator
    sim = d.simulator(cfg, np.array([0, 1]))
    s = sim.reset()
    np.testing.assert_allclose(s[:, :36], d.states[[0, 1], 0, 0, 0, :36], atol=1e-6)
    for t in range(10):
        s, r = sim.step(d.actions[[0, 1], 0, 0, t].astype(np.float64))
        np.testing.assert_allclose(r, d.rewards[[0, 1], 0, 0, t], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(s, d.states[[0, 1], 0, 0, 10], atol=1e-5)
    assert benchmark(cfg) is benchmark(cfg)  # built once per process


def test_tiny_run_trains_evaluates_and_serves(ray_session, tmp_path):
    pytest.importorskip("metaworld")
    from nshot.method import get
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.evaluation import rollout
    from nshot.methods.tgdt.experiments import reference_scores
    from nshot.train import Scaling, fit, load_checkpoint

    cfg = tiny(steps=4, checkpoint_every=4)
    ref = reference_scores(cfg, load_data(cfg))
    assert ref["expert_controller_norm_score"] > 0.8 and ref["stand_still_norm_score"] < 0.2
    res = fit("tgdt", cfg, scaling=Scaling(workers=0), storage=tmp_path, name="mw")
    ckpt = load_checkpoint(res.checkpoint, method="tgdt")
    metrics = get("tgdt").evaluate(ckpt, cfg)
    assert {"norm_score", "success", "retrieval_top1", "leak_delta"} <= set(metrics)
    assert 0.0 <= metrics["success"] <= 1.0
    pred = get("tgdt").predictor(ckpt)
    assert pred.metadata()["state_dim"] == 39 and pred.metadata()["env"] == "metaworld"
    good = pred.example_request()
    answer = pred(pred.Request.model_validate(good))
    assert len(answer.action) == 4 and all(abs(v) <= 1.0 for v in answer.action)
    # rollouts on the checkpoint's held-out tasks, whose goals the metadata lists
    data = load_data(cfg)
    tasks = pred.metadata()["held_out_tasks"]
    assert [t["task"] for t in tasks] == list(range(cfg.n_test_tasks))
    np.testing.assert_allclose([t["goal"] for t in tasks], data.goals[cfg.n_train_tasks :],
                               atol=1e-4)  # fmt: skip
    ask = {"mode": "rollout", "description": data.test_description(cfg.n_train_tasks + 1),
           "task": 1, "episodes": 2}  # fmt: skip
    run = pred(pred.Request.model_validate(ask))
    assert len(run.returns) == len(run.success) == 2
    assert np.shape(run.trajectory) == (cfg.horizon + 1, 39)
    assert pred(pred.Request.model_validate(ask)) == run  # greedy: the same episodes again
    sim = data.simulator(cfg, np.array([cfg.n_train_tasks + 1]), 2)  # the evaluation's own
    want = rollout(pred.model, cfg, sim, texts=[ask["description"]], episodes=2)
    np.testing.assert_allclose(run.returns, want.returns[0], atol=1e-5)
    bad = {
        "states[0]": {**good, "states": [[0.0, 0.0], [0.0, 0.0]], "actions": [[0.0] * 4]},
        "actions[0]": {**good, "actions": [[0.0, 0.0]]},
        "task": {"mode": "rollout", "description": good["description"], "goal": [0.0, 0.5]},
        "task: 9": {**ask, "task": 9},
        "goal": {**ask, "goal": [0.0, 0.5, 0.1]},
    }
    for field, body in bad.items():
        with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
            pred(pred.Request.model_validate(body))


def test_example_drives_the_environment_through_the_predictor(
    ray_session, tmp_path, run_example, capsys
):
    pytest.importorskip("metaworld")
    sizes = {"n_train_tasks": 4, "n_test_tasks": 2, "episodes_per_quality": 2, "steps": 4,
             "checkpoint_every": 4, "log_every": 2, "tasks_per_step": 2, "d_model": 16,
             "heads": 2, "layers": 1, "text_layers": 1, "share_k": 1, "share_steps": 2}  # fmt: skip
    argv = ["--quick", "--output", str(tmp_path)]
    for k, v in sizes.items():
        argv += ["--set", f"{k}={v}"]
    run_example("tgdt_metaworld", argv)
    out = capsys.readouterr().out
    assert "zero-shot on the held-out goals" in out and "'success'" in out
    assert "reached the goal:" in out and "final distance" in out
    assert "rollout request on held-out task 0" in out and "success [" in out


def test_goal_gap_example_measures_oracle_against_agnostic(tmp_path, run_example):
    """examples/tgdt_goal_gap.py (the Meta-World task choice): the scripted policy told the
    true goal succeeds on reach; the report holds the declared rule and each class's gap."""
    pytest.importorskip("metaworld")
    import json

    out = tmp_path / "gap.json"
    run_example("tgdt_goal_gap", ["--classes", "reach-v3", "--train", "5", "--tasks", "2",
                                  "--horizon", "80", "--out", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    reach = report["classes"]["reach-v3"]
    assert reach["oracle_success"] == 1.0 and 0.0 <= reach["agnostic_success"] <= 1.0
    assert reach["oracle_return"] > reach["random_return"]
    assert report["rule"]["success_ratio_max"] == 0.5
    assert report["qualifying"] == [c for c, v in report["classes"].items() if v["qualifies"]]
