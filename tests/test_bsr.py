"""bsr: pretraining on two Ray Train workers, the predictor over HTTP (any montage; a 422
naming the field for every bad input), conformal sets, experiments on smoke with every row,
metric and claim, and the example."""

from __future__ import annotations

import copy

import pytest

from nshot.method import get

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("bsr-runs")
    cfg = get("bsr").config("smoke")
    res = fit("bsr", cfg, scaling=Scaling(workers=0), storage=storage, name="one")
    return storage, cfg, res


def test_pretrains_on_two_ray_train_workers(trained):
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, _ = trained
    res = fit("bsr", cfg.replace(steps=2, checkpoint_every=2), scaling=Scaling(workers=2),
              storage=storage, name="two")  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="bsr")
    assert ckpt.step == 2 and 0.0 < ckpt.metrics["val_mae_mse"] < 5.0
    assert ckpt.extra["renderer"]["channels"][:2] == ["Fp1", "Fp2"]


def test_predictor_answers_any_montage_and_refuses_bad_input_with_422(trained):
    from fastapi.testclient import TestClient

    from nshot.methods.bsr.data import positions_for
    from nshot.serve.bare import make_app
    from nshot.train import load_checkpoint

    _, _, res = trained
    pred = get("bsr").predictor(load_checkpoint(res.checkpoint, method="bsr"))
    good = pred.example_request()
    names = good["ch_names"]
    by_pos = {**{k: v for k, v in good.items() if k != "ch_names"},
              "positions": positions_for(names).tolist()}  # fmt: skip
    short = [row[:100] for row in good["eeg"]]
    nan_eeg = copy.deepcopy(good["eeg"])
    nan_eeg[2][5] = float("nan")
    with TestClient(make_app("bsr", str(res.checkpoint))) as client:
        ok = client.post("/bsr/predict", json=good)
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert set(body["probs"]) == {"feet", "left_hand", "rest", "right_hand"}
        assert abs(sum(body["probs"].values()) - 1) < 1e-6 and body["channels_used"] == 19
        same = client.post("/bsr/predict", json=by_pos).json()  # positions instead of names
        assert same["montage_hash"] == body["montage_hash"] and same["probs"] == body["probs"]
        cases = {
            "ch_names": {**good, "ch_names": names[:-1]},
            "ch_names[3]": {**good, "ch_names": names[:3] + ["Xx9"] + names[4:]},
            "ch_names[4]": {**good, "ch_names": names[:4] + [names[0]] + names[5:]},
            "eeg": {**good, "eeg": good["eeg"][:7], "ch_names": names[:7]},
            "sfreq": {**good, "sfreq": 32.0},
            "support[1].eeg": {**good, "support": [good["support"][0],
                                                   {**good["support"][1], "eeg": short}]},
            "positions[0]": {**by_pos, "positions": [[0.0, 0.1]] + by_pos["positions"][1:]},
            "support": {**good, "support": [s for s in good["support"]
                                            if s["label"] == "rest"]},
        }  # fmt: skip
        for field, req in cases.items():
            got = client.post("/bsr/predict", json=req)
            assert got.status_code == 422, (field, got.text)
            assert got.json()["detail"][0]["field"] == field, (field, got.json())
        # too short for the frame layout (every trial equally short): the predictor refuses
        too_short = {**good, "eeg": short,
                     "support": [{**s, "eeg": [r[:100] for r in s["eeg"]]}
                                 for s in good["support"]]}  # fmt: skip
        got = client.post("/bsr/predict", json=too_short)
        assert got.status_code == 422 and got.json()["detail"][0]["field"] == "eeg", got.text
        got = client.post("/bsr/predict", content=_json_with_nan({**good, "eeg": nan_eeg}),
                          headers={"content-type": "application/json"})  # fmt: skip
        assert got.status_code == 422 and "eeg" in got.text, got.text


def _json_with_nan(body: dict) -> str:
    import json

    return json.dumps(body)  # writes NaN, which Python's JSON reader accepts


def test_conformal_sets_wrap_the_predictor(trained):
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, _, res = trained
    inner = get("bsr").predictor(load_checkpoint(res.checkpoint, method="bsr"))
    wrapped = ConformalPredictor(inner, alpha=0.2)
    answer = wrapped(wrapped.Request.model_validate(inner.example_request()))
    assert len(answer.sets) == 1
    assert set(answer.sets[0]) <= {"feet", "left_hand", "rest", "right_hand"}


def test_experiments_on_smoke_have_every_row_metric_and_claim(ray_session, tmp_path):
    from nshot.claims import evaluate
    from nshot.methods.bsr.experiments import METRICS

    bsr = get("bsr")
    cfg = bsr.config("smoke")
    table = bsr.experiments(cfg, tmp_path)
    assert list(table.rows) == list(cfg.systems) and set(table.metrics) == set(METRICS)
    for system, row in table.rows.items():
        for metric in ("bacc_k1_A", "bacc_k5_A", "bacc_k5_B", "kappa_k5_A", "drop_A_to_B"):
            assert row[metric] is not None, (system, metric)
        assert row["bacc_k10_A"] is None  # smoke has no k = 10
        assert (row["mae_mse"] is not None) == system.startswith("bsr")
    claims = evaluate(bsr.claims, table.to_json())
    assert len(claims) == 7 and all(c.get("applies") is False for c in claims)


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("bsr", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "held-out subjects:" in out and "P(" in out and "montage B" in out
