"""The Ray Serve application against a real local Serve instance on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from nshot.method import get
from nshot.serve import Client, ServeError
from nshot.train.checkpoint import load_checkpoint

TOKEN = "s3cret-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_session, untrained_tail_checkpoint):
    from ray import serve

    from nshot.serve import start
    from nshot.serve.app import ServeOptions

    path = untrained_tail_checkpoint
    opts = ServeOptions(
        token=TOKEN,
        max_body_bytes=300_000,
        max_items=20_000,
        max_batch_size=8,
        allow_fault_injection=True,
    )
    url = start("tail", path, port=_free_port(), options=opts)
    yield url, get("tail").predictor(load_checkpoint(path))
    serve.shutdown()


def _episode(seed: int, K: int = 3, d: int = 10) -> dict:
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(K, d))
    sx = [(protos[k] + 0.2 * rng.normal(size=d)).tolist() for k in range(K) for _ in range(3)]
    sy = [f"c{k}" for k in range(K) for _ in range(3)]
    qx = [(protos[k % K] + 0.2 * rng.normal(size=d)).tolist() for k in range(6)]
    return {"support_x": sx, "support_y": sy, "query_x": qx, "n_draws": 2, "seed": seed}


def test_health_and_metadata(served):
    url, _ = served
    client = Client(url, token=TOKEN)
    assert client.healthz()["status"] == "ok"
    meta = client.metadata()
    assert meta["method"] == "tail" and meta["checkpoint"]["step"] == 1
    assert "support_x" in meta["request_schema"]["properties"]


def test_served_answer_equals_in_process(served):
    url, predictor = served
    client = Client(url, token=TOKEN)
    for seed in range(3):
        ep = _episode(seed)
        assert client.predict(ep) == predictor(predictor.Request(**ep)).model_dump(mode="json")


def test_concurrent_requests_are_batched_and_still_exact(served):
    url, predictor = served
    client = Client(url, token=TOKEN)
    eps = [_episode(s, K=2 + s % 3) for s in range(24)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(client.predict, eps))
    for ep, ans in zip(eps, answers):
        assert ans == predictor(predictor.Request(**ep)).model_dump(mode="json")


def test_malformed_request_is_422_naming_the_field(served):
    url, _ = served
    client = Client(url, token=TOKEN)
    bad = _episode(0)
    bad["n_draws"] = 99
    with pytest.raises(ServeError) as err:
        client.predict(bad)
    assert err.value.status == 422 and err.value.detail[0]["field"] == "n_draws"
    bad = _episode(0)
    bad["support_y"] = bad["support_y"][:-1]
    with pytest.raises(ServeError) as err:
        client.predict(bad)
    assert err.value.status == 422 and err.value.detail[0]["field"] == "support_y"
    req = urllib.request.Request(url + "/predict", data=b"{not json", method="POST")
    req.add_header("authorization", f"Bearer {TOKEN}")
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, timeout=30)
    assert http_err.value.code == 422


def test_token_is_required(served):
    url, _ = served
    for token in ("", "wrong"):
        with pytest.raises(ServeError) as err:
            Client(url, token=token).predict(_episode(0)) if token else _no_token(url)
        assert err.value.status == 401


def _no_token(url):
    req = urllib.request.Request(url + "/predict", data=json.dumps(_episode(0)).encode())
    try:
        urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        raise ServeError(e.code, None) from None


def test_oversized_request_is_413(served):
    url, _ = served
    big = _episode(0)
    big["query_x"] = big["query_x"] * 900  # 5,400 queries x 10 floats: past the byte cap
    with pytest.raises(ServeError) as err:
        Client(url, token=TOKEN).predict(big)
    assert err.value.status == 413


def test_load_mixed_requests_no_restart(served):
    """1,000 requests at concurrency 16, a tenth malformed: every valid one answered exactly,
    every malformed one a 4xx, the same replica process throughout, nothing hangs."""
    url, predictor = served
    client = Client(url, token=TOKEN, timeout_s=60)
    pid_before = client.healthz()["pid"]
    eps = [_episode(i % 20, K=2 + i % 3) for i in range(20)]
    expected = [predictor(predictor.Request(**e)).model_dump(mode="json") for e in eps]

    def one(i: int):
        if i % 10 == 0:
            bad = dict(eps[i % 20], support_y=[])
            try:
                client.predict(bad)
            except ServeError as err:
                return ("bad", err.status)
            return ("bad", 200)
        return ("ok", client.predict(eps[i % 20]) == expected[i % 20])

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(1000)))
    assert all(r[1] is True for r in results if r[0] == "ok")
    assert all(400 <= r[1] < 500 for r in results if r[0] == "bad")
    assert client.healthz()["pid"] == pid_before


def test_serve_config_yaml_validates():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    path = __import__("pathlib").Path(__file__).parents[1] / "examples" / "serve_config.yaml"
    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    assert [a.name for a in schema.applications] == ["tail", "tail-smoke"]
    assert schema.http_options.host == "127.0.0.1"
    from nshot.serve.app import app_builder

    assert callable(app_builder)


def test_internal_failure_is_500_with_request_id_and_replica_survives(served):
    url, predictor = served
    client = Client(url, token=TOKEN)
    pid = client.healthz()["pid"]
    req = urllib.request.Request(url + "/predict", data=json.dumps(_episode(1)).encode())
    req.add_header("authorization", f"Bearer {TOKEN}")
    req.add_header("x-nshot-inject-fault", "1")
    req.add_header("x-request-id", "req-42")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 500
    assert json.loads(err.value.read()) == {"detail": "internal error", "request_id": "req-42"}
    ep = _episode(1)
    assert client.predict(ep) == predictor(predictor.Request(**ep)).model_dump(mode="json")
    assert client.healthz()["pid"] == pid


def test_conformal_wrapper_serves_prediction_sets(served, untrained_tail_checkpoint):
    """`nshot serve tail --conformal caos --alpha 0.1`: the same answer as in process, plus sets;
    a field error from the wrapper is a 422 naming the field."""
    from ray import serve

    from nshot.serve.app import ServeOptions, build_app
    from nshot.serve.conformal import ConformalPredictor

    url, predictor = served
    opts = ServeOptions(token=TOKEN, conformal="caos", alpha=0.1, conformal_k=2)
    serve.run(
        build_app("tail", untrained_tail_checkpoint, opts),
        name="tail-conformal",
        route_prefix="/tail-conformal",
    )
    try:
        client = Client(url.rsplit("/", 1)[0] + "/tail-conformal", token=TOKEN)
        local = ConformalPredictor(predictor, "caos", 0.1, 2)
        ep = _episode(4)
        got = client.predict(ep)
        assert got == local(local.Request(**ep)).model_dump(mode="json")
        assert got["labels"] == client_plain(url).predict(ep)["labels"]
        assert got["alpha"] == 0.1 and got["k"] == 2 and len(got["sets"]) == len(ep["query_x"])
        assert client.metadata()["predictor"]["conformal"] == {
            "method": "caos",
            "alpha": 0.1,
            "k": 2,
        }
        small = {**ep, "support_x": ep["support_x"][:2] + ep["support_x"][3:4]}
        small["support_y"] = ep["support_y"][:2] + ep["support_y"][3:4]
        small["support_x"], small["support_y"] = small["support_x"][1:], small["support_y"][1:]
        with pytest.raises(ServeError) as err:  # 2 support rows < k + 1 = 3
            client.predict(small)
        assert err.value.status == 422 and err.value.detail[0]["field"] == "support_y"
    finally:
        serve.delete("tail-conformal")


def client_plain(url: str) -> Client:
    return Client(url, token=TOKEN)
