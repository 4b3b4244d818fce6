"""TAIL takes any input a user sends: features of any width up to 4,096, every
coordinate used, standardised from the support set unless the request says not to, the input
contract in the predictor's metadata, and the any-width measurement against nearest centroid
(a tiny version of ``examples/tail_widths.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from nshot.method import get
from nshot.methods.tail.episodes import (
    MixedGaussianModality,
    preprocess_episode,
    span_embedding,
    standardise,
)
from nshot.methods.tail.serve import MAX_FEATURES, TailPredictor
from nshot.train.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def predictor(untrained_tail_checkpoint) -> TailPredictor:
    return get("tail").predictor(load_checkpoint(untrained_tail_checkpoint, method="tail"))


def _body(d: int, seed: int = 0, K: int = 3, shots: int = 2, queries: int = 2) -> dict:
    xs, ys, xq, _ = MixedGaussianModality(d).sample(K, shots, queries, np.random.default_rng(seed))
    return {"support_x": xs.tolist(), "support_y": ys.tolist(), "query_x": xq.tolist()}


def _probs(predictor: TailPredictor, body: dict, **fields) -> np.ndarray:
    ans = predictor(predictor.Request(**body, **fields))
    return np.array([[p[k] for k in sorted(p)] for p in ans.probs])


@pytest.mark.parametrize("d", [1, 7, 16, 17, 300, MAX_FEATURES])
def test_any_width_up_to_the_cap_is_answered(predictor, d):
    body = _body(d, seed=d)
    for standardise_ in (True, False):
        ans = predictor(predictor.Request(**body, standardise=standardise_, n_draws=2))
        assert len(ans.labels) == 6 and ans.n_classes == 3
        p = np.array([list(q.values()) for q in ans.probs])
        assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)


def test_past_the_width_cap_is_a_422_naming_the_field(predictor):
    from nshot.serve.app import ServeOptions, parse_request

    body = {
        "support_x": [[0.0] * 4097, [1.0] * 4097],
        "support_y": [0, 1],
        "query_x": [[0.5] * 4097],
    }
    with pytest.raises(
        ValidationError, match="support_x: rows have 4097 features; .* at most 4096"
    ):
        predictor.Request(**body)
    resp = parse_request(predictor, json.dumps(body).encode(), ServeOptions())
    assert resp.status_code == 422
    detail = json.loads(resp.body)["detail"][0]
    assert detail["field"] == "support_x" and "at most 4096" in detail["msg"]


@pytest.mark.parametrize("wide_inputs", ["span", "subset"])
def test_every_coordinate_of_a_wide_input_counts(untrained_tail_checkpoint, wide_inputs):
    """Changing any single feature of a query turns the query's model input (its direction,
    not only its length) with the default map. With the first design (a random d_data of
    the features per draw) most features only rescale it, which this test detects."""
    ckpt = load_checkpoint(untrained_tail_checkpoint, method="tail")
    base = get("tail").predictor(ckpt)
    pred = TailPredictor(base.model, base.cfg, wide_inputs=wide_inputs)
    d = 1024
    body = _body(d, seed=1, queries=1)
    sy = np.array(body["support_y"])

    def query_input(b: dict) -> np.ndarray:
        sf, qf = pred.features(pred.Request(**b))
        x = pred.model_inputs(sf, sy, qf, np.random.default_rng(0))["query_x"][0, 0]
        x = x.numpy().astype(np.float64)
        return x / np.linalg.norm(x)

    x0 = query_input(body)
    coords = [0, 1, 511, 777, d - 2, d - 1, *np.random.default_rng(0).choice(d, 10).tolist()]
    turned = []
    for j in coords:
        changed = json.loads(json.dumps(body))
        changed["query_x"][0][j] += 10.0 * (1 + abs(changed["query_x"][0][j]))
        turned.append(float(1.0 - query_input(changed) @ x0))
    if wide_inputs == "span":
        assert min(turned) > 1e-8, turned
    else:  # float32 rounding of a rescaled vector: 1 - cos of order 1e-14
        assert sum(t < 1e-11 for t in turned) >= len(coords) // 2, turned


def test_standardise_makes_the_answer_independent_of_feature_scales(predictor):
    body = _body(40, seed=3)
    rng = np.random.default_rng(4)
    scale = 10.0 ** rng.uniform(-4, 4, 40)
    shift = 1e3 * rng.normal(size=40)
    rescaled = {
        **body,
        "support_x": (np.array(body["support_x"]) * scale + shift).tolist(),
        "query_x": (np.array(body["query_x"]) * scale + shift).tolist(),
    }
    on = _probs(predictor, body), _probs(predictor, rescaled)
    assert np.abs(on[0] - on[1]).max() < 1e-4
    off = _probs(predictor, body, standardise=False), _probs(predictor, rescaled, standardise=False)
    assert np.abs(off[0] - off[1]).max() > 1e-3  # the switch is real: unscaled features differ
    assert np.abs(on[0] - off[0]).max() > 1e-6


def test_standardise_rule():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(6, 4)) * [1e-3, 1.0, 1e5, 0.0] + [0.0, 5.0, -1e6, 7.0]
    q = rng.normal(size=(2, 4)) + 3e38 * np.array([[0, 0, 0, 1], [0, 0, 0, 0]])
    zs, zq = standardise(s, q)
    assert np.allclose(zs[:, :3].mean(0), 0.0, atol=1e-9) and np.allclose(zs[:, :3].std(0), 1.0)
    assert (zs[:, 3] == 0).all() and (zq[:, 3] == 0).all()  # constant on the support: 0
    assert np.isfinite(zq).all()


def test_span_embedding_is_an_isometry_of_the_support_and_each_query():
    rng = np.random.default_rng(0)
    s, q = preprocess_episode(rng.normal(size=(10, 300)), rng.normal(size=(4, 300)))
    es, eq = span_embedding(s, q, 64, np.random.default_rng(1))
    assert es.shape == (10, 10) and eq.shape == (4, 10)
    unit = np.sqrt(10 / 300)  # rows go from norm sqrt(d_T) to sqrt(w)

    def dist(a, b):
        return np.linalg.norm(a[:, None] - b[None], axis=-1)

    assert np.abs(dist(es, es) / unit - dist(s, s)).max() < 1e-4
    assert np.abs(dist(eq, es) / unit - dist(q, s)).max() < 1e-4
    perm = rng.permutation(10)  # the support order does not matter
    es2, eq2 = span_embedding(s[perm], q, 64, np.random.default_rng(1))
    assert np.abs(es2 - es[perm]).max() < 1e-4 and np.abs(eq2 - eq).max() < 1e-4
    # more support rows than the model's width: the top principal directions and the residual
    es, eq = span_embedding(s, q, 6, np.random.default_rng(1))
    assert es.shape == (10, 6) and np.allclose(np.linalg.norm(eq, axis=1), np.sqrt(6), atol=1e-4)


def test_wide_answer_does_not_depend_on_the_support_order(predictor):
    """Rows shuffled within each class (the classes' first appearance, which fixes their
    order in the answer and hence ρ's draw, unchanged)."""
    body = _body(500, seed=5, shots=3)  # rows 0-2 class 0, 3-5 class 1, 6-8 class 2
    rng = np.random.default_rng(0)
    perm = np.concatenate([3 * k + rng.permutation(3) for k in range(3)])
    shuffled = {
        **body,
        "support_x": [body["support_x"][i] for i in perm],
        "support_y": [body["support_y"][i] for i in perm],
    }
    assert np.abs(_probs(predictor, body) - _probs(predictor, shuffled)).max() < 1e-4


def test_conformal_embeddings_use_every_coordinate_and_keep_exchangeability(
    predictor, caos_coverage
):
    """`--conformal caos` on wide inputs: a row's feature is the same whether it is a support
    row or a query (a symmetric function of all rows), coordinates beyond ``d_data`` change
    it, and the sets cover over mixed-Gaussian episodes of 500 features."""
    from nshot.serve.conformal import ConformalPredictor

    d = 500
    assert d > predictor.cfg.d_data
    body = _body(d, seed=2, K=3, shots=3, queries=2)
    ref = predictor.one_shot_embeddings(predictor.Request(**body))
    rows = body["support_x"] + body["query_x"]
    emb = np.concatenate([ref.support_emb, ref.query_emb])
    swapped = {  # query 0 joins the support (class 0), support row 1 becomes a query
        "support_x": [rows[9]] + [r for i, r in enumerate(body["support_x"]) if i != 1],
        "support_y": [body["support_y"][0]]
        + [y for i, y in enumerate(body["support_y"]) if i != 1],
        "query_x": [rows[1]] + body["query_x"][1:],
    }
    ep = predictor.one_shot_embeddings(predictor.Request(**swapped))
    order = [9, 0, 2, 3, 4, 5, 6, 7, 8, 1, 10, 11, 12, 13, 14]
    got = np.concatenate([ep.support_emb, ep.query_emb])
    assert np.abs(got - emb[order]).max() < 1e-4
    far = [list(r) for r in rows]
    far[0][d - 1] += 5.0  # a coordinate beyond d_data
    moved = predictor.one_shot_embeddings(predictor.Request(
        support_x=far[:9], support_y=body["support_y"], query_x=far[9:]))  # fmt: skip
    assert np.abs(moved.support_emb[0] - ref.support_emb[0]).max() > 1e-3

    cp = ConformalPredictor(predictor, "caos", alpha=0.2, k=1)
    rng = np.random.default_rng(8)
    episodes = []
    for _ in range(12):
        xs, ys, xq, yq = MixedGaussianModality(d).sample(4, 4, 2, rng)
        req = cp.Request(support_x=xs.tolist(), support_y=ys.tolist(), query_x=xq.tolist())
        episodes.append((req, yq.tolist()))
    caos_coverage(cp, episodes, 0.2)


def test_metadata_states_the_input_contract(predictor):
    meta = json.loads(json.dumps(predictor.metadata()))
    assert meta["max_features"] == MAX_FEATURES == 4096
    contract = meta["input_contract"]
    assert set(contract) >= {"features", "rows", "standardise", "wide_inputs"}
    assert "4096" in contract["features"] and "standard deviation" in contract["standardise"]
    assert f"d_data = {predictor.cfg.d_data}" in contract["wide_inputs"]
    schema = predictor.Request.model_json_schema()["properties"]
    assert (
        schema["standardise"]["default"] is True
        and "support" in schema["standardise"]["description"]
    )


def test_any_width_measurement_tiny(untrained_tail_checkpoint, predictor):
    """The measurement of ``examples/tail_widths.py`` on 4 episodes of two widths, through the
    Serve app's request parser (``nshot.serve.bare``: same parsing as the Serve ingress)."""
    from fastapi.testclient import TestClient

    from nshot.methods.tail.widths import markdown, measure
    from nshot.serve.bare import make_app

    client = TestClient(make_app("tail", str(untrained_tail_checkpoint)))

    def send(body: dict) -> dict:
        r = client.post("/tail/predict", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def in_process(body: dict) -> dict:
        return predictor(predictor.Request(**body)).model_dump(mode="json")

    out = measure(send, (8, 200), 4, variants={"in_process": in_process})
    assert [r["width"] for r in out["widths"]] == [8, 200] and isinstance(out["target_met"], bool)
    for row in out["widths"]:
        acc = row["accuracy"]
        assert acc["tail"] == acc["in_process"]  # HTTP answers equal in-process answers
        assert set(acc) == {"tail", "in_process", "nearest_centroid"}
        assert 0.0 <= acc["tail"]["mean"] <= 1.0 and row["latency_s"]["p50"] > 0
        diff = row["minus_nearest_centroid"]["tail"]["mean"]
        assert abs(diff - (acc["tail"]["mean"] - acc["nearest_centroid"]["mean"])) < 1e-9
    assert out["widths"][1]["accuracy"]["nearest_centroid"]["mean"] > 0.4  # chance is 0.2
    table = markdown(out).splitlines()
    assert table[2].startswith("| 8 | ") and table[3].startswith("| 200 | ")
    assert "| width | in_process |" in table[5]


def test_mixed_training_tasks_are_standardised_episodes_of_model_width():
    """``train_tasks="A+mixed"``: the generated task family of a step (width 8..d_data) and
    its batch, standardised by the support like a request."""
    from nshot.methods.tail.episodes import make_batch
    from nshot.methods.tail.train import _mixed_tasks

    cfg = get("tail").config("smoke", train_tasks="A+mixed")
    rng = np.random.default_rng(0)
    tasks = [_mixed_tasks(cfg, rng) for _ in range(20)]
    assert {t.dim for t in tasks} <= set(range(8, cfg.d_data + 1)) and len(
        {t.dim for t in tasks}
    ) > 1
    batch = make_batch(tasks[0], cfg, batch=3, K=3, shots=2, queries=2, rng=rng, standardised=True)
    sf = batch["support_f"].numpy()
    assert sf.shape == (3, 6, tasks[0].dim) and batch["support_x"].shape == (3, 6, cfg.d_data)
    assert np.allclose(np.linalg.norm(sf, axis=-1), np.sqrt(tasks[0].dim), atol=1e-3)
