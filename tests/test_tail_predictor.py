"""TAIL's predictor: request validation, label mapping, batching equals one-by-one."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from nshot.method import get
from nshot.train.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def predictor(untrained_tail_checkpoint):
    return get("tail").predictor(load_checkpoint(untrained_tail_checkpoint, method="tail"))


def _episode(seed=0, K=3, shots=2, queries=4, d=12, labels=("a", "b", "c")):
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(K, d))
    sx = np.concatenate([protos[k] + 0.1 * rng.normal(size=(shots, d)) for k in range(K)])
    qx = np.concatenate([protos[k] + 0.1 * rng.normal(size=(1, d)) for k in range(K)] * queries)
    sy = [labels[k] for k in range(K) for _ in range(shots)]
    return {"support_x": sx.tolist(), "support_y": sy, "query_x": qx[:queries].tolist()}


def test_answer_shape_and_labels(predictor):
    req = predictor.Request(**_episode(), n_draws=2)
    ans = predictor(req)
    assert len(ans.labels) == 4 and ans.n_classes == 3
    assert set(ans.labels) <= {"a", "b", "c"}
    for p in ans.probs:
        assert set(p) == {"a", "b", "c"} and abs(sum(p.values()) - 1.0) < 1e-5
    # integer labels come back as integers
    ans_int = predictor(predictor.Request(**_episode(labels=(7, 8, 9))))
    assert set(ans_int.labels) <= {7, 8, 9}


def test_batch_equals_one_by_one(predictor):
    reqs = [predictor.Request(**_episode(seed=s), seed=s, n_draws=2) for s in range(4)]
    reqs.append(predictor.Request(**_episode(seed=9, K=2, labels=("x", "y"))))  # other shape
    batched = predictor.batch(reqs)
    for r, b in zip(reqs, batched):
        single = predictor(r)
        assert single.labels == b.labels
        for p, q in zip(single.probs, b.probs):
            for k in p:
                assert abs(p[k] - q[k]) < 1e-5


def test_default_draws_are_the_checkpoints_eval_draws(predictor):
    """A request without ``n_draws`` averages the checkpoint's ``eval_draws`` draws (what
    ``/metadata`` states), not one draw."""
    pred = type(predictor)(predictor.model, predictor.cfg.model_copy(update={"eval_draws": 3}))
    assert pred.metadata()["default_n_draws"] == 3
    assert "default 3" in pred.metadata()["input_contract"]["draws"]
    body = _episode(seed=4)
    default = pred(pred.Request(**body))
    assert default == pred(pred.Request(**body, n_draws=3))
    assert default != pred(pred.Request(**body, n_draws=1))


def test_draws_batched_into_one_forward_equal_one_at_a_time(predictor, monkeypatch):
    from nshot.methods.tail import serve

    reqs = [predictor.Request(**_episode(seed=s), seed=s, n_draws=5) for s in range(3)]
    together = predictor.batch(reqs)
    monkeypatch.setattr(serve, "DRAW_BATCH_SCORES", 0)  # one draw per forward
    for a, b in zip(together, predictor.batch(reqs)):
        assert a.labels == b.labels
        for p, q in zip(a.probs, b.probs):
            assert all(abs(p[k] - q[k]) < 1e-5 for k in p)


def test_same_seed_same_answer(predictor):
    req = predictor.Request(**_episode(), seed=3)
    assert predictor(req) == predictor(req)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"support_x": [], "support_y": []}, "support set is empty"),
        ({"support_y": ["a"]}, "support_y"),
        ({"query_x": []}, "query_x"),
        ({"support_y": ["a"] * 6}, "at least 2 distinct labels"),
        ({"query_x": [[0.0] * 5]}, "query_x[0]"),
        ({"support_x": [[float("nan")] * 12] * 6}, "NaN"),
        ({"n_draws": 33}, "n_draws"),
        ({"n_draws": None}, "n_draws"),  # leave it out for the default
    ],
)
def test_malformed_requests_name_the_problem(predictor, change, field):
    with pytest.raises(ValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        predictor.Request(**{**_episode(), **change})


def test_more_classes_than_dictionary_is_refused(predictor):
    K = predictor.cfg.dictionary_size + 1
    ep = _episode(K=K, shots=1, labels=tuple(range(K)))
    with pytest.raises(ValueError, match=f"dictionary size M = {K - 1}"):
        predictor(predictor.Request(**ep))


def test_example_request_is_answered_like_a_user_request(predictor):
    import json

    example = predictor.example_request()
    req = predictor.Request.model_validate(json.loads(json.dumps(example)))
    assert len(req.support_x) == 25 and len(req.query_x) == 25 and len(req.support_x[0]) == 64
    assert list(dict.fromkeys(req.support_y)) == [f"digit-{c}" for c in range(5, 10)]
    answer = predictor(req)
    assert answer.n_classes == 5 and len(answer.labels) == 25
    assert predictor.Response.model_validate_json(answer.model_dump_json()) == answer
    assert predictor.batch([req, req])[0] == answer
