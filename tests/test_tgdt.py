"""tgdt units: the PointRobot generator and its descriptions, the tokenizer, the config, the
model's checks (padding, causality, TBM negatives), the windows of a rollout and the metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nshot.errors import ConfigError
from nshot.methods.tgdt.config import TGDTConfig


def test_generator_is_deterministic_and_follows_the_protocol():
    from nshot.methods.tgdt.data import QUALITIES, generate, load_data, make_goals

    cfg = TGDTConfig.from_preset("smoke")
    a, b = generate(cfg), generate(cfg)
    assert a.equals(b)  # same seed, same table
    assert a.num_rows == cfg.n_tasks * len(QUALITIES) * cfg.episodes_per_quality
    assert not generate(cfg.replace(data_seed=1)).equals(a)
    d = load_data(cfg)  # through the verified Parquet cache
    np.testing.assert_allclose(d.goals, make_goals(cfg))
    assert np.abs(d.goals).max() <= 1.0 and len(np.unique(d.goals.round(6), axis=0)) == cfg.n_tasks
    assert list(d.test_tasks) == list(range(cfg.n_train_tasks, cfg.n_tasks))
    assert d.states.shape == (cfg.n_tasks, 3, cfg.episodes_per_quality, cfg.horizon, 2)
    np.testing.assert_array_equal(d.states[:, :, :, 0], 0.0)  # every episode starts at the origin
    assert np.abs(d.actions).max() <= 0.1 + 1e-6  # clipped to the bounds
    # s_{t+1} = s_t + a_t and r_t = −‖s_{t+1} − goal‖
    nxt = d.states[..., :-1, :] + d.actions[..., :-1, :]
    np.testing.assert_allclose(d.states[..., 1:, :], nxt, atol=1e-5)
    dist = np.linalg.norm(nxt - d.goals[:, None, None, None, :], axis=-1)
    np.testing.assert_allclose(d.rewards[..., :-1], -dist, atol=1e-5)
    r = d.returns.mean(-1)  # (tasks, tiers): expert > medium > random on every task
    assert (r[:, 0] > r[:, 1]).all() and (r[:, 1] > r[:, 2]).all()


def test_descriptions_and_tokenizer():
    from nshot.methods.tgdt.data import MAX_DESC_LEN, describe, load_data, tokenize

    cfg = TGDTConfig.from_preset("smoke")
    d = load_data(cfg)
    text = describe(np.array([0.3, -0.7]), "medium", -4.25, 20)
    assert text == ("Navigate the point robot to the goal at x=+0.30, y=-0.70. The data is medium "
                    "with return -4.2 over 20 steps.")  # fmt: skip
    test = d.test_description(int(d.test_tasks[0]))
    assert "expert" in test and f"{d.test_return():.1f}" in test
    assert f"{d.test_return() * 1.5:.1f}" in d.test_description(int(d.test_tasks[0]), 1.5)
    assert d.test_return() == pytest.approx(d.returns[: cfg.n_train_tasks, 0].mean())
    ids = tokenize(["ab", "x=+0.3", "é"])
    assert ids.shape == (3, 6) and (ids[0, 2:] == 0).all()  # padded with 0
    assert ids[1, 2] != ids[1, 3] and ids[2, 0] == 1  # one id per digit; unknown → 1
    assert tokenize(["a" * 600]).shape == (1, MAX_DESC_LEN)


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="heads"):
        TGDTConfig.from_preset("small", heads=5)
    with pytest.raises(ConfigError, match="context"):
        TGDTConfig.from_preset("smoke", context=50)
    with pytest.raises(ConfigError, match="'bogus'.*unknown field"):
        TGDTConfig.from_preset("smoke", bogus=1)
    with pytest.raises(ConfigError, match="system"):
        TGDTConfig.from_preset("smoke", system="decision_diffuser")
    with pytest.raises(ConfigError, match="leak_factors"):
        TGDTConfig.from_preset("smoke", leak_factors=[1.0])
    with pytest.raises(ConfigError, match="tasks_per_step"):
        TGDTConfig.from_preset("smoke", tasks_per_step=100)
    small = TGDTConfig.from_preset("small")
    assert (small.context, small.d_model, small.layers, small.text_layers) == (10, 64, 2, 2)
    assert small.tbc and small.tbm and small.cross
    assert (
        not small.replace(system="tgdt_no_tbm").tbm
        and not small.replace(system="naive_text_dt").cross
    )
    # `rows`: a reported sub-run trains only the rows named (the MiniLM comparison)
    from nshot.methods.tgdt.experiments import trained_rows

    sub = small.replace(minilm_row=True, rows=["tgdt", "tgdt_minilm", "naive_text_dt"])
    assert list(trained_rows(sub)) == ["tgdt", "tgdt_minilm", "naive_text_dt"]
    assert trained_rows(sub)["tgdt_minilm"] == {"system": "tgdt", "text_encoder": "minilm"}
    assert trained_rows(small.replace(minilm_row=True))["naive_text_dt_minilm"] == {
        "system": "naive_text_dt", "text_encoder": "minilm"
    }  # fmt: skip
    assert (
        len(trained_rows(small.replace(minilm_row=True))) == 10
        and len(trained_rows(small.replace(minilm_row=False))) == 8
    )
    for bad in (["tgdt_minilm"], [], ["tgdt", "dt"]):
        with pytest.raises(ConfigError, match="rows"):
            trained_rows(small.replace(minilm_row=False, rows=bad))
    no_align = small.replace(system="tgdt_no_align")
    assert no_align.cross and no_align.uses_text and not (no_align.tbc or no_align.tbm)
    assert not no_align.balanced and small.balanced


def test_the_small_preset_declared_for_the_headline():
    """small (the next small, declared before its run): 200 / 20 goals, 550 steps (warm-up 55),
    3 seeds for every row, the alignment losses balanced on the text encoder and the decoder
    blocks and re-balanced every 100 steps, the MiniLM rows off (measurable with minilm_row=true); the paper preset
    keeps the paper's unit weights."""
    small = TGDTConfig.from_preset("small")
    assert (small.n_train_tasks, small.n_test_tasks) == (200, 20)
    assert (small.steps, small.warmup) == (550, 55)
    assert small.seeds == 3 and small.rows is None
    assert small.loss_balance == "shared_grad_running" and small.balance_every == 100
    assert small.balance_batches == 5 and not small.minilm_row
    assert [s for s in range(1, small.steps + 1) if small.rebalances_at(s)] == [
        101, 201, 301, 401, 501
    ]  # fmt: skip
    assert TGDTConfig.from_preset("paper").loss_balance == "unit"
    assert TGDTConfig.from_preset("smoke").loss_balance == "unit"


def test_running_balance_config_and_schedule():
    """balance_every is a positive step count; text_grad_running re-measures at the start of
    steps balance_every + 1, 2 balance_every + 1, ... (global steps), only for the systems with
    an alignment loss; text_grad and unit never re-measure during training."""
    for bad in (0, -5):
        with pytest.raises(ConfigError, match="balance_every"):
            TGDTConfig.from_preset("smoke", loss_balance="text_grad_running", balance_every=bad)
    with pytest.raises(ConfigError, match="loss_balance"):
        TGDTConfig.from_preset("smoke", loss_balance="running")
    cfg = TGDTConfig.from_preset(
        "smoke", steps=10, loss_balance="text_grad_running", balance_every=3
    )
    assert cfg.balanced and [s for s in range(1, 11) if cfg.rebalances_at(s)] == [4, 7, 10]
    assert TGDTConfig.from_preset("smoke", loss_balance="text_grad_running").balance_every == 100
    for other in (
        cfg.replace(loss_balance="text_grad"),
        cfg.replace(loss_balance="unit"),
        cfg.replace(system="tgdt_no_align"),
        cfg.replace(system="naive_text_dt"),
    ):
        assert not any(other.rebalances_at(s) for s in range(1, 11))
    assert cfg.replace(system="tgdt_no_tbc").rebalances_at(4)


def test_running_balance_re_measures_on_schedule_and_resumes(monkeypatch):
    """text_grad_running: measured at initialisation and again after every balance_every steps
    (on the model as trained so far and the next steps' draws), each measurement making the
    weighted alignment losses' gradient norms on the text encoder equal L_DT's; the trajectory
    records (steps done, w_tbc, w_tbm); a run resumed between re-measurements (the model,
    optimiser and the checkpoint's extra restored) re-measures at the same global steps and ends
    equal to an uninterrupted run; text_grad measures once, unit never."""
    from types import SimpleNamespace

    from nshot.methods.tgdt import train as tgdt_train
    from nshot.methods.tgdt.data import load_data
    from nshot.train.trainer import train

    torch.set_num_threads(1)
    cfg = TGDTConfig.from_preset(
        "smoke", steps=7, loss_balance="text_grad_running", balance_every=3, balance_batches=1
    )
    data = load_data(cfg)
    measured: list[int] = []
    real = tgdt_train.balance

    def counted(model, c, d, done=0):  # noqa: ANN001, ANN202
        norms = real(model, c, d, done=done)
        measured.append(done)
        if done == 3:  # the re-measurement holds the balance on its own batches
            w_tbc, w_tbm = tgdt_train.loss_weights(model, c)
            enc = tgdt_train.gradient_norms(model, c, d, 1, first_step=4)["text_encoder"]
            assert w_tbc * enc["tbc"] == pytest.approx(enc["dt"], rel=1e-4)
            assert w_tbm * enc["tbm"] == pytest.approx(enc["dt"], rel=1e-4)
        return norms

    monkeypatch.setattr(tgdt_train, "balance", counted)
    whole = train(tgdt_train.TGDTRecipe(cfg, data), session=False)
    assert measured == [0, 3, 6]
    traj = whole.extra()["balance_trajectory"]
    assert [e[0] for e in traj] == [0, 3, 6] and len({tuple(e[1:]) for e in traj}) == 3
    assert traj[-1][1:] == list(tgdt_train.loss_weights(whole.model, cfg))
    # resumed after step 3: the re-measurement at the start of step 4 happens in the resumed run
    measured.clear()
    first = train(tgdt_train.TGDTRecipe(cfg.replace(steps=3), data), session=False)
    saved = SimpleNamespace(step=3, extra=first.extra())  # what the checkpoint at step 3 holds

    class Resumed(tgdt_train.TGDTRecipe):
        def build(self) -> None:  # as the trainer does after restoring the checkpoint
            super().build()
            self.on_restore(saved)

    rest = Resumed(cfg, data, model=first.model, optimizer=first.optimizer)
    train(rest, session=False, start=3)
    assert measured == [0, 3, 6]
    assert rest.extra()["balance_trajectory"] == traj
    for a, b in zip(whole.model.state_dict().values(), rest.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    # text_grad: one measurement, at initialisation; unit: none
    measured.clear()
    once = train(tgdt_train.TGDTRecipe(cfg.replace(loss_balance="text_grad"), data),
                 session=False)  # fmt: skip
    assert measured == [0] and [e[0] for e in once.extra()["balance_trajectory"]] == [0]
    measured.clear()
    train(tgdt_train.TGDTRecipe(cfg.replace(loss_balance="unit", steps=2), data), session=False)
    assert measured == []


def test_shared_balance_takes_the_smaller_factor_of_text_encoder_and_decoder():
    """shared_grad_running: each alignment loss's factor is the smaller of L_DT's norm over its
    own on the text encoder and on the decoder blocks, so after the measurement neither weighted
    alignment loss pulls on either part harder than L_DT (equal on the binding part); it runs on
    text_grad_running's schedule and the run records its trajectory."""
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import TGDTRecipe, gradient_norms
    from nshot.train.trainer import train

    torch.set_num_threads(1)
    cfg = TGDTConfig.from_preset(
        "smoke", steps=4, loss_balance="shared_grad_running", balance_every=2, balance_batches=2
    )
    assert cfg.balanced and [s for s in range(1, 5) if cfg.rebalances_at(s)] == [3]
    data = load_data(cfg)
    for system in ("tgdt", "tgdt_no_tbc", "tgdt_no_tbm"):
        c = cfg.replace(system=system)
        recipe = TGDTRecipe(c, data)
        recipe.build()
        init = recipe.balance_norms
        f = dict(zip(("tbc", "tbm"), recipe.model.align_factors.tolist(), strict=True))
        again = gradient_norms(recipe.model, c, data, c.balance_batches)
        for k in ("tbc", "tbm"):
            if k not in init["text_encoder"]:
                assert f[k] == 1.0, (system, k)
                continue
            ratios = [init[g]["dt"] / init[g][k] for g in ("text_encoder", "decoder_blocks")]
            assert f[k] == pytest.approx(min(ratios), rel=1e-5), (system, k)
            weighted = [f[k] * again[g][k] / again[g]["dt"] for g in again]
            assert max(weighted) == pytest.approx(1.0, rel=1e-4), (system, k)
    # the text encoder alone (text_grad) gives a factor at least as large
    alone = TGDTRecipe(cfg.replace(loss_balance="text_grad"), data)
    alone.build()
    shared = TGDTRecipe(cfg, data)
    shared.build()
    assert all(
        a >= s - 1e-6
        for a, s in zip(
            alone.model.align_factors.tolist(), shared.model.align_factors.tolist(), strict=True
        )
    )
    whole = train(TGDTRecipe(cfg, data), session=False)
    assert [e[0] for e in whole.extra()["balance_trajectory"]] == [0, 2]


def test_text_grad_balance_equalises_the_text_encoder_gradients_at_initialisation():
    """loss_balance=text_grad: the factors make each alignment loss's mean gradient norm on the
    text encoder equal L_DT's on the measured batches; the objective uses them; a checkpoint
    keeps them; unit weights register nothing (older checkpoints load)."""
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import TGDTRecipe, gradient_norms, loss_weights
    from nshot.train.trainer import train

    torch.set_num_threads(1)
    base = TGDTConfig.from_preset("smoke", steps=2, loss_balance="text_grad", balance_batches=2)
    data = load_data(base)
    for system, has in (("tgdt", (True, True)), ("tgdt_no_tbc", (False, True)),
                        ("tgdt_no_tbm", (True, False))):  # fmt: skip
        cfg = base.replace(system=system)
        recipe = TGDTRecipe(cfg, data)
        recipe.build()
        init = recipe.balance_norms["text_encoder"]
        f = recipe.model.align_factors.tolist()
        for k, on, factor in (("tbc", has[0], f[0]), ("tbm", has[1], f[1])):
            if on:
                assert factor == pytest.approx(init["dt"] / init[k], rel=1e-5), system
            else:
                assert factor == 1.0 and k not in init, system
        again = gradient_norms(recipe.model, cfg, data, cfg.balance_batches)["text_encoder"]
        for k in ("tbc", "tbm"):
            if k in again:
                w = f[0] if k == "tbc" else f[1]
                assert w * again[k] == pytest.approx(again["dt"], rel=1e-4), (system, k)
    # the objective: loss = w_dt L_DT + w_tbc f_tbc L_TBC + w_tbm f_tbm L_TBM
    logs: list[dict] = []
    recipe = TGDTRecipe(base, data, on_step=lambda s, m: logs.append(m))
    train(recipe, session=False)
    w_tbc, w_tbm = loss_weights(recipe.model, base)
    for m in logs:
        assert m["loss"] == pytest.approx(m["dt"] + w_tbc * m["tbc"] + w_tbm * m["tbm"], rel=1e-5)
    assert "align_factors" in recipe.model.state_dict() and recipe.extra()["loss_weights"] == [
        w_tbc, w_tbm
    ]  # fmt: skip
    from nshot.methods.tgdt.train import build_model

    assert "align_factors" not in build_model(base.replace(loss_balance="unit"), data).state_dict()
    # a given model keeps its factors (a resumed or fine-tuned run does not re-measure them)
    kept = recipe.model.align_factors.clone()
    again = TGDTRecipe(base, data, model=recipe.model)
    again.build()
    assert again.balance_norms is None and torch.equal(again.model.align_factors, kept)


def test_model_checks_padding_causality_and_tbm_negatives():
    from nshot.methods.tgdt.experiments import unit_checks

    u = unit_checks()
    assert u["padding_max_abs_change"] <= 1e-6
    assert u["causal_max_abs_change"] <= 1e-6
    assert u["later_tokens_change_later_actions"] > 1e-3  # the perturbation was real
    assert u["tbm_positive_fraction_min"] == u["tbm_positive_fraction_max"] == 0.25
    assert u["rollout_finite"] == 1.0


def test_the_step_builds_its_batches_and_losses_on_the_recipes_device():
    """tgdt trains on GPU workers: on the meta device (no data), the sampler's batches and
    every loss term of each system follow the device the recipe gives them (TBM's negatives are
    drawn by the CPU generator from the step's similarities, which needs data: TBM is off)."""
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import LossModule, Sampler, build_model

    base = TGDTConfig.from_preset("smoke")
    data = load_data(base)
    for system in ("tgdt_no_tbm", "naive_text_dt", "agnostic_dt", "oracle_dt", "prompt_dt"):
        cfg = base.replace(system=system)
        model = build_model(cfg, data).to("meta")
        dt, align = Sampler(cfg, data, "meta").step_batch(np.random.default_rng(0), cfg.tbc)
        terms = LossModule(model, cfg)(dt, align, torch.Generator().manual_seed(0))
        assert {v.device.type for v in terms.values()} == {"meta"}, system


def test_every_system_builds_trains_a_step_and_keeps_its_heads():
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import fit

    torch.set_num_threads(1)
    base = TGDTConfig.from_preset("smoke", steps=2)
    data = load_data(base)
    heads = {}
    for system in ("tgdt", "tgdt_no_tbc", "tgdt_no_tbm", "tgdt_no_align", "naive_text_dt",
                   "agnostic_dt", "oracle_dt", "prompt_dt"):  # fmt: skip
        logs = []
        model = fit(base.replace(system=system), data, on_step=lambda s, m, lg=logs: lg.append(m))
        assert all(np.isfinite(v) for m in logs for v in m.values()), system
        heads[system] = (model.has_tbc, model.has_tbm, model.text is not None, set(logs[-1]))
    assert heads["tgdt"][:3] == (True, True, True) and {"tbc", "tbm"} <= heads["tgdt"][3]
    assert heads["tgdt_no_tbc"][:2] == (False, True) and "tbc" not in heads["tgdt_no_tbc"][3]
    assert heads["tgdt_no_tbm"][:2] == (True, False) and "tbm" not in heads["tgdt_no_tbm"][3]
    for system in ("tgdt_no_align", "naive_text_dt", "agnostic_dt", "oracle_dt", "prompt_dt"):
        assert heads[system][3] == {"dt", "loss"}, system
    assert heads["tgdt_no_align"][:3] == (False, False, True)
    assert heads["agnostic_dt"][2] is False and heads["naive_text_dt"][2] is True
    # the frozen MiniLM text encoder: only its projection is trained and checkpointed
    minilm = fit(base.replace(text_encoder="minilm"), data)
    keys = [k for k in minilm.state_dict() if k.startswith("text.")]
    assert keys and all(k.startswith("text.proj.") for k in keys)
    text = minilm.encode_text([data.test_description(0), data.test_description(1)],
                              torch.tensor([0, 1, 1]))  # fmt: skip
    assert text.tokens.shape == (2, 1, base.d_model) and text.valid.all()


def test_rollout_window_metrics_and_the_expert_reference():
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.evaluation import auc, history_window, norm_scores
    from nshot.methods.tgdt.experiments import reference_scores

    cfg = TGDTConfig.from_preset("smoke")
    d = load_data(cfg)
    rtg = np.arange(12, dtype=float).reshape(2, 6)
    states = np.arange(24, dtype=float).reshape(2, 6, 2)
    w = history_window(rtg, states, np.ones((2, 6, 2)), t=2, k=5, horizon=cfg.horizon)
    assert w.valid.tolist() == [[False, False, True, True, True]] * 2  # left-padded
    assert w.timesteps[0].tolist() == [0, 0, 0, 1, 2] and w.rtg[1, 2:].tolist() == [6, 7, 8]
    late = history_window(rtg, states, np.ones((2, 6, 2)), t=5, k=3, horizon=cfg.horizon)
    assert late.valid.all() and late.states[0, -1].tolist() == [10, 11]
    tasks = d.test_tasks
    expert = d.returns[tasks, 0].mean(-1, keepdims=True)
    np.testing.assert_allclose(norm_scores(d, tasks, expert), 1.0, atol=1e-5)
    np.testing.assert_allclose(norm_scores(d, tasks, d.returns[tasks, 2]), 0.0, atol=1e-5)
    ref = reference_scores(cfg, d)
    assert ref["expert_controller_norm_score"] > 0.9 and ref["stand_still_norm_score"] < 0.5
    assert ref["expert_controller_success"] == 1.0
    # PointRobot's success: within 0.1 of the goal at some step, and it stays raised
    from nshot.methods.tgdt.data import PointSim

    sim = PointSim(np.array([[0.15, 0.0], [0.5, 0.5]]))
    sim.reset()
    sim.step(np.array([[0.06, 0.0], [0.1, 0.1]]))  # 0.09 from the first goal
    assert sim.success.tolist() == [True, False]
    sim.step(np.array([[-0.1, 0.0], [0.0, 0.0]]))
    assert sim.success.tolist() == [True, False]
    assert auc(np.array([2.0, 3.0]), np.array([1.0, 0.0])) == 1.0
    assert auc(np.array([1.0]), np.array([1.0])) == 0.5


def test_rtg_blind_matching_leaves_only_the_behaviour(monkeypatch):
    """The matching diagnostic gives both tiers the same R̂ tokens: a matcher that reads R̂
    alone separates expert from medium windows on the data and is at chance (all ties) once
    blinded; the states and actions are left as they were."""
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.evaluation import tbm_auc
    from nshot.methods.tgdt.train import fit

    torch.set_num_threads(1)
    cfg = TGDTConfig.from_preset("smoke", steps=2)
    d = load_data(cfg)
    model = fit(cfg, d)
    seen = []

    def reads_rtg(w, text):  # noqa: ANN001, ANN202
        seen.append(w)
        score = w.rtg.sum(-1)
        return torch.stack([-score, score], -1)

    monkeypatch.setattr(model, "tbm_logits", reads_rtg)
    assert tbm_auc(model, cfg, d) > 0.9
    expert, medium = seen
    seen.clear()
    assert tbm_auc(model, cfg, d, rtg_blind=True) == 0.5
    torch.testing.assert_close(seen[0].rtg, seen[1].rtg)
    torch.testing.assert_close(seen[0].states, expert.states)
    torch.testing.assert_close(seen[1].actions, medium.actions)


def test_metrics_with_repeated_descriptions():
    """Two tasks may share a description (Meta-World ML10 classes whose goal does not move
    between tasks): retrieval, matching and data sharing still read one row per task."""
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.evaluation import retrieval_top1, tbm_auc, text_similarity
    from nshot.methods.tgdt.train import fit

    torch.set_num_threads(1)
    cfg = TGDTConfig.from_preset("smoke", steps=2)
    d = load_data(cfg)
    d.goals = d.goals.copy()
    d.goals[1] = d.goals[0]  # tasks 0 and 1 now have the same test-time description
    assert d.test_description(0) == d.test_description(1)
    model = fit(cfg, d)
    assert 0.0 <= retrieval_top1(model, cfg, d) <= 1.0
    assert 0.0 <= tbm_auc(model, cfg, d) <= 1.0
    sim = text_similarity(model, d, int(d.test_tasks[0]))
    assert sim.shape == (cfg.n_train_tasks,) and sim[0] == pytest.approx(sim[1])


def test_gradient_diagnostic_example(tmp_path, run_example, capsys):
    """examples/tgdt_gradients.py on smoke: each loss's gradient norm on the text encoder and
    the decoder blocks, at initialisation and after a few training steps."""
    import json

    out = tmp_path / "g.json"
    run_example("tgdt_gradients", ["--preset", "smoke", "--steps", "2", "--batches", "2",
                                   "--out", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    for when in ("init", "after_2_steps"):
        for part in ("text_encoder", "decoder_blocks"):
            r = report[when][part]
            assert min(r["dt"], r["tbc"], r["tbm"]) > 0 and -1 <= r["cos_dt_tbc"] <= 1
    assert '"cos_dt_tbc"' in capsys.readouterr().out


def test_minilm_memo_keeps_the_most_recent_descriptions(monkeypatch):
    """The MiniLM text encoder is the platform's ``minilm`` backbone (memoised, the most
    recently used descriptions kept) under a trained projection."""
    from nshot.data import sources
    from nshot.methods.tgdt.model import MiniLMEncoder
    from nshot.nn.text import SentenceEncoder

    calls = []

    def fake(texts):  # a stand-in for MiniLM: a fixed vector per text, calls recorded
        calls.append(list(texts))
        return np.stack([np.full(sources.MINILM_DIM, len(t), np.float32) for t in texts])

    monkeypatch.setattr(sources, "embed_texts", fake)
    monkeypatch.setattr(SentenceEncoder, "MEMO_SIZE", 2)
    enc = MiniLMEncoder(TGDTConfig.from_preset("smoke"))
    assert isinstance(enc.encoder, SentenceEncoder) and enc.encoder.spec.kind == "minilm"
    first, _ = enc(["a", "bb", "a"])
    assert calls == [["a", "bb"]] and torch.equal(first[0], first[2])
    enc(["ccc"])  # evicts "a", the least recently used
    assert list(enc.encoder._memo) == ["bb", "ccc"]
    again, _ = enc(["bb", "a"])
    assert calls[-1] == ["a"] and torch.equal(again[1], first[0])
    assert len(enc.encoder._memo) == 2
