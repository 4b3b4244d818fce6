"""Conformance: every registered method keeps the Method contract.

Parametrised by ``nshot.method.available()``, so a new method (built in or registered by a
third-party package) gets these checks without writing them:

* its presets validate, and its declared parts (claims, Tune spec, eval fields) are well formed;
  every trial its Tune space can propose is a valid config on every preset;
* ``smoke`` trains in-process, with a fault injected after the first checkpoint
  (``fail_at_step``): the run fails, ``--resume`` continues from the last checkpoint, and the
  final checkpoint is safetensors + JSON that reloads;
* its predictor answers its own example request; the answer survives a JSON round trip, equals
  the batched answer, and the HTTP app gives the same JSON;
* hostile variants of that example (numbers past any scale, emptied and repeated lists) get an
  answer or a 4xx, never a 5xx.
"""

from __future__ import annotations

import json
import re
import typing

import pytest
from _compare import json_close
from _smoke_trace import STRUCTURE_ONLY, capture, platform, record, recorded, recording

from nshot.method import PRESETS, MethodConfig, Predictor, available, get

METHODS = available()
LLM = {"keystone", "zerounlearn"}  # their smoke preset reads the tiny LM nshot trains once


@pytest.mark.parametrize("name", METHODS)
def test_presets_and_declared_parts(name):
    from nshot.claims import Claim

    method = get(name)
    assert set(PRESETS) <= set(method.Config.PRESETS), f"{name}: presets {PRESETS}"
    for preset in PRESETS:
        cfg = method.config(preset)
        assert isinstance(cfg, MethodConfig) and cfg.preset == preset
        assert method.Config.validated(cfg.model_dump()) == cfg  # a config round-trips
    assert method.Config.EVAL_FIELDS <= set(method.Config.model_fields)
    ids = [c.id for c in method.claims]
    assert all(isinstance(c, Claim) for c in method.claims) and len(ids) == len(set(ids))
    # a claim scoped to an experiment names one the config's `experiment` field can select
    for c in method.claims:
        if c.experiment is not None:
            field = method.Config.model_fields.get("experiment")
            assert field is not None, f"{name}: claim {c.id} needs a config field 'experiment'"
            assert c.experiment in typing.get_args(field.annotation), (name, c.id)
    if method.Config.TUNE is not None:
        assert set(method.Config.TUNE.space) <= set(method.Config.model_fields)
        _every_proposed_trial_is_a_valid_config(method)
    # the packages whose versions `nshot reproduce` records: distribution names
    assert isinstance(method.packages, tuple), f"{name}: packages must be a tuple"
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p) for p in method.packages), name
    url = method.paper_url
    assert url is None or re.fullmatch(r"https://[^\s()<>]+", url), f"{name}: paper_url {url!r}"


@pytest.mark.parametrize("name", METHODS)
def test_every_claim_has_a_kind_and_the_method_a_tested_headline(name):
    """Scoreboards count paper claims apart from checks and show the headline verdict first:
    every claim names its kind, and the paper's central comparison is declared as at least one
    headline claim with a paired test over per-seed values."""
    from nshot.claims import KINDS

    method = get(name)
    untyped = [c.id for c in method.claims if c.kind not in KINDS]
    assert not untyped, f"{name}: claims without a kind: {untyped}"
    heads = [c for c in method.claims if c.kind == "headline"]
    assert heads, f"{name}: no headline claim"
    assert any(c.test is not None for c in heads), f"{name}: no headline claim has a paired test"


def _every_proposed_trial_is_a_valid_config(method):
    """What `nshot tune` can propose on each preset validates: every bound and choice alone
    (the check `nshot tune` makes before it starts) and random joint draws (a trial's config),
    so no trial fails on a constraint between fields (a width its heads do not divide)."""
    import numpy as np

    space = method.Config.TUNE.search_space()
    for preset in PRESETS:
        base = method.config(preset).model_dump()
        space.validate_for(method.Config, base)
        for point in space.sample(np.random.default_rng(0), 64):
            try:
                method.Config.validated({**base, **point})
            except Exception as err:  # noqa: BLE001 - the assertion names it
                raise AssertionError(
                    f"{method.name} {preset}: trial {point} is refused: {err}"
                ) from err


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory, request):
    """name -> (first attempt's error, checkpoints after it, final checkpoint path)."""
    return {}


def _train_with_a_fault(name, storage, trained):
    from nshot.train import fit
    from nshot.train.checkpoint import find_checkpoints

    if name in trained:
        return trained[name]
    method = get(name)
    cfg = method.config("smoke")
    at = cfg.checkpoint_every + 1 if cfg.checkpoint_every < cfg.steps else 1
    faulty = cfg.replace(fail_at_step=at)
    with pytest.raises(Exception) as err, capture() as first:  # noqa: PT011 - any failure
        fit(name, faulty, storage=storage, name=name)
    run = storage / name
    before = [json.loads((c / "state.json").read_text())["step"] for c in find_checkpoints(run)]
    # the fault fires on a first attempt only; with no checkpoint before it, the resume is one
    with capture() as second:
        res = fit(name, faulty if before else cfg, storage=storage, name=name, resume=True)
    trained[name] = (err.value, at, before, res, first + second)
    return trained[name]


@pytest.mark.parametrize("name", METHODS)
def test_smoke_trains_fails_at_the_injected_step_and_resumes(
    name, trained, tmp_path_factory, request
):
    from nshot.train.checkpoint import load_checkpoint

    if name in LLM:
        request.getfixturevalue("tiny_smoke_lm")
    storage = tmp_path_factory.mktemp(f"conf-{name}")
    err, at, before, res, _ = _train_with_a_fault(name, storage, trained)
    assert "injected fault" in str(err) or "fail_at_step" in str(err), f"{name}: {err!r}"
    assert res.checkpoint is not None, f"{name}: no final checkpoint"
    ckpt = load_checkpoint(res.checkpoint, method=name)
    assert (ckpt.path / "model.safetensors").is_file() and (ckpt.path / "state.json").is_file()
    if at > 1:  # a checkpoint was committed before the fault, and the resume went past it
        assert before and max(before) < at, f"{name}: checkpoints before the fault {before}"
        assert ckpt.step > max(before), f"{name}: resumed to step {ckpt.step} from {before}"


@pytest.mark.parametrize("name", METHODS)
def test_smoke_reports_the_recorded_numbers(name, trained, tmp_path_factory, request):
    """The metrics ``smoke`` reports at each step (the failed attempt, then the resumed run)
    equal those recorded in ``tests/smoke_trace.json`` to 1e-5: moving a method's loop into the
    platform's trainer must not change what it computes. The numbers are compared on the
    platform that recorded them (the same torch and CPU kernels) and the structure (report steps
    and metric names) everywhere."""
    if name in LLM:
        request.getfixturevalue("tiny_smoke_lm")
    storage = tmp_path_factory.mktemp(f"conf-{name}")
    *_, trace = _train_with_a_fault(name, storage, trained)
    if recording():
        record(name, trace)
        return
    data = recorded()
    want = data.get(name)
    if want is None:
        pytest.skip(f"{name}: no recorded trace (NSHOT_RECORD_SMOKE_TRACE=1 records one)")
    assert len(trace) == len(want), f"{name}: {len(trace)} reports, {len(want)} recorded"
    numbers = name not in STRUCTURE_ONLY and data.get("_platform") == platform()
    for i, (got, exp) in enumerate(zip(trace, want, strict=True)):
        assert got.keys() == exp.keys() and got.get("step") == exp.get("step"), (name, i)
        if numbers:
            assert json_close(got, exp), f"{name}: report {i}: {got} != recorded {exp}"


@pytest.mark.parametrize("name", METHODS)
def test_predictor_answers_its_example_over_json_batch_and_http(
    name, trained, tmp_path_factory, request
):
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train.checkpoint import load_checkpoint

    if name in LLM:
        request.getfixturevalue("tiny_smoke_lm")
    storage = tmp_path_factory.mktemp(f"conf-{name}")
    *_, res, _ = _train_with_a_fault(name, storage, trained)
    method = get(name)
    pred = method.predictor(load_checkpoint(res.checkpoint, method=name))
    assert isinstance(pred, Predictor)
    example = pred.example_request()
    assert example is not None, f"{name}: its predictor publishes no example_request()"
    json.dumps(example)  # plain JSON, as a user sends it
    req = pred.Request.model_validate(example)
    answer = pred(req)
    assert isinstance(answer, pred.Response)
    assert type(answer).model_validate_json(answer.model_dump_json()) == answer
    assert _same(pred.batch([req, req])[0], answer)
    with TestClient(make_app(name, str(res.checkpoint))) as client:
        got = client.post(f"/{name}/predict", json=example)
    assert got.status_code == 200, got.text
    assert json_close(got.json(), json.loads(answer.model_dump_json()))


def _same(a, b) -> bool:
    """Equal answers, floats to 1e-5: a batch of two runs other matrix kernels than a batch of one,
    so an LM's probabilities may differ in the seventh digit between the two."""
    return json_close(json.loads(a.model_dump_json()), json.loads(b.model_dump_json()))


def _leaves(obj, path=()):
    """(path, value) of every value of a JSON body, lists included (their first three items)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        yield path, obj
        for i, v in enumerate(obj[:3]):
            yield from _leaves(v, (*path, i))
    else:
        yield path, obj


def _with(obj, path, value):
    import copy

    out = copy.deepcopy(obj)
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return out


def _hostile_variants(example: dict):
    """Variants of a valid request a client may send: a number far past any scale (±1e25, near
    float32's maximum) at up to six places, a list emptied, its first item repeated, tripled."""
    import numpy as np

    nums = [p for p, v in _leaves(example)
            if p and isinstance(v, int | float) and not isinstance(v, bool)]  # fmt: skip
    lists = [p for p, v in _leaves(example) if p and isinstance(v, list) and v]
    rng = np.random.default_rng(0)
    for p in [nums[i] for i in sorted(rng.choice(len(nums), min(6, len(nums)), replace=False))]:
        for value in (1e25, -1e25, 3.0e38):
            yield f"{p}={value:g}", _with(example, p, value)
    for p in [lists[i] for i in sorted(rng.choice(len(lists), min(4, len(lists)), replace=False))]:
        items = _leaves_get(example, p)
        yield f"{p}=[]", _with(example, p, [])
        yield f"{p}=repeated", _with(example, p, [items[0]] * len(items))
        yield f"{p}=tripled", _with(example, p, list(items) * 3)


def _leaves_get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


@pytest.mark.parametrize("name", METHODS)
def test_hostile_variants_of_the_example_get_an_answer_or_a_4xx_never_a_5xx(
    name, trained, tmp_path_factory, request
):
    """Numbers past any scale, emptied and repeated lists: the predictor answers or refuses
    with a 4xx (a float32 model must not turn 1e25 into a NaN answer, nor a repeated electrode
    position into a 500)."""
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train.checkpoint import load_checkpoint

    if name in LLM:
        request.getfixturevalue("tiny_smoke_lm")
    storage = tmp_path_factory.mktemp(f"conf-{name}")
    *_, res, _ = _train_with_a_fault(name, storage, trained)
    example = get(name).predictor(load_checkpoint(res.checkpoint, method=name)).example_request()
    failed = []
    app = make_app(name, str(res.checkpoint))
    with TestClient(app, raise_server_exceptions=False) as client:
        for label, body in _hostile_variants(example):
            got = client.post(f"/{name}/predict", json=body)
            if got.status_code >= 500:
                failed.append((label, got.status_code, got.text[:160]))
    assert not failed, f"{name}: {failed}"
