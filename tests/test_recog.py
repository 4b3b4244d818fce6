"""recog: config, labels and split, the context graph's invariances (no query-label leakage),
train/resume on two workers, the predictor's 422s over HTTP, experiments and the example."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nshot.method import ConfigError, get


def test_config_validation_names_the_field():
    recog = get("recog")
    for field, bad in (("active_pact", 20.0), ("shots", [0]), ("system", "gsmeta"),
                       ("n_aux", 0), ("track", "tox21")):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            recog.config("small", **{field: bad})
    assert recog.config("small").active_pact == 7.0 and recog.config("small").fetch_data
    assert not recog.config("smoke").fetch_data and recog.config("smoke").track == "synthetic"


def test_pact_threshold_and_constrained_split():
    from nshot.methods.recog.data import binarise, choose_split

    # y = -log10(activity in nM): 100 nM is y = -2, pAct = 7 (active at the threshold)
    y = np.array([-2.0, -2.01, 1.0, -6.0])
    assert binarise(y + 9.0, 7.0).tolist() == [1.0, 0.0, 1.0, 0.0]
    names = [f"T{i}" for i in range(10)]
    shared = np.zeros((10, 10))
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):  # T8, T9 share nothing with anyone
        shared[a, b] = shared[b, a] = 50
    splits = set()
    for seed in range(6):
        test = choose_split(names, shared, 3, 30, seed, must=("T0",), one_of=("T2", "T3"))
        assert "T0" in test and len({"T2", "T3"} & set(test)) >= 1 and len(test) == 3
        assert "T8" not in test and "T9" not in test
        train = [i for i, n in enumerate(names) if n not in test]
        assert all(shared[names.index(n), train].max() >= 30 for n in test)
        splits.add(tuple(test))
    assert len(splits) > 1  # drawn by seed
    with pytest.raises(ValueError, match="no split"):
        choose_split(names, shared, 9, 30, 0)


def test_real_targets_have_both_classes_and_test_targets_have_partners():
    """Runs where MoleculeACE's wheel is in the cache (NSHOT_CACHE=~/.cache/nshot after a
    small reproduction); skipped in an isolated test cache."""
    from nshot.data.wheels import MOLECULEACE, wheel_available
    from nshot.methods.recog.data import class_balance, moleculeace_long, track_for

    if not wheel_available(MOLECULEACE):
        pytest.skip("MoleculeACE's wheel is not in this cache (nshot reproduce recog fetches it)")
    cfg = get("recog").config("small", fetch_data=False)
    balance = class_balance(moleculeace_long(False), cfg.active_pact)
    assert len(balance) == 30
    assert all(0.05 <= f <= 0.95 for f in balance.values()), balance
    track = track_for(cfg)
    assert "CHEMBL237_Ki" in track.record["test_targets"]
    assert {"CHEMBL238_Ki", "CHEMBL239_EC50"} & set(track.record["test_targets"])
    assert all(track.record["partners"][t] for t in track.record["test_targets"])


@pytest.fixture(scope="module")
def smoke():
    from nshot.methods.recog.data import track_for
    from nshot.methods.recog.train import fit_model

    cfg = get("recog").config("smoke")
    track = track_for(cfg)
    torch.set_num_threads(1)
    return cfg, track, fit_model(cfg.replace(steps=30), track, "recog").eval()


def test_no_query_label_leakage_but_support_labels_matter(smoke):
    """Flipping the queries' labels in the label matrix changes nothing (bit for bit);
    flipping the support's labels does change the predictions (the check can fail)."""
    from nshot.methods.recog.data import make_episode, sample_episode
    from nshot.methods.recog.evaluation import leakage_max_abs_diff, model_system

    cfg, track, model = smoke
    assert leakage_max_abs_diff(model, track, cfg) == 0.0
    t = track.test_targets[0]
    ep = sample_episode(track, t, 1, 16, np.random.default_rng(3), n_aux=cfg.n_aux,
                        n_distractors=cfg.n_distractors, stratified=True)  # fmt: skip
    ep2 = make_episode(track, t, np.array([track.smiles.index(s) for s in ep.smiles_s]),
                       np.array([track.smiles.index(s) for s in ep.smiles_q]), ep.aux)  # fmt: skip
    ep2.ys = 1.0 - ep2.ys
    system = model_system(model)
    assert np.abs(system(ep)[0] - system(ep2)[0]).max() > 0


def test_queries_do_not_see_each_other_and_gates_are_deterministic(smoke):
    from nshot.methods.recog.data import sample_episode
    from nshot.methods.recog.evaluation import model_system

    cfg, track, model = smoke
    ep = sample_episode(track, track.test_targets[1], 1, 8, np.random.default_rng(5),
                        n_aux=cfg.n_aux, n_distractors=cfg.n_distractors)  # fmt: skip
    system = model_system(model)
    probs, gates = system(ep)
    assert gates is not None and gates.shape == (len(ep.aux),) and np.all((gates > 0) & (gates < 1))
    assert np.array_equal(system(ep)[1], gates)  # π_a at test, no Gumbel noise
    one = ep.__class__(**{**ep.__dict__, "xq": ep.xq[2:3], "yq": ep.yq[2:3], "lq": ep.lq[2:3],
                          "smiles_q": ep.smiles_q[2:3]})  # fmt: skip
    assert np.allclose(system(one)[0], probs[2:3], atol=1e-6)


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("recog-runs")
    cfg = get("recog").config("smoke")
    res = fit("recog", cfg, scaling=Scaling(workers=0), storage=storage, name="one")
    return storage, cfg, res


def test_trains_on_two_ray_train_workers(trained):
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, _ = trained
    res = fit("recog", cfg.replace(steps=10, checkpoint_every=10), scaling=Scaling(workers=2),
              storage=storage, name="two")  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="recog")
    assert ckpt.step == 10 and 0.0 <= ckpt.metrics["val_auc"] <= 1.0
    pred = get("recog").predictor(ckpt)
    answer = pred(pred.Request.model_validate(pred.example_request()))
    assert len(answer.probs) == 3


def test_predictor_answers_and_refuses_bad_input_with_422(trained):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app

    _, _, res = trained
    good = {"support": [{"smiles": "Oc1ccccc1", "label": 1}, {"smiles": "CCO", "label": 0}],
            "query": ["Oc1ccc(Cl)cc1", "CCCC"]}  # fmt: skip
    with TestClient(make_app("recog", str(res.checkpoint))) as client:
        ok = client.post("/recog/predict", json={**good, "aux_labels": {"CCO": {"fr_NH0": 1}}})
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert len(body["probs"]) == 2 and all(0 <= p <= 1 for p in body["probs"])
        assert body["n_aux"] == len(body["gates"]) == 4
        assert body["aux_source"]["given"] <= 1 and body["aux_source"]["missing"] == 0
        cases = {
            "support[1].smiles": {**good, "support": [good["support"][0],
                                                      {"smiles": "C1CC(", "label": 0}]},
            "query[1]": {**good, "query": ["CCO", "xyz"]},
            "support": {**good, "support": []},
            "query": {**good, "query": []},
            "support[0].label": {**good, "support": [{"smiles": "CCO", "label": 2},
                                                     {"smiles": "CCN", "label": 0}]},
        }  # fmt: skip
        for field, body in cases.items():
            got = client.post("/recog/predict", json=body)
            assert got.status_code == 422, (field, got.text)
            assert got.json()["detail"][0]["field"] == field, (field, got.json())
        one_class = {**good, "support": [{"smiles": "CCO", "label": 1},
                                         {"smiles": "CCN", "label": 1}]}  # fmt: skip
        got = client.post("/recog/predict", json=one_class)
        assert got.status_code == 422 and "each class" in got.text
        for aux, word in (({"CCO": {"not_a_property": 1}}, "not_a_property"),
                          ({"CCO": {"fr_NH0": 3}}, "0 or 1"),
                          ({"CCCCO": {"fr_NH0": 1}}, "not a SMILES")):  # fmt: skip
            got = client.post("/recog/predict", json={**good, "aux_labels": aux})
            assert got.status_code == 422 and word in got.text, got.text
            assert got.json()["detail"][0]["field"] == "aux_labels"
        strict = {**good, "support": [{"smiles": "CCO", "label": True},
                                      {"smiles": "CCN", "label": 0}]}  # fmt: skip
        assert client.post("/recog/predict", json=strict).status_code == 422


def test_experiments_on_smoke_have_every_row_metric_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.claims import evaluate
    from nshot.methods.recog.experiments import METRICS, SYSTEMS

    recog = get("recog")
    table = recog.experiments(recog.config("smoke"), tmp_path)
    assert list(table.rows) == list(SYSTEMS) and set(table.metrics) == set(METRICS)
    assert table.rows["recog"]["gate_auc"] is not None
    assert table.rows["fp_logreg"]["gate_auc"] is None
    assert table.rows["fp_logreg"]["distractor_drop"] is None
    assert table.rows["context_graph"]["distractor_drop"] is not None
    assert (tmp_path / "recog.png").is_file()
    results = table.to_json()
    assert results["extra"]["synthetic"]["split"]["test_targets"]
    claims = {c["id"]: c for c in evaluate(recog.claims, results)}
    assert claims["no_query_label_leakage"]["holds"] is True
    assert all(
        c.get("applies") is False for k, c in claims.items() if k != "no_query_label_leakage"
    )


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("recog", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "held-out targets:" in out and "P(phenol-like | Oc1ccc(Cl)cc1)" in out
    assert "auxiliary labels:" in out


def test_conformal_sets_wrap_the_predictor(trained):
    """`nshot serve recog --conformal caos`: the encoder's per-molecule embeddings give CAOS
    prediction sets over the classes 0 and 1."""
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, _, res = trained
    inner = get("recog").predictor(load_checkpoint(res.checkpoint, method="recog"))
    wrapped = ConformalPredictor(inner, alpha=0.2)
    phenols = ["Oc1ccccc1", "Cc1ccc(O)cc1", "Oc1ccc(Cl)cc1", "Oc1cccc(C)c1", "Oc1ccc(N)cc1"]
    others = ["CCO", "CCN(CC)CC", "CCOC(C)=O", "CCCCCC", "CC(C)O"]
    support = [{"smiles": s, "label": 1} for s in phenols] + [
        {"smiles": s, "label": 0} for s in others
    ]
    req = wrapped.Request.model_validate({"support": support, "query": ["Oc1ccccc1C", "CCCO"]})
    answer = wrapped(req)
    assert len(answer.sets) == 2 and all(set(s) <= {0, 1} for s in answer.sets)
    assert (
        answer.probs
        == inner(
            inner.Request.model_validate({"support": support, "query": ["Oc1ccccc1C", "CCCO"]})
        ).probs
    )


def test_conformal_sets_over_held_out_targets_cover(trained, caos_coverage):
    """CAOS sets on recog's embeddings cover held-out targets' exchangeable queries at 1 - alpha."""
    from nshot.methods.recog.data import track_for
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, cfg, res = trained
    inner = get("recog").predictor(load_checkpoint(res.checkpoint, method="recog"))
    cp = ConformalPredictor(inner, "caos", alpha=0.2, k=1)
    track = track_for(cfg)
    rng = np.random.default_rng(7)
    episodes = []
    for _ in range(16):
        # 8 molecules of each class of one held-out target, shuffled: the first 12 are the
        # support, the other 4 the queries (exchangeable; the support keeps >= 4 of each class)
        t = int(rng.choice(track.test_targets))
        mols = track.labelled(t)
        y = track.labels[mols, t]
        pick = rng.permutation(np.concatenate(
            [rng.choice(mols[y == c], 8, replace=False) for c in (0, 1)]))  # fmt: skip
        label = [int(track.labels[i, t]) for i in pick]
        body = {"support": [{"smiles": track.smiles[i], "label": c}
                            for i, c in zip(pick[:12], label[:12])],
                "query": [track.smiles[i] for i in pick[12:]]}  # fmt: skip
        episodes.append((cp.Request.model_validate(body), label[12:]))
    caos_coverage(cp, episodes, 0.2, informative=2)  # not every set is {0, 1}


def test_the_paper_presets_gin_encoder_trains_and_predicts(smoke):
    """encoder=gin (the paper preset's molecule encoder) on the molecular graphs."""
    from nshot.methods.recog.data import sample_episode
    from nshot.methods.recog.evaluation import model_system
    from nshot.methods.recog.train import fit_model

    cfg, track, _ = smoke
    gin = cfg.replace(encoder="gin", gin_layers=2, steps=3)
    model = fit_model(gin, track, "recog")
    ep = sample_episode(track, track.test_targets[0], 1, 6, np.random.default_rng(1),
                        n_aux=gin.n_aux, n_distractors=gin.n_distractors)  # fmt: skip
    probs, gates = model_system(model)(ep)
    assert probs.shape == (len(ep.yq),) and np.all((probs > 0) & (probs < 1))
    assert gates is not None
