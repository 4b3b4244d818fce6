"""Property-based fuzzing of the served TAIL app: hostile bodies get a 4xx that names
the field, never a 5xx, and a fixed valid request is answered identically before and after.

Categories: deep nesting, numbers past float32 (and int64), unpaired surrogates, type confusion,
unknown fields, content types, duplicate keys, mixed label types, JSON garbage and invalid
bytes, plus valid requests with extreme (float32) values. 1,200 bodies run against the app under
Starlette's test client (the same ``parse_request`` and answer encoding as the Serve ingress),
then 120 against the real Ray Serve deployment on 127.0.0.1. Hypothesis runs derandomized: the
same bodies every run.
"""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TOKEN = "fuzz-token"
FIELDS = ("support_x", "support_y", "query_x", "n_draws", "seed")
CONTENT_TYPES = (
    "text/plain",
    "image/png",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/json; charset=latin-1",
    "application/xml",
    "application/json-patch+json",
    "",
)
F32 = 3.4028234663852886e38


def _episode(seed: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(2, 4))
    sx = [(protos[k] + 0.2 * rng.normal(size=4)).tolist() for k in range(2) for _ in range(3)]
    return {
        "support_x": sx,
        "support_y": ["a", "a", "a", "b", "b", "b"],
        "query_x": [protos[0].tolist(), protos[1].tolist()],
        "n_draws": 1,
        "seed": seed,
    }


BASE = _episode(0)


def _raw(obj: dict, key: str, raw_value: str) -> str:
    """JSON of ``obj`` whose ``key`` holds ``raw_value`` (JSON text inserted as is)."""
    return json.dumps({**obj, key: "@@slot@@"}).replace('"@@slot@@"', raw_value)


def _escaped(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


# ------------------------------------------------------------------------------- strategies
# Each case is (category, body as str or bytes, content type, expected status class, field):
# field None means "not checked"; expected "4xx" or "ok" (200, or 422 for a valid-typed body
# that the model refuses, such as one label).

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
wrong_for_float = st.one_of(
    st.sampled_from(['"0.5"', '" 1 "', '"1_000"', '"1e3"', "true", "false", "null", "{}", "[]"]),
    st.text(max_size=6).map(json.dumps),
)
wrong_for_int = st.sampled_from(['"1"', "true", "2.0", "1.5", "null", "[]", "{}", '"two"', "1e2"])
wrong_for_label = st.sampled_from(["1.5", "true", "false", "null", "[]", "{}", '["a"]', "0.0"])
huge_numbers = st.one_of(
    st.floats(min_value=F32 * 1.0001, max_value=1.7e308).map(repr),
    st.floats(max_value=-F32 * 1.0001, min_value=-1.7e308).map(repr),
    st.sampled_from(["1e39", "3.5e38", "1e308", "-1e39", "Infinity", "-Infinity", "NaN"]),
    st.integers(min_value=2**63, max_value=2**200).map(str),
    st.integers(max_value=-(2**63) - 1, min_value=-(2**200)).map(str),
)
surrogates = st.integers(0xD800, 0xDFFF).map(lambda c: chr(c))


@st.composite
def cases(draw):
    kind = draw(
        st.sampled_from(
            [
                "deep",
                "huge",
                "surrogate",
                "type",
                "extra",
                "ctype",
                "dup",
                "mixed",
                "garbage",
                "bytes",
                "valid",
            ]
        )
    )
    ep = json.loads(json.dumps(BASE))
    if kind == "deep":
        key = draw(st.sampled_from([*FIELDS, "deep_extra"]))
        depth = draw(st.one_of(st.integers(65, 400), st.integers(900, 4000)))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"k":', "}")]))
        inner = opener * depth + "0" + closer * depth
        return kind, _raw(ep, key, inner), "application/json", "4xx", key
    if kind == "huge":
        where = draw(st.sampled_from(["support_x", "query_x", "n_draws", "seed"]))
        num = draw(huge_numbers)
        if where in ("support_x", "query_x"):
            i = draw(st.integers(0, len(ep[where]) - 1))
            j = draw(st.integers(0, 3))
            rows = [[json.dumps(v) for v in row] for row in ep[where]]
            rows[i][j] = num
            text = "[" + ",".join("[" + ",".join(r) + "]" for r in rows) + "]"
            return kind, _raw(ep, where, text), "application/json", "4xx", f"{where}.{i}.{j}"
        return kind, _raw(ep, where, num), "application/json", "4xx", where
    if kind == "surrogate":
        s = draw(st.text(max_size=3)) + draw(surrogates) + draw(st.text(max_size=3))
        where = draw(st.sampled_from(["label", "key", "value"]))
        if where == "label":
            i = draw(st.integers(0, 5))
            labels = [json.dumps(v) for v in ep["support_y"]]
            labels[i] = json.dumps(s)  # ensure_ascii: the surrogate travels as \udXXX
            raw = "[" + ",".join(labels) + "]"
            return kind, _raw(ep, "support_y", raw), "application/json", "4xx", f"support_y.{i}"
        if where == "key":
            body = json.dumps({**ep, s: 1})
            return kind, body, "application/json", "4xx", _escaped(s)
        return kind, json.dumps({**ep, "note": s}), "application/json", "4xx", "note"
    if kind == "type":
        where = draw(st.sampled_from(["x", "row", "label", "int", "top"]))
        if where == "x":
            key = draw(st.sampled_from(["support_x", "query_x"]))
            i, j = draw(st.integers(0, len(ep[key]) - 1)), draw(st.integers(0, 3))
            rows = [[json.dumps(v) for v in row] for row in ep[key]]
            rows[i][j] = draw(wrong_for_float)
            text = "[" + ",".join("[" + ",".join(r) + "]" for r in rows) + "]"
            return kind, _raw(ep, key, text), "application/json", "4xx", f"{key}.{i}.{j}"
        if where == "row":
            key = draw(st.sampled_from(["support_x", "query_x"]))
            i = draw(st.integers(0, len(ep[key]) - 1))
            rows = [json.dumps(r) for r in ep[key]]
            rows[i] = draw(st.sampled_from(["1", '"row"', "true", "null", "{}"]))
            text = "[" + ",".join(rows) + "]"
            return kind, _raw(ep, key, text), "application/json", "4xx", f"{key}.{i}"
        if where == "label":
            i = draw(st.integers(0, 5))
            labels = [json.dumps(v) for v in ep["support_y"]]
            labels[i] = draw(wrong_for_label)
            raw = "[" + ",".join(labels) + "]"
            return kind, _raw(ep, "support_y", raw), "application/json", "4xx", f"support_y.{i}"
        if where == "int":
            key = draw(st.sampled_from(["n_draws", "seed"]))
            return kind, _raw(ep, key, draw(wrong_for_int)), "application/json", "4xx", key
        key = draw(st.sampled_from(["support_x", "support_y", "query_x"]))
        raw = draw(st.sampled_from(['"text"', "1", "true", "null", "{}"]))
        return kind, _raw(ep, key, raw), "application/json", "4xx", key
    if kind == "extra":
        key = draw(
            st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
        )
        if key in FIELDS:
            key += "_x"
        return kind, json.dumps({**ep, key: draw(json_values)}), "application/json", "4xx", key
    if kind == "ctype":
        ctype = draw(st.sampled_from(CONTENT_TYPES))
        return kind, json.dumps(ep), ctype, "415", None
    if kind == "dup":
        key = draw(st.sampled_from(FIELDS))
        again = draw(st.sampled_from([json.dumps(ep[key]), "0", '"x"']))
        body = json.dumps(ep)[:-1] + f', "{key}": {again}}}'
        return kind, body, "application/json", "4xx", key
    if kind == "mixed":
        one = st.one_of(st.integers(0, 3), st.sampled_from(["0", "1", "a"]))
        labels = draw(st.lists(one, min_size=4, max_size=4))
        labels += [draw(st.integers(0, 3)), draw(st.sampled_from(["0", "1", "a"]))]
        body = json.dumps({**ep, "support_y": draw(st.permutations(labels))})
        return kind, body, "application/json", "4xx", "support_y"
    if kind == "garbage":
        return kind, json.dumps(draw(json_values)), "application/json", "4xx", None
    if kind == "bytes":
        raw = draw(st.binary(max_size=40))
        if raw.strip() == b"":
            raw = b"\xff"
        try:  # a byte string that happens to be a valid JSON value is "garbage" above
            json.loads(raw)
            raw = b"{" + raw
        except ValueError:
            pass
        return kind, raw, "application/json", "4xx", None
    # valid: extreme but float32-representable values, labels all strings or all integers
    scale = draw(st.sampled_from([1.0, 1e-30, 1e-45, 1e30, 3.4e37, 1e38]))
    value = st.floats(-1.0, 1.0, allow_nan=False, width=32).map(lambda v: v * scale)
    for key in ("support_x", "query_x"):
        ep[key] = [[draw(value) for _ in row] for row in ep[key]]
    if draw(st.booleans()):
        ep["support_y"] = [0, 0, 0, 1, 1, 1]
    ep["n_draws"] = draw(st.integers(1, 3))
    ep["seed"] = draw(st.integers(0, 2**63 - 1))
    return kind, json.dumps(ep), "application/json; charset=utf-8", "ok", None


def _check(case, status: int, answer) -> None:
    kind, _, _, expect, field = case
    assert status < 500, (kind, status, answer)
    if expect == "415":
        assert status == 415 and "application/json" in answer["detail"], (case, status, answer)
        return
    if expect == "ok":
        assert status in (200, 422), (case, status, answer)
        if status == 200:
            assert len(answer["labels"]) == 2 and answer["n_classes"] == 2
            for probs in answer["probs"]:
                assert all(math.isfinite(p) and 0 <= p <= 1 for p in probs.values())
                assert abs(sum(probs.values()) - 1) < 1e-4
        return
    assert 400 <= status < 500, (case, status, answer)
    if field is not None:
        got = answer["detail"][0]["field"]
        assert got is not None and got.startswith(field), (case[:1], field, got, answer)


def _post_testclient(client):
    def post(body, ctype):
        headers = {"content-type": ctype} if ctype else {}
        data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        r = client.post("/tail/predict", content=data, headers=headers)
        r.content.decode("utf-8")  # the answer is always valid UTF-8 ...
        return r.status_code, r.json()  # ... and valid JSON

    return post


def _post_http(url):
    def post(body, ctype):
        data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        req = urllib.request.Request(url + "/predict", data=data, method="POST")
        req.add_header("authorization", f"Bearer {TOKEN}")
        req.add_header("content-type", ctype)  # urllib would add a form type when none
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read().decode("utf-8"))

    return post


def _fuzz(post, n: int) -> dict[str, int]:
    """Run ``n`` derandomized Hypothesis examples through ``post``; returns counts by kind."""
    counts: dict[str, int] = {}

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases())
    def run(case):
        counts[case[0]] = counts.get(case[0], 0) + 1
        status, answer = post(case[1], case[2])
        _check(case, status, answer)

    run()
    return counts


@pytest.fixture(scope="module")
def predictor(untrained_tail_checkpoint):
    from nshot.method import get
    from nshot.train.checkpoint import load_checkpoint

    return get("tail").predictor(load_checkpoint(untrained_tail_checkpoint))


def test_fuzz_the_app_with_1200_bodies(untrained_tail_checkpoint, predictor):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app

    client = TestClient(make_app("tail", str(untrained_tail_checkpoint)))
    want = predictor(predictor.Request(**BASE)).model_dump(mode="json")
    post = _post_testclient(client)
    assert post(json.dumps(BASE), "application/json") == (200, want)
    counts = _fuzz(post, 1200)
    assert sum(counts.values()) >= 1000 and len(counts) == 11, counts
    # small categories (8 content types, 15 duplicate keys) are exhausted, never repeated
    assert min(counts.values()) >= 8, counts
    assert post(json.dumps(BASE), "application/json") == (200, want)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fuzz_the_ray_serve_deployment(ray_session, untrained_tail_checkpoint, predictor):
    """The same property, 120 bodies, against the real Serve ingress (token auth on)."""
    from ray import serve

    from nshot.serve import start
    from nshot.serve.app import ServeOptions

    url = start(
        "tail",
        untrained_tail_checkpoint,
        port=_free_port(),
        options=ServeOptions(token=TOKEN, max_batch_size=4),
    )
    try:
        post = _post_http(url)
        want = predictor(predictor.Request(**BASE)).model_dump(mode="json")
        assert post(json.dumps(BASE), "application/json") == (200, want)
        counts = _fuzz(post, 120)
        assert sum(counts.values()) >= 100, counts
        assert post(json.dumps(BASE), "application/json") == (200, want)
    finally:
        serve.shutdown()
