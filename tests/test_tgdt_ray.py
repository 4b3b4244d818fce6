"""tgdt under Ray: fault → resume equals an uninterrupted run and evaluates, the predictor over
HTTP with its 422s, experiments on smoke with every row and claim, and the example on two Ray
Train workers (the method's one two-worker run)."""

from __future__ import annotations

import pytest

from nshot.method import get


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("tgdt-runs")
    cfg = get("tgdt").config("smoke")
    res = fit("tgdt", cfg, scaling=Scaling(workers=0), storage=storage, name="one")
    return storage, cfg, res


def test_resume_after_a_fault_equals_an_uninterrupted_run_and_evaluates(trained):
    import torch

    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = trained
    faulty = cfg.replace(fail_at_step=cfg.checkpoint_every + 3)
    with pytest.raises(Exception, match="injected fault"):
        fit("tgdt", faulty, scaling=Scaling(workers=0), storage=storage, name="fault")
    again = fit("tgdt", faulty, scaling=Scaling(workers=0), storage=storage, name="fault",
                resume=True)  # fmt: skip
    a = load_checkpoint(res.checkpoint, method="tgdt")
    b = load_checkpoint(again.checkpoint, method="tgdt")
    assert a.step == b.step == cfg.steps
    wa, wb = a.weights(), b.weights()
    assert set(wa) == set(wb) and {"state_mean", "state_std", "target_return"} <= set(wa)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0, msg=name)
    assert {"dt", "tbc", "tbm", "tbc_acc", "tbm_acc"} <= set(b.metrics)
    metrics = get("tgdt").evaluate(b, cfg)
    assert {"norm_score", "return", "retrieval_top1", "tbm_auc", "leak_delta",
            "share_norm_score"} <= set(metrics)  # fmt: skip
    assert 0.0 <= metrics["retrieval_top1"] <= 1.0 and 0.0 <= metrics["tbm_auc"] <= 1.0


def test_predictor_answers_and_refuses_bad_input_with_422(trained):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    pred = get("tgdt").predictor(load_checkpoint(res.checkpoint, method="tgdt"))
    good = pred.example_request()
    answer = pred(pred.Request.model_validate(good))
    assert len(answer.action) == 2 and all(abs(v) <= 0.1 for v in answer.action)
    assert answer.rtg == pytest.approx(good["target_return"] - sum(good["rewards"]), abs=1e-5)
    # histories longer than K are truncated to the last K steps: the same answer
    long = {
        **good,
        "states": [[0.5, 0.5]] * 30 + good["states"],
        "actions": [[0.0, 0.0]] * 30 + good["actions"],
        "rewards": [0.0] * 30 + good["rewards"],
    }
    far = pred(pred.Request.model_validate(long))
    assert len(far.action) == 2
    roll = {"mode": "rollout", "description": good["description"], "goal": [0.3, -0.7],
            "episodes": 2}  # fmt: skip
    r = pred(pred.Request.model_validate(roll))
    assert len(r.returns) == 2 and len(r.trajectory) == cfg.horizon + 1
    bad = {
        "description": {**good, "description": "   "},
        "states.1": {**good, "states": [[0.0, 0.0], [0.1, 0.2, 0.3]]},
        "actions.0": {**good, "actions": [[0.1]]},
        "actions": {**good, "actions": []},
        "rewards": {**good, "rewards": [0.0, 1.0]},
        "goal": {**roll, "goal": [1.5, 0.0]},
        "episodes": {**roll, "episodes": 50},
        "target_return": {**good, "target_return": "3"},
    }
    with TestClient(make_app("tgdt", str(res.checkpoint))) as client:
        got = client.post("/tgdt/predict", json=good)
        assert got.status_code == 200 and got.json()["action"] == answer.action
        for field, body in bad.items():
            r = client.post("/tgdt/predict", json=body)
            assert r.status_code == 422, (field, r.text)
            assert field in r.text.replace("[", ".").replace("]", ""), (field, r.text)
        for body in (b'{"description": "go", "states": [[NaN, 0.0]], "actions": [], '
                     b'"rewards": []}',
                     b'{"description": "go", "states": [[0.0, 0.0], [0.1, 0.1]], '
                     b'"actions": [[0.1, 0.1]], "rewards": [Infinity]}'):  # fmt: skip
            r = client.post("/tgdt/predict", content=body,
                            headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code == 422, r.text
        r = client.post("/tgdt/predict", json={"description": ""})
        assert r.status_code == 422 and "description" in r.text
        # finite but far past any environment's scale (they overflowed the policy into NaN: 500)
        huge = {
            "states.1": {**good, "states": [good["states"][0], [1e25, -1e25]] + good["states"][2:]},
            "target_return": {**good, "target_return": 1e25},
            "rewards.0": {**good, "rewards": [1e25] + good["rewards"][1:]},
        }
        for field, body in huge.items():
            r = client.post("/tgdt/predict", json=body)
            assert r.status_code == 422 and "beyond" in r.text, (field, r.text)
            assert field in r.text.replace("[", ".").replace("]", ""), (field, r.text)


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.tgdt.experiments import METRICS, rows_order

    tg = get("tgdt")
    cfg = tg.config("smoke", steps=3)
    table = tg.experiments(cfg, tmp_path)
    assert list(table.rows) == rows_order(cfg) and set(table.metrics) == set(METRICS)
    for row in table.rows:
        assert table.rows[row]["norm_score"] is not None, row
    assert (
        table.rows["tgdt"]["tbm_auc"] is not None and table.rows["tgdt"]["leak_delta"] is not None
    )
    assert table.rows["tgdt_no_tbm"]["tbm_auc"] is not None  # the TBC cosine
    assert table.rows["tgdt_no_tbc"]["retrieval_top1"] is None
    assert table.rows["agnostic_dt"]["leak_delta"] is None
    assert "tgdt_minilm" not in table.rows  # minilm_row is off in smoke
    oracle, bar = table.samples["oracle_dt"]["norm_score"], table.samples["oracle_dt_70pct"]
    assert bar["norm_score"] == pytest.approx([0.7 * v for v in oracle])  # not trained
    assert bar["return"] == [None] and table.rows["tgdt_no_align"]["retrieval_top1"] is None
    grads = table.extra["text_gradients"]
    assert set(grads) == {f"{r}/{cfg.seed}" for r in ("tgdt", "tgdt_no_tbc", "tgdt_no_tbm",
                                                       "tgdt_no_align", "naive_text_dt")}  # fmt: skip
    assert grads[f"tgdt/{cfg.seed}"]["init"] is None  # smoke keeps the unit weights
    assert {"dt", "tbc", "tbm"} <= set(grads[f"tgdt/{cfg.seed}"]["final"]["text_encoder"])
    assert (tmp_path / "tgdt.png").is_file()
    claims = {c["id"]: c for c in evaluate(tg.claims, table.to_json())}
    assert set(claims) == {c.id for c in tg.claims}
    units = [k for k in claims if k.startswith("unit_")]
    assert units and all(claims[k]["holds"] is True for k in units)
    assert all(c.get("applies") is False for k, c in claims.items() if k not in units)


def test_example_on_two_ray_train_workers(ray_session, tmp_path, run_example, capsys):
    run_example("tgdt", ["--workers", "2", "--output", str(tmp_path), "--set", "steps=4",
                         "--set", "checkpoint_every=4", "--set", "log_every=2"])  # fmt: skip
    out = capsys.readouterr().out
    assert "zero-shot on the held-out goals" in out and "first action" in out
    assert "rollout returns" in out
