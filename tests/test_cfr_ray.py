"""cfr under Ray: train → fault → resume equals an uninterrupted run, evaluate, two Ray Train
workers, the predictor over HTTP with its 422s, experiments on smoke and the example."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from nshot.method import get
from nshot.methods.cfr.config import CfrConfig


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("cfr-runs")
    cfg = get("cfr").config("smoke")
    res = fit("cfr", cfg, scaling=Scaling(workers=0), storage=storage, name="one")
    return storage, cfg, res


def test_resume_after_a_fault_equals_an_uninterrupted_run_and_evaluates(trained):
    import torch

    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = trained
    faulty = cfg.replace(fail_at_step=cfg.map_epochs + 2)  # inside stage 3, after a checkpoint
    with pytest.raises(Exception, match="injected fault"):
        fit("cfr", faulty, scaling=Scaling(workers=0), storage=storage, name="fault")
    again = fit("cfr", faulty, scaling=Scaling(workers=0), storage=storage, name="fault",
                resume=True)  # fmt: skip
    a = load_checkpoint(res.checkpoint, method="cfr")
    b = load_checkpoint(again.checkpoint, method="cfr")
    assert a.step == b.step == cfg.steps == cfg.map_epochs + cfg.ret_epochs
    wa, wb = a.weights(), b.weights()
    assert set(wa) == set(wb)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], msg=name)
    assert b.extra["run"]["banks_built"] and b.extra["run"]["bank_sizes"]["rgb_bank"] > 0
    assert 0.0 <= b.metrics["val_aupro30"] <= 1.0 and 0.0 <= b.metrics["val_i_auroc"] <= 1.0
    metrics = get("cfr").evaluate(b, cfg)
    assert set(metrics) == {"i_auroc", "p_auroc", "aupro30", "aupro10", "replaced_frac_normal"}
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    assert metrics["p_auroc"] > 0.5  # the map finds defect pixels better than chance


def test_trains_on_two_ray_train_workers(trained):
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, _ = trained
    cfg = cfg.replace(map_epochs=2, ret_epochs=1, checkpoint_every=3)
    res = fit("cfr", cfg, scaling=Scaling(workers=2), storage=storage, name="two")
    ckpt = load_checkpoint(res.checkpoint, method="cfr")
    assert ckpt.step == cfg.steps and ckpt.extra["run"]["banks_built"]
    pred = get("cfr").predictor(ckpt)
    answer = pred(pred.Request.model_validate(pred.example_request()))
    assert answer.image_score > 0 and len(answer.anomaly_map) == cfg.grid


def _png(arr: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_predictor_answers_and_refuses_bad_input_with_422(trained, tmp_path):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train import Scaling, fit, load_checkpoint
    from nshot.train.checkpoint import find_checkpoints

    storage, cfg, res = trained
    pred = get("cfr").predictor(load_checkpoint(res.checkpoint, method="cfr"))
    good = pred.example_request()
    rgb = np.asarray(good["rgb"], dtype=np.uint8)
    xyz = np.asarray(good["xyz"])
    with TestClient(make_app("cfr", str(res.checkpoint))) as client:
        ok = client.post("/cfr/predict", json=good)
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert 0 < body["valid_fraction"] < 1 and 0 <= body["replaced_fraction"] <= 1
        as_png = client.post("/cfr/predict", json={**good, "rgb": _png(rgb)})
        assert as_png.json() == body  # a PNG and the array give the same answer
        nomap = client.post("/cfr/predict", json={**good, "return_map": False}).json()
        assert nomap["anomaly_map"] is None and nomap["image_score"] == body["image_score"]
        rgba = np.concatenate([rgb, np.full_like(rgb[..., :1], 255)], -1)
        nan_xyz = xyz.tolist()
        nan_xyz[3][4][2] = float("nan")
        cases = {
            "class_name": {**good, "class_name": "teapot"},
            "rgb": {**good, "rgb": "not a png!"},
            "rgb[0][0]": {**good, "rgb": rgba.tolist()},
            "xyz[0][0]": {**good, "xyz": xyz[..., :2].tolist()},
            "xyz": {**good, "xyz": xyz[:-1].tolist()},
            "xyz[0]": {**good, "xyz": xyz[:, :-1].tolist()},
        }  # fmt: skip
        for field, req in cases.items():
            got = client.post("/cfr/predict", json=req)
            assert got.status_code == 422, (field, got.text)
            assert got.json()["detail"][0]["field"] == field, (field, got.json())
        got = client.post("/cfr/predict", json={**good, "rgb": _png(rgba)})
        assert got.status_code == 422 and "RGBA" in got.text
        got = client.post("/cfr/predict", json={**good, "xyz": np.zeros_like(xyz).tolist()})
        assert got.status_code == 422 and "no valid point" in got.text
        # NaN/inf are not JSON: sent as the literals Python writes, they are refused
        for bad in ("NaN", "Infinity"):
            text = json.dumps({**good, "xyz": nan_xyz}).replace("NaN", bad)
            got = client.post("/cfr/predict", content=text,
                              headers={"content-type": "application/json"})  # fmt: skip
            assert got.status_code == 422, got.text
        with pytest.raises(ValueError, match=r"xyz\[3\]\[4\]: NaN or inf"):
            pred.Request.model_validate({**good, "xyz": nan_xyz})
    # a checkpoint from stage 1 has no memory bank yet: 422 naming class_name
    early = cfg.replace(checkpoint_every=1, fail_at_step=2)  # dies after the step-1 checkpoint
    with pytest.raises(Exception, match="injected fault"):
        fit("cfr", early, scaling=Scaling(workers=0), storage=storage, name="early")
    (stage1,) = find_checkpoints(storage / "early")
    assert json.loads((stage1 / "state.json").read_text())["step"] == 1
    with TestClient(make_app("cfr", str(stage1))) as client:
        got = client.post("/cfr/predict", json=good)
        assert got.status_code == 422 and "no memory bank" in got.text
        assert got.json()["detail"][0]["field"] == "class_name"


def test_a_bundle_serves_several_classes_and_shots_in_one_deployment(trained, tmp_path):
    """Three runs bundled into one checkpoint: each answer equals its own checkpoint's, the
    request's class and shot pick the model (default: the class's largest k), a class or k the
    bundle lacks is a 422 naming the field, evaluation covers every model; duplicates, models
    that do not share the extractors and an existing output are refused."""
    from fastapi.testclient import TestClient

    from nshot.errors import NshotError
    from nshot.methods.cfr.bundle import main as bundle_main
    from nshot.methods.cfr.model import check_bundle, write_bundle
    from nshot.serve.bare import make_app
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = trained
    cfr = get("cfr")
    ring = fit("cfr", cfg.replace(classes=["bump", "ring"], class_name="ring"),
               scaling=Scaling(workers=0), storage=storage, name="ring")  # fmt: skip
    bump2 = fit("cfr", cfg.replace(shot=2), scaling=Scaling(workers=0), storage=storage,
                name="bump-k2")  # fmt: skip
    singles = {("bump", 1): res.checkpoint, ("ring", 1): ring.checkpoint,
               ("bump", 2): bump2.checkpoint}  # fmt: skip
    out = tmp_path / "bundle"
    assert bundle_main([str(out), *(str(p) for p in singles.values())]) == 0
    bundle = cfr.predictor(load_checkpoint(out, method="cfr"))
    for (name, k), path in singles.items():
        one = cfr.predictor(load_checkpoint(path, method="cfr"))
        req = {**one.example_request(), "shot": k}
        want = one(one.Request.model_validate(req)).model_dump()
        assert want["class_name"] == name and want["shot"] == k
        assert bundle(bundle.Request.model_validate(req)).model_dump() == want
    meta = bundle.metadata()
    assert meta["classes"] == ["bump", "ring"] and len(meta["bundle"]) == 3
    good = bundle.example_request()  # bump, no shot: its largest k
    assert bundle(bundle.Request.model_validate(good)).shot == 2
    with TestClient(make_app("cfr", str(out))) as client:
        ok = client.post("/cfr/predict", json={**good, "class_name": "ring", "shot": 1})
        assert ok.status_code == 200 and ok.json()["shot"] == 1, ok.text
        for field, req in {"class_name": {**good, "class_name": "saddle"},
                           "shot": {**good, "class_name": "ring", "shot": 2}}.items():  # fmt: skip
            got = client.post("/cfr/predict", json=req)
            assert got.status_code == 422, (field, got.text)
            assert got.json()["detail"][0]["field"] == field, got.json()
        got = client.post("/cfr/predict", json={**good, "shot": "2"})  # strict: no coercion
        assert got.status_code == 422 and got.json()["detail"][0]["field"] == "shot"
    metrics = cfr.evaluate(load_checkpoint(out, method="cfr"), cfg)
    assert len(metrics) == 15
    alone = cfr.evaluate(load_checkpoint(ring.checkpoint, method="cfr"), cfg)
    assert {k: metrics[f"ring.k1.{k}"] for k in alone} == alone
    ckpt = load_checkpoint(res.checkpoint, method="cfr")
    with pytest.raises(NshotError, match="exists"):
        write_bundle([ckpt], out)
    with pytest.raises(NshotError, match=r"both the model of class 'bump' at k = 1"):
        write_bundle([ckpt, load_checkpoint(out, method="cfr")], tmp_path / "dup")
    with pytest.raises(NshotError, match="field 'feature_seed'"):
        check_bundle([(cfg, "bump", "a"), (cfg.replace(feature_seed=1), "ring", "b")], "x")
    assert not (tmp_path / "dup").exists()


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.cfr.experiments import METRICS, SYSTEMS

    cfr = get("cfr")
    table = cfr.experiments(cfr.config("smoke"), tmp_path)
    assert list(table.rows) == list(SYSTEMS) and set(table.metrics) == set(METRICS)
    for system in SYSTEMS:
        assert all(table.rows[system][m] is not None for m in METRICS), system
    assert table.rows["cfr_cyclic_only"]["replaced_frac_normal"] == 0.0
    assert table.rows["cfr"]["replaced_frac_normal"] == pytest.approx(
        table.rows["cfr_random_replace"]["replaced_frac_normal"])  # fmt: skip
    assert (tmp_path / "cfr.png").is_file()
    results = table.to_json()
    assert set(results["extra"]["theta_sweep"]["k4"]) == {"0.2", "0.4"}
    claims = {c["id"]: c for c in evaluate(cfr.claims, results)}
    assert set(claims) == {c.id for c in cfr.claims}
    assert claims["aupro_metric_exact"]["holds"] is True
    assert all(c.get("applies") is False for k, c in claims.items() if k != "aupro_metric_exact")
    per_class = results["samples"]["cfr"]["i_auroc_k4_per_class"]
    assert len(per_class) == 1 and per_class[0] == pytest.approx(table.rows["cfr"]["i_auroc_k4"])
    assert results["extra"]["generator_version"] == 1


def test_experiments_on_generator_v2_pair_headlines_over_classes(monkeypatch, tmp_path):
    """On version-2 data (two classes at smoke's sizes) the per-class headlines have one pair
    per class, and the check on the generator's structure is evaluated (its premise holds)."""
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    from nshot.claims import evaluate

    cfr = get("cfr")
    cfg = CfrConfig.from_preset(
        "smoke", generator_version=2, classes=["foam", "tire"], class_name="foam"
    )
    results = cfr.experiments(cfg, tmp_path).to_json()
    assert results["extra"]["generator_version"] == 2
    assert set(results["extra"]["per_type"]["k4"]["cfr"]) == {"geometric", "colour", "both"}
    as_small = {c["id"]: c for c in evaluate(cfr.claims, {**results, "preset": "small"})}
    for cid in ("headline_i_auroc_beats_cfm_per_class",
                "headline_i_auroc_beats_patchcore_rgb_per_class",
                "headline_i_auroc_beats_patchcore_3d_per_class"):  # fmt: skip
        assert as_small[cid]["effect"]["n"] == 2, cid
    check = as_small["unimodal_banks_miss_what_their_modality_cannot_see"]
    assert check["premise"] is True and check["holds"] is not None


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("cfr", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "test metrics:" in out and "anomalous image" in out


def test_bundle_example_serves_two_classes_from_one_checkpoint(
    ray_session, tmp_path, run_example, capsys
):
    run_example("cfr_bundle", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "wrote" in out and "2 models" in out
    assert "bump (k=1), anomalous image" in out and "ring (k=1), normal image" in out
