"""timemode under Ray: pre-train → fault → resume equals an uninterrupted run, evaluate, a
fine-tune from the pre-trained checkpoint, two Ray Train workers, the predictor over HTTP with
its 422s, experiments on smoke and the example."""

from __future__ import annotations

import pytest

from nshot.method import get


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("timemode-runs")
    cfg = get("timemode").config("smoke")
    res = fit("timemode", cfg, scaling=Scaling(workers=0), storage=storage, name="one")
    return storage, cfg, res


def test_resume_after_a_fault_equals_an_uninterrupted_run_then_finetunes(trained):
    import torch

    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = trained
    faulty = cfg.replace(fail_at_step=cfg.checkpoint_every + 3)
    with pytest.raises(Exception, match="injected fault"):
        fit("timemode", faulty, scaling=Scaling(workers=0), storage=storage, name="fault")
    again = fit("timemode", faulty, scaling=Scaling(workers=0), storage=storage, name="fault",
                resume=True)  # fmt: skip
    a = load_checkpoint(res.checkpoint, method="timemode")
    b = load_checkpoint(again.checkpoint, method="timemode")
    assert a.step == b.step == cfg.pretrain_steps
    wa, wb = a.weights(), b.weights()
    assert set(wa) == set(wb) and any(k.startswith("ema.") for k in wa)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0, msg=name)
    assert abs(a.metrics["loss"] - b.metrics["loss"]) <= 1e-6
    assert {"mse", "ortho", "balance", "route_entropy"} <= set(b.metrics)
    assert b.extra["run"]["domains"] == ["sine", "ar1", "random_walk", "square", "chirp", "spikes"]
    metrics = get("timemode").evaluate(b, cfg)
    assert {"disc", "fid_feat", "pred", "routing_js"} <= set(metrics)
    assert 0.0 <= metrics["disc"] <= 0.5 and 0.0 <= metrics["routing_js"] <= 1.0
    # fine-tune on the target's few-shot windows from the pre-trained checkpoint
    ft = cfg.replace(stage="finetune", init_from=str(res.checkpoint))
    done = fit("timemode", ft, scaling=Scaling(workers=0), storage=storage, name="ft")
    c = load_checkpoint(done.checkpoint, method="timemode")
    assert c.step == cfg.finetune_steps and c.extra["run"]["domains"] == ["damped"]
    assert not torch.equal(c.weights()["ema.out.weight"], wa["ema.out.weight"])


def test_trains_on_two_ray_train_workers(trained):
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, _ = trained
    cfg = cfg.replace(pretrain_steps=4, checkpoint_every=4, log_every=2)
    res = fit("timemode", cfg, scaling=Scaling(workers=2), storage=storage, name="two")
    ckpt = load_checkpoint(res.checkpoint, method="timemode")
    assert ckpt.step == 4
    pred = get("timemode").predictor(ckpt)
    answer = pred(pred.Request.model_validate({"n_samples": 2, "domain": "sine"}))
    assert len(answer.samples) == 2 and len(answer.samples[0]) == cfg.window


def test_predictor_answers_and_refuses_bad_input_with_422(trained):
    import numpy as np
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    pred = get("timemode").predictor(load_checkpoint(res.checkpoint, method="timemode"))
    ex = pred.example_request()["exemplars"]
    good = {"n_samples": 3, "exemplars": ex, "seed": 5}
    answer = pred(pred.Request.model_validate(good))
    out = np.asarray(answer.samples)
    assert out.shape == (3, cfg.window, 1) and answer.steps == cfg.diffusion_steps
    # original units: the scaled output maps back through the exemplars' own min-max
    scaled = pred(pred.Request.model_validate({**good, "return_scaled": True}))
    lo, hi = np.min(ex), np.max(ex)
    np.testing.assert_allclose(out, np.asarray(scaled.samples) * (hi - lo) + lo, atol=1e-4)
    # the batched form runs one reverse chain over the requests and answers as one by one
    reqs = [pred.Request.model_validate(b) for b in
            (good, {"n_samples": 2, "domain": "sine", "seed": 1},
             {**good, "n_samples": 4, "seed": 9, "return_scaled": True}, good)]  # fmt: skip
    together = pred.batch(reqs)
    for r, got in zip(reqs, together, strict=True):
        alone = pred(r)
        assert got.domain == alone.domain and got.seed == alone.seed
        np.testing.assert_allclose(got.samples, alone.samples, atol=1e-4, rtol=0)
    assert together[0].samples == together[3].samples
    bad = {
        "exemplars": {"n_samples": 2},  # neither
        "domain": {"n_samples": 2, "domain": "nope"},
        "exemplars.0": {"n_samples": 2, "exemplars": [[[0.1], [0.2]]]},  # wrong L
        "exemplars.0.0": {"n_samples": 2, "exemplars": [[[0.1, 0.2]] * cfg.window]},  # wrong C
        "n_samples": {"n_samples": 5000, "domain": "sine"},
        "exemplars.1": {"n_samples": 2, "exemplars": [ex[0], [[0.3]] * cfg.window]},  # constant
    }
    with TestClient(make_app("timemode", str(res.checkpoint))) as client:
        got = client.post("/timemode/predict", json=good)
        assert got.status_code == 200 and got.json()["samples"] == answer.model_dump()["samples"]
        both = client.post("/timemode/predict", json={**good, "domain": "sine"})
        assert both.status_code == 422 and "exactly one" in both.text
        for field, body in bad.items():
            r = client.post("/timemode/predict", json=body)
            assert r.status_code == 422, (field, r.text)
            text = r.text.replace("[", ".").replace("]", "")
            assert field in text, (field, r.text)
        r = client.post("/timemode/predict", json={"n_samples": 2, "domain": "nope"})
        assert "sine" in r.text  # the known domains are listed
        r = client.post("/timemode/predict",
                        content=b'{"n_samples": 2, "exemplars": [[[NaN]]]}',
                        headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 422, r.text


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.timemode.experiments import METRICS, REGIME_ROWS

    tm = get("timemode")
    cfg = tm.config("smoke", pretrain_steps=6, finetune_steps=3, scratch_steps=3, n_generate=16,
                    disc_iters=5, pred_iters=5, diffusion_steps=5)  # fmt: skip
    table = tm.experiments(cfg, tmp_path)
    rows = ["timemode", "dit_dense", "no_domain_prompt", "no_stage_adaln", "from_scratch",
            "timevae", "ar_sim", "marginal_noise", "timemode_frozen", "timemode_longpre"]  # fmt: skip
    assert list(table.rows) == rows and set(table.metrics) == set(METRICS)
    for row in rows:
        for m in ("disc", "fid_feat", "pred"):
            assert table.rows[row][m] is not None, (row, m)
        has_regimes = table.rows[row]["disc_10"] is not None
        assert has_regimes == (row in REGIME_ROWS), row
    assert table.rows["timemode"]["routing_js"] is not None
    assert table.rows["dit_dense"]["routing_js"] is None  # no router
    # the frozen fine-tune starts from TimeMoDE's pre-training, the long one from its own
    pre = table.extra["pretraining"]
    assert table.rows["timemode_frozen"]["routing_js"] == pre["timemode"]["routing_js"]
    assert table.rows["timemode_longpre"]["routing_js"] == pre["timemode_longpre"]["routing_js"]
    assert pre["timemode_longpre"]["steps"] == cfg.long_pretrain_factor * pre["timemode"]["steps"]
    assert table.rows["timemode_frozen"]["disc"] != table.rows["timemode"]["disc"] or (
        table.rows["timemode_frozen"]["fid_feat"] != table.rows["timemode"]["fid_feat"]
    )
    assert set(table.extra["resemblance"]) == {"damped"}  # smoke's only target
    assert (tmp_path / "timemode.png").is_file()
    claims = {c["id"]: c for c in evaluate(tm.claims, table.to_json())}
    assert set(claims) == {c.id for c in tm.claims}
    units = [k for k in claims if k.startswith("unit_")]
    assert units and all(claims[k]["holds"] is True for k in units)
    assert all(c.get("applies") is False for k, c in claims.items() if k not in units)


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("timemode", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "generated" in out and "disc" in out
