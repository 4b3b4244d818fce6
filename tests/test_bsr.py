"""bsr: pretraining on two Ray Train workers, the predictor over HTTP (any montage, stored
subject statistics; a 422 naming the field for every bad input) and its conformal sets,
experiments on smoke with every row, metric and claim, and the example."""

from __future__ import annotations

import copy

import pytest

from nshot.method import get


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    """The one two-worker run (smoke, 4 steps); the predictor tests serve its checkpoint."""
    from nshot.methods.bsr.data import load_dataset
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("bsr-runs")
    cfg = get("bsr").config("smoke")
    load_dataset(cfg)  # generated once here: the two workers read the cache, not race to build it
    res = fit("bsr", cfg, scaling=Scaling(workers=2), storage=storage, name="two")
    return storage, cfg, res


def test_pretrains_on_two_ray_train_workers(trained):
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    ckpt = load_checkpoint(res.checkpoint, method="bsr")
    assert ckpt.step == cfg.steps and 0.0 < ckpt.metrics["val_mae_mse"] < 5.0
    assert ckpt.extra["renderer"]["channels"][:2] == ["Fp1", "Fp2"]
    assert sorted(ckpt.extra["renderer"]["subject_stats"]) == ["s000", "s001", "s002"]


def test_predictor_answers_any_montage_refuses_bad_input_with_422_and_gives_sets(trained):
    from fastapi.testclient import TestClient

    from nshot.methods.bsr.data import positions_for
    from nshot.serve.bare import make_app
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, _, res = trained
    pred = get("bsr").predictor(load_checkpoint(res.checkpoint, method="bsr"))
    assert pred.metadata()["subjects"] == ["s000", "s001", "s002"]
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
        # a stored subject's statistics replace the support's: another rendering, other probs
        stored = client.post("/bsr/predict", json={**good, "subject_id": "s001"})
        assert stored.status_code == 200, stored.text
        assert stored.json()["probs"] != body["probs"]
        cases = {
            "ch_names": {**good, "ch_names": names[:-1]},
            "ch_names[3]": {**good, "ch_names": names[:3] + ["Xx9"] + names[4:]},
            "ch_names[4]": {**good, "ch_names": names[:4] + [names[0]] + names[5:]},
            "eeg": {**good, "eeg": good["eeg"][:7], "ch_names": names[:7]},
            "sfreq": {**good, "sfreq": 32.0},
            "support[1].eeg": {**good, "support": [good["support"][0],
                                                   {**good["support"][1], "eeg": short}]},
            "positions[0]": {**by_pos, "positions": [[0.0, 0.1]] + by_pos["positions"][1:]},
            "positions[2]": {**by_pos, "positions": by_pos["positions"][:2]
                             + [by_pos["positions"][0]] + by_pos["positions"][3:]},
            "support": {**good, "support": [s for s in good["support"]
                                            if s["label"] == "rest"]},
            "subject_id": {**good, "subject_id": "t999"},
        }  # fmt: skip
        for field, req in cases.items():
            got = client.post("/bsr/predict", json=req)
            assert got.status_code == 422, (field, got.text)
            assert got.json()["detail"][0]["field"] == field, (field, got.json())
        got = client.post("/bsr/predict", json={**good, "sfreq": 8192.0})  # above the range
        assert got.status_code == 422 and got.json()["detail"][0]["field"] == "sfreq", got.text
        # too short for the lowest band's frame layout (every trial equally short)
        too_short = {**good, "eeg": short,
                     "support": [{**s, "eeg": [r[:100] for r in s["eeg"]]}
                                 for s in good["support"]]}  # fmt: skip
        got = client.post("/bsr/predict", json=too_short)
        assert got.status_code == 422 and got.json()["detail"][0]["field"] == "eeg", got.text
        got = client.post("/bsr/predict", content=_json_with_nan({**good, "eeg": nan_eeg}),
                          headers={"content-type": "application/json"})  # fmt: skip
        assert got.status_code == 422, got.text
        assert got.json()["detail"][0]["field"] == "eeg.2.5", got.text  # the NaN's index
    # prediction sets (`--conformal caos`) over the support's classes from the same embeddings
    wrapped = ConformalPredictor(pred, alpha=0.2)
    answer = wrapped(wrapped.Request.model_validate(good))
    assert len(answer.sets) == 1
    assert set(answer.sets[0]) <= {"feet", "left_hand", "rest", "right_hand"}


def test_caos_sets_cover_held_out_subjects_trials(trained, caos_coverage):
    """`--conformal caos` on bsr: marginal coverage over a target subject's own trials (montage B)."""
    import numpy as np

    from nshot.methods.bsr.data import CLASSES, MONTAGE_B, load_dataset, montage_channels
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    inner = get("bsr").predictor(load_checkpoint(res.checkpoint, method="bsr"))
    cp = ConformalPredictor(inner, "caos", alpha=0.2, k=1)
    data, chans = load_dataset(cfg), montage_channels("B")
    uv = lambda x: (x[chans].astype(np.float64) * 1e6).tolist()  # noqa: E731
    rng = np.random.default_rng(11)
    episodes = []
    for i in range(64):  # one query per request (bsr answers one trial)
        # 17 of one target subject's 24 trials, shuffled: 16 support, the last the query
        # (exchangeable: the same subject, montage and session; no class balancing)
        x, y = data.subject(data.names("target")[i % 2])
        *sup, q = rng.permutation(len(y))[:17]
        body = {"eeg": uv(x[q]), "ch_names": list(MONTAGE_B), "sfreq": cfg.sfreq, "unit": "uV",
                "support": [{"eeg": uv(x[j]), "label": CLASSES[y[j]]} for j in sup]}  # fmt: skip
        episodes.append((cp.Request.model_validate(body), [CLASSES[y[q]]]))
    caos_coverage(cp, episodes, 0.2, informative=len(CLASSES))


def _json_with_nan(body: dict) -> str:
    import json

    return json.dumps(body)  # writes NaN, which Python's JSON reader accepts


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.bsr.data import load_dataset
    from nshot.methods.bsr.experiments import METRICS, RECIPE_GRIDS

    bsr = get("bsr")
    cfg = bsr.config("smoke")
    table = bsr.experiments(cfg, tmp_path)
    assert list(table.rows) == list(cfg.systems) and set(table.metrics) == set(METRICS)
    for system, row in table.rows.items():
        for metric in ("bacc_k1_A", "bacc_k5_A", "bacc_k5_B", "kappa_k5_A", "drop_A_to_B",
                       "bacc_k5_C", "drop_A_to_C"):  # fmt: skip
            assert row[metric] is not None, (system, metric)
        assert row["bacc_k10_A"] is None  # smoke has no k = 10
        assert (row["mae_mse"] is not None) == system.startswith("bsr")
    claims = evaluate(bsr.claims, table.to_json())
    assert len(claims) == 12 and all(c.get("applies") is False for c in claims)
    assert [c["id"] for c in claims if c["kind"] == "headline"] == [
        "bsr_beats_spectrum_methods",
        "bsr_beats_time_resolved_bandpower",
    ]
    # every row but EEGNet chose its recipe from its grid on the validation (source) subjects
    recipes = table.extra["recipes"]
    assert set(recipes) == set(cfg.systems) - {"eegnet"}
    ds = load_dataset(cfg)
    for system, rec in recipes.items():
        assert rec["subjects"] == ds.names("source")[-cfg.select_subjects :]
        assert not set(rec["subjects"]) & set(ds.names("target"))
        assert [c["recipe"] for c in rec["candidates"]] == list(RECIPE_GRIDS[system])
        best = max(c["val_bacc"] for c in rec["candidates"])
        first_best = next(c for c in rec["candidates"] if c["val_bacc"] == best)
        assert rec["chosen"] == first_best["recipe"], system
    assert "pretrain" in table.extra and table.extra["pretrain"]["mae_mse_position_mean"] > 0


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("bsr", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "held-out subjects:" in out and "P(" in out and "montage B" in out


def test_target_diagnostic_example(tmp_path, run_example, capsys):
    """examples/bsr_targets.py on smoke: what predicting 0, the position mean and a clip-mean
    oracle score on the normalised targets, and the frames' correlation."""
    import json

    out = tmp_path / "t.json"
    run_example("bsr_targets", ["--preset", "smoke", "--out", str(out)])
    from nshot.methods.bsr.config import BsrConfig
    from nshot.methods.bsr.train import split_clips

    r = json.loads(out.read_text())
    train, val = split_clips(
        BsrConfig.from_preset("smoke"), r["clips"]["train"] + r["clips"]["val"]
    )
    assert r["clips"] == {"train": len(train), "val": len(val)}
    assert 0 < r["clip_mean_oracle_mse"] and 0 < r["position_mean_mse"] < r["target_power"]
    assert -1 <= r["adjacent_frame_corr"] <= 1
    assert '"clip_mean_oracle_mse"' in capsys.readouterr().out


def test_pooling_diagnostic_example(tmp_path, run_example):
    """examples/bsr_pooling.py on smoke: the encoder is the reproduction's pretraining task's
    (same held-out MSE) and the band-power column is the reproduction's own row on the same
    subjects and draws (independent paths through experiments)."""
    import json

    from nshot.methods.bsr.config import BsrConfig
    from nshot.methods.bsr.data import load_dataset
    from nshot.methods.bsr.experiments import _run_pretrain, _run_subject

    out = tmp_path / "p.json"
    run_example("bsr_pooling", ["--preset", "smoke", "--out", str(out)])
    r = json.loads(out.read_text())
    cfg = BsrConfig.from_preset("smoke")
    assert r["mae_mse"] == pytest.approx(_run_pretrain(cfg.model_dump())["mae_mse"], abs=1e-9)
    assert r["subjects"] == 1 and r["draws"] == 1
    subject = load_dataset(cfg).names("target")[0]
    row = _run_subject(cfg.model_dump(), "bandpower_lr", cfg.seed, subject)
    for key, cell in r["bacc"].items():
        assert cell["bandpower_lr"] == pytest.approx(row[f"bacc_{key}"], abs=1e-12)
        assert set(cell) == {"bandpower_lr", "pretrained_mean", "pretrained_per_position",
                             "random_mean", "random_per_position"}  # fmt: skip


def test_position_head_reads_each_in_head_position_and_takes_the_pretrained_encoder():
    """head_pool="position": the classifier's logits are its linear layer on the LayerNormed
    time-means of the in-head spatial tokens (computed here by hand from the encoder's last
    block), the pretrained encoder loads into it as into the mean-pooled head, its head gets the
    undecayed lr, and the probe's features are the same read-out."""
    import torch

    from nshot.methods.bsr.config import BsrConfig
    from nshot.methods.bsr.model import (
        PositionClassifier,
        build_classifier,
        build_pretrainer,
        encode,
        layer_decay_groups,
        patch_in_head,
        tokens_per_clip,
    )

    cfg = BsrConfig.from_preset("smoke").replace(head_pool="position")
    torch.manual_seed(0)
    state = build_pretrainer(cfg).videomae.state_dict()
    clf = build_classifier(cfg, state).eval()
    assert isinstance(clf, PositionClassifier)
    mean_clf = build_classifier(cfg.replace(head_pool="mean"), state).eval()
    torch.testing.assert_close(clf.videomae.state_dict(), mean_clf.videomae.state_dict())
    v = torch.randn(
        2, cfg.frames, 3, cfg.grid, cfg.grid, generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        h = clf.videomae(pixel_values=v).last_hidden_state
        t, s = tokens_per_clip(cfg)
        head = patch_in_head(cfg)
        by_hand = [torch.stack([h[b, [ti * s + j for ti in range(t)]].mean(0)
                                for j in range(s) if head[j]]) for b in range(2)]  # fmt: skip
        x = torch.stack([clf.fc_norm(p).flatten() for p in by_hand])
        torch.testing.assert_close(clf(pixel_values=v).logits, clf.classifier(x))
        torch.testing.assert_close(encode(clf, v, cfg), torch.stack([p.flatten() for p in by_hand]))
        torch.testing.assert_close(encode(clf, v), h.mean(1))
    groups = layer_decay_groups(clf, cfg, 1.0, 0.05)
    head_ids = {id(p) for p in (*clf.fc_norm.parameters(), *clf.classifier.parameters())}
    assert all(g["lr"] == 1.0 for g in groups if any(id(p) in head_ids for p in g["params"]))
    assert clf.classifier.in_features == int(head.sum()) * cfg.width


def test_predictor_with_the_position_read_out(trained):
    """A predictor on the same checkpoint with head_pool="position" embeds each trial per
    in-head position (the probe's features) and still answers the example request."""
    from nshot.methods.bsr.model import load_model, patch_in_head
    from nshot.methods.bsr.serve import BsrPredictor
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    model, ckpt_cfg, extra = load_model(load_checkpoint(res.checkpoint, method="bsr"))
    pos = BsrPredictor(model, ckpt_cfg.replace(head_pool="position"), extra)
    req = pos.Request(**pos.example_request())
    ep = pos.one_shot_embeddings(req)
    assert ep.query_emb.shape == (1, int(patch_in_head(cfg).sum()) * cfg.width)
    out = pos(req)
    assert abs(sum(out.probs.values()) - 1.0) < 1e-9 and out.label in {t.label for t in req.support}
    mean = BsrPredictor(model, ckpt_cfg, extra).one_shot_embeddings(req)
    assert mean.query_emb.shape == (1, cfg.width)
