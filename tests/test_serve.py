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
    # the predictor's input contract reaches /metadata (any width up to 4,096, standardised)
    assert meta["predictor"]["max_features"] == 4096 and meta["predictor"]["input_contract"]


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
    req.add_header("content-type", "application/json")
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
    req.add_header("content-type", "application/json")
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


# ---------------------------------------------------------------------------------- hostile bodies


def _post(url: str, body: bytes | str, content_type: str | None = "application/json", **headers):
    """POST ``body`` as is; returns (status, decoded answer or raw text)."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    req = urllib.request.Request(url + "/predict", data=data, method="POST")
    req.add_header("authorization", f"Bearer {TOKEN}")
    if content_type is not None:
        req.add_header("content-type", content_type)
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw.decode(errors="replace")


def _field(answer) -> str | None:
    return answer["detail"][0]["field"]


def _body_with(ep: dict, key: str, raw_value: str) -> str:
    """The JSON of ``ep`` with ``key``'s value replaced by ``raw_value`` (JSON text as is)."""
    return json.dumps({**ep, key: "@@"}).replace('"@@"', raw_value)


def test_deep_nesting_huge_floats_and_surrogates_are_422_naming_the_field(served):
    """Were 500s: a body nested 2,000 levels (RecursionError), numbers past float32 ('Out of
    range float values are not JSON compliant' when the answer was encoded), a label with an
    unpaired surrogate (UnicodeEncodeError)."""
    url, _ = served
    ep = _episode(0)
    deep = "[" * 2000 + "]" * 2000
    status, ans = _post(url, _body_with(ep, "support_x", deep))
    assert status == 422 and _field(ans).startswith("support_x"), (status, ans)
    status, ans = _post(url, _body_with(ep, "support_x", "[" * 70 + "]" * 70))
    assert status == 422 and _field(ans).startswith("support_x.0.0"), (status, ans)
    for big in ("1e39", "3.5e38", "1e308", "-1e39", "Infinity", "NaN"):
        rows = json.dumps(ep["support_x"]).replace(str(ep["support_x"][1][2]), big, 1)
        status, ans = _post(url, _body_with(ep, "support_x", rows))
        assert status == 422 and _field(ans) == "support_x.1.2", (big, status, ans)
    labels = json.dumps(ep["support_y"]).replace('"c0"', '"\\ud800"', 1)
    status, ans = _post(url, _body_with(ep, "support_y", labels))
    assert status == 422 and _field(ans) == "support_y.0", (status, ans)
    status, ans = _post(url, _body_with(ep, "seed", str(2**70)))
    assert status == 422 and _field(ans) == "seed", (status, ans)
    # float32's own largest values are accepted, and answered with finite probabilities
    big = {**ep, "support_x": [[v * 3.4e37 for v in row] for row in ep["support_x"]]}
    status, ans = _post(url, json.dumps(big))
    assert status == 200 and all(0 <= p <= 1 for q in ans["probs"] for p in q.values())


def test_labels_are_one_type_per_request(served):
    """`1` and `"1"` were one class with two slots ({"1": 0.56} and n_classes 2)."""
    url, predictor = served
    ep = _episode(0)
    mixed = {**ep, "support_y": [1, "1", 1, "1", 2, 2, 1, "1", 2]}
    status, ans = _post(url, json.dumps(mixed))
    assert status == 422 and _field(ans) == "support_y", (status, ans)
    assert "mix" in ans["detail"][0]["msg"]
    ints = {**ep, "support_y": [0, 0, 0, 1, 1, 1, 2, 2, 2]}
    status, ans = _post(url, json.dumps(ints))
    assert status == 200 and ans["n_classes"] == 3 and set(ans["probs"][0]) == {"0", "1", "2"}
    assert ans == predictor(predictor.Request(**ints)).model_dump(mode="json")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('"0.5"', "support_x.0.0"),
        ("true", "support_x.0.0"),
        ('" 1 "', "support_x.0.0"),
        ('"1_000"', "support_x.0.0"),
        ("null", "support_x.0.0"),
    ],
)
def test_strings_and_booleans_in_numeric_arrays_are_422(served, raw, field):
    url, _ = served
    ep = _episode(0)
    rows = json.dumps(ep["support_x"]).replace(str(ep["support_x"][0][0]), raw, 1)
    status, ans = _post(url, _body_with(ep, "support_x", rows))
    assert status == 422 and _field(ans) == field, (status, ans)


def test_unknown_fields_duplicate_keys_and_lax_scalars_are_422(served):
    url, _ = served
    ep = _episode(0)
    for body, field in [
        (json.dumps({**ep, "n_drawz": 3}), "n_drawz"),  # a typo was silently ignored
        (json.dumps(ep)[:-1] + ', "n_draws": 3}', "n_draws"),  # a duplicate key
        (json.dumps({**ep, "n_draws": True}), "n_draws"),
        (json.dumps({**ep, "n_draws": 2.0}), "n_draws"),
        (json.dumps({**ep, "seed": "1"}), "seed"),
        (json.dumps({**ep, "support_y": [True, False] * 4 + [True]}), "support_y.0"),
    ]:
        status, ans = _post(url, body)
        assert status == 422 and (_field(ans) or "").startswith(field), (body[-40:], status, ans)


def test_only_application_json_is_accepted(served):
    """Valid JSON sent as text/plain, image/png, a form or multipart was answered 200."""
    url, predictor = served
    ep = _episode(0)
    body = json.dumps(ep)
    for ctype in (
        None,
        "text/plain",
        "image/png",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ):
        status, ans = _post(url, body, content_type=ctype)
        assert status == 415 and "application/json" in ans["detail"], (ctype, status, ans)
    want = predictor(predictor.Request(**ep)).model_dump(mode="json")
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        assert _post(url, body, content_type=ctype) == (200, want)


def test_docs_and_openapi_need_the_token(served):
    """/tail/docs, /tail/openapi.json and /tail/redoc answered without the token."""
    url, _ = served
    for path in ("/docs", "/redoc", "/openapi.json"):
        req = urllib.request.Request(url + path)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401, path
        req.add_header("authorization", f"Bearer {TOKEN}")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
            text = r.read().decode()
        if path == "/openapi.json":
            assert "/predict" in json.loads(text)["paths"]
        else:
            assert f"{url.rsplit('/', 1)[1]}/openapi.json" in text  # the prefixed schema URL
    root = url.rsplit("/", 1)[0]
    for path in ("/openapi.json", "/docs"):  # nothing is served outside the prefix
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(root + path, timeout=30)
        assert err.value.code in (401, 404), path


def _nan_weights_checkpoint(src, dst):
    """A copy of checkpoint ``src`` at ``dst`` whose weights hold a NaN, with matching hashes
    (what an attacker who can write the directory, or a diverged run, leaves behind)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from nshot.hashing import sha256_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(dst / "model.safetensors"))
    state = json.loads((dst / "state.json").read_text())
    state["files"]["model.safetensors"] = sha256_file(dst / "model.safetensors")
    (dst / "state.json").write_text(json.dumps(state))
    assert not all(bool(torch.isfinite(v).all()) for v in weights.values())
    return dst


def test_a_checkpoint_that_cannot_be_served_fails_before_deploying(
    untrained_tail_checkpoint, tmp_path, capsys
):
    """Was `RuntimeError: Deploying application tail failed` and a traceback from the replica;
    now the one-line error of `nshot eval`, raised in the caller, and `nshot serve` exits 2."""
    from nshot import cli
    from nshot.method import NshotError
    from nshot.serve.app import ServeOptions, build_app

    bad = _nan_weights_checkpoint(untrained_tail_checkpoint, tmp_path / "nan")
    with pytest.raises(NshotError) as err:
        build_app("tail", bad, ServeOptions())
    msg = str(err.value)
    assert "\n" not in msg and ("finite" in msg or "NaN" in msg), msg
    rc = cli.main(["serve", "tail", "--checkpoint", str(bad), "--port", str(_free_port())])
    err_text = capsys.readouterr().err  # (Ray's log lines of other tests may stream in too)
    lines = [line for line in err_text.splitlines() if "nshot" in line and "Replica" not in line]
    assert rc == 2 and "Traceback" not in err_text, err_text
    assert len(lines) == 1 and lines[0].startswith("nshot: error: checkpoint "), lines
    with pytest.raises(NshotError, match="unknown method|nosuch"):
        build_app("nosuch", untrained_tail_checkpoint, ServeOptions())


def test_healthz_reports_a_replica_that_failed_to_load(served, untrained_tail_checkpoint, tmp_path):
    """A replica whose checkpoint does not load says so: /healthz is 503 with the error, never
    ok, and /predict is 503 too (the deployment is made without build_app's check)."""
    from dataclasses import asdict

    from ray import serve

    from nshot.serve.app import MethodServer, ServeOptions

    url, _ = served
    bad = _nan_weights_checkpoint(untrained_tail_checkpoint, tmp_path / "nan")
    app = MethodServer.options(max_constructor_retry_count=1).bind(
        "tail", str(bad), asdict(ServeOptions(token=TOKEN))
    )
    serve.run(app, name="tail-broken", route_prefix="/tail-broken")
    try:
        broken = url.rsplit("/", 1)[0] + "/tail-broken"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(broken + "/healthz", timeout=30)
        assert err.value.code == 503
        health = json.loads(err.value.read())
        assert health["status"] == "error" and str(bad) in health["detail"]
        status, ans = _post(broken, json.dumps(_episode(0)))
        assert status == 503 and "failed to load" in ans["detail"]
    finally:
        serve.delete("tail-broken")


# --------------------------------------------------------------- without Ray: models and answers


def _request_models(model, seen=None) -> set:
    """``model`` and every pydantic model nested in its fields."""
    import typing

    from pydantic import BaseModel

    seen = set() if seen is None else seen
    if model in seen:
        return seen
    seen.add(model)
    stack = [f.annotation for f in model.model_fields.values()]
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            _request_models(t, seen)
        stack.extend(typing.get_args(t))
    return seen


def test_every_request_model_of_every_method_is_strict():
    """Strings and booleans passed for numbers, unknown fields were silently accepted."""
    import importlib
    import importlib.util

    from pydantic import BaseModel, ValidationError

    from nshot.method import available

    names = [m for m in available() if importlib.util.find_spec(f"nshot.methods.{m}.serve")]
    assert len(names) >= 11, names
    for name in names:
        mod = importlib.import_module(f"nshot.methods.{name}.serve")
        roots = [
            v
            for k, v in vars(mod).items()
            if k.endswith("Request") and isinstance(v, type) and issubclass(v, BaseModel)
        ]
        assert roots, name
        for root in roots:
            for model in _request_models(root):
                cfg = model.model_config
                assert cfg.get("strict") is True and cfg.get("extra") == "forbid", (name, model)
            with pytest.raises(ValidationError) as err:
                root.model_validate({"n_drawz": 1})
            assert any(e["type"] == "extra_forbidden" for e in err.value.errors()), name


def test_conformal_request_is_strict_too(untrained_tail_checkpoint):
    from pydantic import ValidationError

    from nshot.serve.conformal import ConformalPredictor

    pred = ConformalPredictor(get("tail").predictor(load_checkpoint(untrained_tail_checkpoint)))
    ep = _episode(0)
    pred.Request.model_validate({**ep, "conformal_alpha": 0.2})
    for bad, field in [
        ({"conformal_alpha": "0.2"}, "conformal_alpha"),
        ({"conformal_alpha": True}, "conformal_alpha"),
        ({"conformal_alhpa": 0.2}, "conformal_alhpa"),
    ]:
        with pytest.raises(ValidationError) as err:
            pred.Request.model_validate({**ep, **bad})
        assert err.value.errors()[0]["loc"][0] == field


def test_an_answer_that_is_not_json_is_a_clean_500(untrained_tail_checkpoint, monkeypatch):
    """A NaN/inf or an unpaired surrogate in an answer made the JSON encoder raise (a bare 500
    'Internal Server Error', or a 200 whose body was not UTF-8); now a JSON 500 with an id."""
    from fastapi.testclient import TestClient

    from nshot.methods.tail.serve import TailPredictor, TailResponse
    from nshot.serve.bare import make_app

    client = TestClient(make_app("tail", str(untrained_tail_checkpoint)))
    for answer in (
        TailResponse(labels=["c0"], probs=[{"c0": float("nan")}], n_classes=1),
        TailResponse(labels=["c0"], probs=[{"c0": float("inf")}], n_classes=1),
        TailResponse(labels=["\ud800"], probs=[{"c0": 1.0}], n_classes=1),
    ):
        monkeypatch.setattr(TailPredictor, "__call__", lambda self, r, a=answer: a)
        r = client.post("/tail/predict", json=_episode(0))
        assert r.status_code == 500, r.text
        body = json.loads(r.content.decode("utf-8"))
        assert body["detail"].startswith("internal error") and body["request_id"]


# ------------------------------------------------------------------------------ under load, no Ray


class _Scripted:
    """A real HTTP server on 127.0.0.1 (``http.server`` in a thread) that answers each POST with
    the next ``(status, headers)`` of its script (then 200), recording when each came."""

    def __init__(self, script):
        import http.server
        import threading
        import time

        self.script, self.times = list(script), []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.times.append(time.monotonic())
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                body = b'{"ok": true}' if status == 200 else b'{"detail": "busy"}'
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_client_retries_503_with_retry_after_and_gives_up_after_its_bound():
    busy = (503, {"Retry-After": "0"})
    srv = _Scripted([busy, busy])
    try:
        client = Client(srv.url, retries=3)
        assert client.predict({"x": 1}) == {"ok": True} and client.attempts == 3
        srv.script = [busy] * 5
        client = Client(srv.url, retries=2)
        with pytest.raises(ServeError) as err:
            client.predict({"x": 1})
        assert err.value.status == 503 and err.value.retry_after_s == 0 and client.attempts == 3
        # a 503 without Retry-After (a replica that failed to load) is not retried
        srv.script = [(503, {})]
        client = Client(srv.url, retries=3)
        with pytest.raises(ServeError):
            client.predict({"x": 1})
        assert client.attempts == 1
        # the delay asked for is honoured (Retry-After: 1, whole seconds as Serve sends it)
        srv.script, srv.times = [(503, {"Retry-After": "1"})], []
        assert Client(srv.url).predict({"x": 1}) == {"ok": True}
        assert len(srv.times) == 2 and srv.times[1] - srv.times[0] >= 0.95
    finally:
        srv.close()


def test_retry_after_accepts_seconds_and_http_dates():
    from nshot.serve.client import retry_after_seconds

    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    now = 1_700_000_000.0
    assert retry_after_seconds("Tue, 14 Nov 2023 22:13:25 GMT", now=now) == pytest.approx(5.0)


def test_bench_load_counts_statuses_and_keeps_connections():
    from nshot.bench import _load

    srv = _Scripted([(503, {"Retry-After": "1"})] * 3)
    try:
        r = _load(srv.url + "/p", b"{}", clients=4, requests=20)
    finally:
        srv.close()
    # 4 warm-up requests (untimed) took 3 of the 503s; 20 timed requests, 19 or 20 answered
    assert r["requests"] == 20 and r["statuses"].get("200", 0) + r["statuses"].get("503", 0) == 20
    assert r["ok"] == r["statuses"]["200"] >= 19 and r["requests_per_s"] > 0


def test_ingress_modes_are_refused_before_anything_starts(monkeypatch, tmp_path, capsys):
    from nshot import cli
    from nshot.errors import NshotError
    from nshot.serve import ingress

    with pytest.raises(NshotError, match="token"):
        ingress.check("haproxy", None)
    with pytest.raises(NshotError, match="choose one of"):
        ingress.check("nginx", "t")
    # the binary is looked for, and its absence said clearly
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(tmp_path / "no-haproxy"))
    with pytest.raises(NshotError, match="HAProxy binary"):
        ingress.check("haproxy", "t")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH")
    # a Ray that already runs keeps the mode it was started with
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    for k in ingress._ALL:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(NshotError, match="already running"):
        ingress.prepare("direct", None)
    assert ingress.prepare("proxy", None) == {}
    assert ingress.default_mode() == "proxy"  # what that Ray was started with
    monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    assert ingress.default_mode() == "direct" and ingress.DEFAULT == "direct"
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS")
    assert ingress.mode_of({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}) == "throughput"
    for mode in ingress.MODES:  # what prepare() puts in the environment gives that mode
        assert (
            ingress.mode_of({**dict.fromkeys(ingress._ALL, "0"), **ingress.SWITCHES[mode]}) == mode
        )
    assert ingress.mode_of({"RAY_SERVE_ENABLE_HA_PROXY": "1"}) == "haproxy"

    started = []
    monkeypatch.setattr("nshot.serve.start", lambda *a, **k: started.append(k))
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.delenv("NSHOT_SERVE_TOKEN", raising=False)
    argv = ["serve", "tail", "--checkpoint", str(tmp_path), "--ingress", "haproxy"]
    assert cli.main([*argv, "--port", str(_free_port())]) == 2 and not started
    assert "--ingress haproxy binds" in capsys.readouterr().err


def test_direct_ingress_drains_for_nshots_period_unless_told(monkeypatch):
    """Serve's 30 s draining period under direct ingress (every Ctrl-C of `nshot serve` waited
    it out) becomes nshot's DRAIN_S; --drain-s or the user's own variable win; proxy has none."""
    import os

    import ray

    from nshot.errors import NshotError
    from nshot.serve import ingress

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    monkeypatch.setattr(os, "environ", env)  # prepare() writes the environment Ray inherits
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as before nshot starts Ray
    key = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
    env.pop(key, None)
    assert ingress.prepare("direct", None)[key] == str(ingress.DRAIN_S) == env[key] == "2.0"
    assert ingress.prepare("throughput", None, drain_s=0.5)[key] == env[key] == "0.5"
    env[key] = "45"  # a user's own setting is kept
    assert key not in ingress.prepare("direct", None) and env[key] == "45"
    assert ingress.prepare("direct", None, drain_s=30)[key] == "30.0"
    env.pop(key)
    assert key not in ingress.prepare("proxy", None) and key not in env
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(NshotError, match="--drain-s"):
            ingress.prepare("direct", None, drain_s=bad)
    env["RAY_ADDRESS"] = "127.0.0.1:1"  # a running Ray: the period cannot be set any more
    env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    assert ingress.prepare("direct", None) == {}
    with pytest.raises(NshotError, match="--drain-s 5.0: Ray is already running"):
        ingress.prepare("direct", None, drain_s=5.0)


def test_sigterm_is_handled_from_the_serving_line_on(monkeypatch, untrained_tail_checkpoint):
    """A supervisor that sends SIGTERM as soon as `nshot serve` says it is serving gets a clean
    shutdown: the handler is in place when that line is printed (it was installed after it, and
    a SIGTERM in between aborted the process through Ray's handler), and put back afterwards."""
    import signal

    from nshot import cli

    at_print = []

    class Console:
        def print(self, *a, **k):
            at_print.append(signal.getsignal(signal.SIGTERM))

    url = "http://127.0.0.1:8000/tail"
    monkeypatch.setattr("nshot.serve.start", lambda *a, **k: url)
    monkeypatch.setattr(cli, "_console", Console)
    in_loop = []
    monkeypatch.setattr(cli, "_serve_until_stopped", lambda prev: in_loop.append(prev) or 0)
    before = signal.getsignal(signal.SIGTERM)
    argv = ["serve", "tail", "--checkpoint", str(untrained_tail_checkpoint), "--ingress", "proxy"]
    try:
        assert cli.main([*argv, "--port", str(_free_port())]) == 0
        assert at_print and at_print[0] not in (before, signal.SIG_DFL, signal.SIG_IGN)
        with pytest.raises(KeyboardInterrupt):  # SIGTERM now does what Ctrl-C does
            at_print[0](signal.SIGTERM, None)
        assert in_loop == [before]  # the handler it replaced, restored when serving ends
    finally:
        signal.signal(signal.SIGTERM, before)


def test_past_capacity_is_a_prompt_503_with_retry_after_and_the_client_retries(
    served, untrained_tail_checkpoint
):
    """A replica that takes 2 requests at once (max_batch_size 1) and a proxy that queues 1
    more: of 8 requests held 1.5 s each, those past capacity are answered 503 with
    `Retry-After: 1` at once (not after a back-off), the admitted ones are answered; the client
    then gets its answer by retrying."""
    import time

    from ray import serve

    from nshot.serve.app import ServeOptions, build_app

    url, predictor = served
    opts = ServeOptions(
        token=TOKEN,
        max_batch_size=1,
        max_ongoing_requests=1,
        max_queued_requests=1,
        allow_fault_injection=True,
    )
    serve.run(
        build_app("tail", untrained_tail_checkpoint, opts),
        name="tail-capacity",
        route_prefix="/tail-capacity",
    )
    base = url.rsplit("/", 1)[0] + "/tail-capacity"
    ep = _episode(3)

    def held(_):
        req = urllib.request.Request(base + "/predict", data=json.dumps(ep).encode())
        req.add_header("authorization", f"Bearer {TOKEN}")
        req.add_header("content-type", "application/json")
        req.add_header("x-nshot-inject-delay-ms", "1500")
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, None, time.perf_counter() - t, t
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("retry-after"), time.perf_counter() - t, t

    try:
        with ThreadPoolExecutor(8) as pool:
            out = list(pool.map(held, range(8)))
        busy = [o for o in out if o[0] == 503]
        served_ = [o for o in out if o[0] == 200]
        assert {o[0] for o in out} == {200, 503}, out
        # 3 fit at once (Serve's router may refuse one more while a queued request is being
        # assigned). On a loaded machine the 8 threads may send over more than the 1.5 s hold:
        # a request sent after the first answer came back may be admitted in the freed slot,
        # so the bound counts those sent before the first answer.
        first_done = min(t + dt for _, _, dt, t in served_)
        assert 1 <= sum(t < first_done for _, _, _, t in served_) <= 3, out
        assert all(o[1] == "1" and o[2] < 1.0 for o in busy), busy
        expected = predictor(predictor.Request(**ep)).model_dump(mode="json")
        clients = [Client(base, token=TOKEN, retries=10) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda c: c.predict(ep), clients))
        assert answers == [expected] * 4
    finally:
        serve.delete("tail-capacity")


@pytest.mark.own_ray
def test_direct_ingress_serves_from_the_replica_on_the_port_asked_for(untrained_tail_checkpoint):
    """`nshot serve --ingress direct` sets Serve's switch before its own Ray starts: the replica
    answers on --port itself (its pid is the one /healthz reports, no proxy actor in between),
    with the in-process answer; SIGTERM shuts it down."""
    import os
    import signal
    import subprocess
    import sys
    import time

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["NSHOT_SERVE_TOKEN"] = TOKEN
    argv = ["serve", "tail", "--checkpoint", str(untrained_tail_checkpoint), "--ingress", "direct"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nshot.cli", *argv, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        text = ""
        deadline = time.time() + 240
        while "Ctrl-C stops" not in text and time.time() < deadline and proc.poll() is None:
            text += proc.stdout.readline()
        said = " ".join(text.split())  # (the console wraps long lines)
        assert f"serving tail at http://127.0.0.1:{port}/tail/predict" in said, text
        assert "ingress direct" in said, text
        client = Client(f"http://127.0.0.1:{port}/tail", token=TOKEN)
        pid = client.healthz()["pid"]
        import psutil

        listening = {
            c.laddr.port
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert port in listening, listening  # the replica process holds the port
        predictor = get("tail").predictor(load_checkpoint(untrained_tail_checkpoint))
        ep = _episode(5)
        assert client.predict(ep) == predictor(predictor.Request(**ep)).model_dump(mode="json")
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    # the replica drained for nshot's 2 s, not Serve's 30 s (past the controller's own limit)
    assert "failed to shut down" not in rest, rest


def test_sustained_load_small_version(served):
    """The small version of `nshot bench serve-sustained` (10,000 requests at 64 clients, 5 %
    malformed: README, "Serve under load"): 400 requests at 64 clients, no 5xx, every valid
    answer the in-process one (8 distinct requests, so a swap would show), every malformed
    body a 422; the replica's memory is read (its 10 % bound is the full run's)."""
    from nshot.bench import malformed_bodies, sustained_load, sustained_requests

    url, predictor = served
    pid = Client(url, token=TOKEN).healthz()["pid"]
    example = predictor.example_request()
    reqs = sustained_requests(example)
    assert len({len(r["query_x"]) for r in reqs}) == len(reqs) == 8
    expected = [
        predictor(predictor.Request.model_validate(r)).model_dump(mode="json") for r in reqs
    ]
    res = sustained_load(
        url + "/predict",
        TOKEN,
        [json.dumps(r).encode() for r in reqs],
        expected,
        malformed_bodies(example),
        requests=400,
        clients=64,
        rss_pid=pid,
        rss_at=100,
    )
    assert res["statuses"] == {"200": 380, "422": 20}, res
    assert res["wrong_answers"] == 0 and res["malformed_not_422"] == 0
    assert res["rss_after_first_bytes"] > 0 and res["rss_end_bytes"] > 0


def test_autoscale_and_admission_reach_the_deployment(untrained_tail_checkpoint, capsys):
    """`--autoscale MIN:MAX` becomes Serve's autoscaling config on ongoing requests (a full
    batch per replica by default); admission limits and the 503's Retry-After are set too."""
    from nshot import cli
    from nshot.serve.app import ServeOptions, build_app, parse_autoscale

    app = build_app("tail", untrained_tail_checkpoint, ServeOptions(autoscale="1:3"))
    cfg = app._bound_deployment._deployment_config
    auto = cfg.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 3, 16)
    assert (cfg.max_ongoing_requests, cfg.max_queued_requests) == (128, 128)
    assert cfg.backpressure_config.status_code == 503
    assert cfg.backpressure_config.retry_after_s == 1.0
    # a leaving replica looks for requests in flight every 0.2 s, not after Serve's 2 s sleep
    assert cfg.graceful_shutdown_wait_loop_s == 0.2
    for bad in ("3:1", "0:2", "2", "a:b"):
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_autoscale(bad)
    argv = ["serve", "tail", "--checkpoint", str(untrained_tail_checkpoint)]
    assert cli.main([*argv, "--port", str(_free_port()), "--autoscale", "2:1"]) == 2
    assert cli.main([*argv, "--port", str(_free_port()), "--autoscale", "1:2", "--replicas", "2"])
    err = capsys.readouterr().err
    assert "--autoscale '2:1'" in err and "replaces --replicas" in err


def test_bench_serve_ratios_are_medians_with_paired_spread():
    """`nshot bench serve`'s ratios: medians over the repeats of one block, the spread of the
    same ratio over paired repeats; a block that could not run is a row that says why."""
    from nshot.bench import _serve_ratios, _summary, serve_table

    def run(rps, p50):
        return {"requests_per_s": rps, "p50_ms": p50, "p99_ms": 2 * p50, "requests": 9, "ok": 9}

    def block(**systems):  # system -> {level: [(rps, p50), ...]}
        runs = {
            s: {f"clients_{c}": [run(*x) for x in xs] for c, xs in by.items()}
            for s, by in systems.items()
        }
        summ = {s: {lvl: _summary(rs) for lvl, rs in by.items()} for s, by in runs.items()}
        return {"available": True, "runs": runs, "summary": summ}

    levels = (1, 8, 32)
    blocks = {
        "proxy": block(
            serve_batched={
                1: [(50, 20)] * 3,
                8: [(100, 50)] * 3,
                32: [(300, 90), (200, 90), (240, 90)],
            },
            serve_unbatched={
                1: [(60, 15)] * 3,
                8: [(100, 60)] * 3,
                32: [(100, 300), (80, 300), (90, 300)],
            },
            fastapi_bare={
                1: [(100, 10), (100, 12), (100, 11)],
                8: [(120, 60)] * 3,
                32: [(200, 160)] * 3,
            },
            serve_batched_w0={1: [(80, 13)] * 3, 8: [(100, 50)] * 3, 32: [(270, 90)] * 3},
        ),
        "direct": block(  # every mode's block carries the unbatched app too
            serve_batched={1: [(90, 9)] * 3, 8: [(200, 40)] * 3, 32: [(400, 80)] * 3},
            serve_unbatched={1: [(90, 9)] * 3, 8: [(110, 70)] * 3, 32: [(100, 320)] * 3},
            fastapi_bare={1: [(100, 8)] * 3, 8: [(150, 50)] * 3, 32: [(200, 160)] * 3},
        ),
        "haproxy": {"available": False, "reason": "no binary"},
    }
    r = _serve_ratios(blocks, levels)
    assert r["ratio_direct_batched_over_unbatched_throughput_32"]["median_ratio"] == 4.0
    assert r["ratio_proxy_batched_over_unbatched_throughput_32"]["median_ratio"] == (
        pytest.approx(240 / 90)
    )
    b = r["ratio_batched_over_unbatched_throughput_32"]
    assert b["median_ratio"] == pytest.approx(240 / 90)
    assert (b["min"], b["max"]) == (pytest.approx(200 / 80), pytest.approx(3.0))
    assert r["ratio_p50_unbatched_over_bare_1"]["median_ratio"] == pytest.approx(15 / 11)
    assert r["ratio_serve_unbatched_throughput_32_over_8"]["median_ratio"] == pytest.approx(0.9)
    assert r["ratio_proxy_batched_over_bare_throughput_32"]["median_ratio"] == pytest.approx(1.2)
    assert (
        r["fastest_loopback_mode"] == "direct" and "ratio_haproxy_p50_batched_over_bare_1" not in r
    )
    # an app with another batch wait (--batch-wait-ms 5,0) gets the same ratios under its name
    assert r["ratio_proxy_p50_batched_w0_over_bare_1"]["median_ratio"] == pytest.approx(13 / 11)
    assert r["ratio_proxy_batched_w0_over_bare_throughput_32"]["median_ratio"] == pytest.approx(
        1.35
    )
    data = {"levels": list(levels), "blocks": blocks, **r, "written_to": "x.json"}
    table = serve_table(data)
    assert "| haproxy | unavailable: no binary |" in table and "240 (200-300)" in table


def test_bench_serve_ramp_summary_windows_phases_and_upscale():
    """`nshot bench serve-ramp`'s figures from raw records: windows start at each phase's
    start, a window's replicas are those running at its end, the upscale delay is counted from
    the busiest phase's start, and the throughput ratio compares that phase's full windows."""
    from nshot import cli
    from nshot.bench import ramp_summary

    phases = ((1, 4.0), (8, 10.0), (1, 3.0))
    bounds = [(0.0, 4.0), (4.0, 14.0), (14.0, 17.0)]
    timeline = [(t / 2, 1 if t / 2 < 9.5 else 2) for t in range(35)]  # a replica added at 9.5 s
    records = []
    for i, (a, b) in enumerate(bounds):
        rate = 10 if i != 1 else 40  # requests per second, doubled on two replicas
        t = a
        while t < b:
            step = 1 / (rate * (2 if i == 1 and t >= 9.5 else 1))
            t += step
            if t < b:
                records.append((t, 0.02, "200", i))
    records.append((5.0, 0.5, "503", 1))
    s = ramp_summary(records, timeline, bounds, phases, lo=1, window_s=5.0)
    assert [(w["phase"], w["start_s"], w["seconds"]) for w in s["windows"]] == [
        (0, 0.0, 4.0), (1, 4.0, 5.0), (1, 9.0, 5.0), (2, 14.0, 3.0)]  # fmt: skip
    assert [w["replicas"] for w in s["windows"]] == [1, 1, 2, 2]
    assert s["upscale_after_s"] == 5.5 and s["replicas_max"] == 2 and s["replicas_at_end"] == 2
    assert s["per_phase"][1]["not_200"] == 1 and s["per_phase"][1]["replicas_max"] == 2
    w1, w2 = s["windows"][1], s["windows"][2]
    assert w1["requests_per_s"] == pytest.approx(40, rel=0.02)
    assert w2["requests_per_s"] == pytest.approx((0.5 * 40 + 4.5 * 80) / 5, rel=0.02)
    ratio = s["busy_phase_throughput_most_over_fewest_replicas"]
    assert ratio == pytest.approx(w2["requests_per_s"] / w1["requests_per_s"])
    late = ramp_summary(records, timeline, [(0.0, 4.0), (4.0, 14.2), (14.2, 17.0)], phases, lo=1)
    assert [(w["start_s"], w["seconds"]) for w in late["windows"]][1:3] == [(4.0, 5.0), (9.0, 5.2)]
    flat = ramp_summary(records, [(0.0, 1)], bounds, phases, lo=1)
    assert (
        flat["upscale_after_s"] is None
        and flat["busy_phase_throughput_most_over_fewest_replicas"] is None
    )
    assert cli.main(["bench", "serve-ramp", "--phases", "8x"]) == 2
    assert cli.main(["bench", "serve-ramp", "--phases", "0x5"]) == 2
    assert cli.main(["bench", "serve-ramp", "--autoscale", "2:1"]) == 2


def test_bench_batch_ceiling_times_the_predictor_alone(untrained_tail_checkpoint):
    """`nshot bench serve` records what batching can gain for its request without Serve: the
    predictor's batched answers are the one-by-one answers (checked elsewhere), here only the
    record's shape and the torch thread count handed back (speed is the benchmark's, not a
    test's)."""
    import torch

    from nshot.bench import _bench_predictor, batch_ceiling

    predictor = _bench_predictor("tail", str(untrained_tail_checkpoint))
    threads = torch.get_num_threads()
    c = batch_ceiling(predictor, size=4, repeats=1)
    assert torch.get_num_threads() == threads
    assert c["batch_size"] == 4 and c["single_ms_per_request"] > 0 < c["batched_ms_per_request"]
    assert c["speedup"] == pytest.approx(c["single_ms_per_request"] / c["batched_ms_per_request"])
