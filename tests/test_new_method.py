"""`nshot new NAME`: the package it writes is a method that keeps the Method contract as written.

The package is generated into a temporary folder and registered as a third-party method (an
``nshot.methods`` entry point, as a package outside nshot registers one); then the conformance
checks that need no Ray run on it (presets, declared parts, claims and their kinds, the
predictor's example over JSON, a batch and HTTP, hostile variants), its comparison reproduces
in-process with `nshot reproduce --in-process`, and one Ray test trains it with
`nshot train --workers 0` and evaluates the checkpoint.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _compare import json_close

import nshot.method as registry
from nshot.cli import main

ROOT = Path(__file__).parents[1]
NAME = "proto_demo_method"  # longer than the template's placeholder: lines grow


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The folder holding the package ``NAME`` that `nshot new` wrote."""
    parent = tmp_path_factory.mktemp("new")
    assert main(["new", NAME, "--dir", str(parent)]) == 0
    return parent


@pytest.fixture
def registered(generated, monkeypatch):
    """``NAME`` registered through an entry point, in a copy of the registry."""
    monkeypatch.syspath_prepend(str(generated))
    ep = importlib.metadata.EntryPoint(
        name=NAME, value=f"{NAME}:ProtoDemoMethodMethod", group=registry.ENTRY_POINT_GROUP
    )
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == registry.ENTRY_POINT_GROUP:
            return [*real(**kw), ep]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_DISCOVERED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert NAME in registry.available()
    return registry.get(NAME)


def test_the_package_has_every_file_and_no_placeholder_left(generated, capsys):
    from nshot import scaffold

    pkg = generated / NAME
    assert sorted(p.name for p in pkg.iterdir()) == sorted(scaffold.FILES)
    for f in pkg.iterdir():
        text = f.read_text()
        assert "skeleton" not in text.lower(), f.name
    assert 'name = "proto_demo_method"' in (pkg / "method.py").read_text()
    assert "class ProtoDemoMethodConfig(MethodConfig)" in (pkg / "config.py").read_text()
    # a second time, or a bad name: one error line, nothing written
    capsys.readouterr()
    assert main(["new", NAME, "--dir", str(generated)]) == 2
    assert "already exists" in capsys.readouterr().err
    for bad in ("Bad", "1x", "class", "tail", "a-b", "m" * 31):
        assert main(["new", bad, "--dir", str(generated)]) == 2
        assert capsys.readouterr().err.startswith("nshot: error: nshot new")
    assert sorted(p.name for p in generated.iterdir()) == [NAME]


def test_ruff_accepts_the_package(generated, tmp_path):
    """As written, also for the longest name (the template's lines grow with the name)."""
    from nshot import scaffold

    pytest.importorskip("ruff")
    longest = scaffold.new_method("m" * scaffold.MAX_NAME, tmp_path)
    config = str(ROOT / "pyproject.toml")
    for cmd in (["check"], ["format", "--check"]):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                *cmd,
                "--config",
                config,
                str(generated / NAME),
                str(longest),
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout + res.stderr


def test_it_keeps_the_contracts_declared_parts(registered):
    import test_conformance as conformance

    conformance.test_presets_and_declared_parts(NAME)
    conformance.test_every_claim_has_a_kind_and_the_method_a_tested_headline(NAME)
    kinds = {c.kind for c in registered.claims}
    assert kinds == {"headline", "ablation", "control", "check"}
    assert set(registered.data(registered.config("smoke"))) == {"train", "test"}


@pytest.fixture
def checkpoint(registered, tmp_path):
    """A checkpoint of the untrained ``smoke`` model, written as a train loop writes one."""
    from nshot.train.checkpoint import save_checkpoint

    cfg = registered.config("smoke")
    model = sys.modules[f"{NAME}.model"].build_model(cfg)
    return save_checkpoint(
        tmp_path / "ckpt",
        method=NAME,
        method_version=registered.version,
        config=cfg.model_dump(),
        step=1,
        model_state=model.state_dict(),
    )


def test_its_predictor_answers_its_example_over_json_batch_and_http(registered, checkpoint):
    """The conformance checks of the predictor, on a checkpoint written without Ray."""
    import test_conformance as conformance
    from fastapi.testclient import TestClient

    from nshot.serve.bare import make_app
    from nshot.train.checkpoint import load_checkpoint

    pred = registered.predictor(load_checkpoint(checkpoint, method=NAME))
    example = pred.example_request()
    json.dumps(example)
    req = pred.Request.model_validate(example)
    answer = pred(req)
    assert len(answer.labels) == len(example["query_x"])
    assert type(answer).model_validate_json(answer.model_dump_json()) == answer
    assert conformance._same(pred.batch([req, req])[0], answer)
    with TestClient(make_app(NAME, str(checkpoint)), raise_server_exceptions=False) as client:
        got = client.post(f"/{NAME}/predict", json=example)
        assert got.status_code == 200, got.text
        assert json_close(got.json(), json.loads(answer.model_dump_json()))
        failed = []
        for label, body in conformance._hostile_variants(example):
            res = client.post(f"/{NAME}/predict", json=body)
            if res.status_code >= 500:
                failed.append((label, res.status_code, res.text[:160]))
        assert not failed, failed
        wrong_width = {**example, "query_x": [[0.0] * 3]}
        assert client.post(f"/{NAME}/predict", json=wrong_width).status_code == 422
    metrics = registered.evaluate(load_checkpoint(checkpoint), registered.config("smoke"))
    assert set(metrics) == {"acc", "acc_ci95", "raw_prototypes_acc", "raw_prototypes_acc_ci95"}


def test_it_reproduces_in_process(registered, tmp_path, monkeypatch, capsys):
    """`nshot reproduce NAME --in-process` (no Ray): results, claims and a scoreboard line."""
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    out = tmp_path / "res"
    argv = ["reproduce", NAME, "--preset", "smoke", "--in-process", "--out", str(out), "--json"]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert list(data["rows"]) == ["protonet", "raw_prototypes", "untrained", "permuted_labels"]
    assert data["seeds"] == 2 and len(data["samples"]["protonet"]["acc"]) == 2
    claims = {c["id"]: c for c in data["claims"]}
    assert set(claims) == {c.id for c in registered.claims}
    assert claims["beats_raw_prototypes"]["p"] is not None  # the paired test ran
    assert "paper claims" in capsys.readouterr().err
    assert main(["claims", str(out / "results.json")]) == 0


@pytest.mark.usefixtures("ray_session")
def test_it_trains_with_ray_train_in_process_and_evaluates(registered, tmp_path, capsys):
    argv = ["train", NAME, "--preset", "smoke", "--workers", "0", "--storage", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["metrics"]["step"] == 20.0 and trained["checkpoint"].endswith("00000020")
    run = tmp_path / f"{NAME}-smoke"
    assert main(["eval", NAME, "--checkpoint", str(run), "--set", "eval_episodes=5", "--json"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["metrics"]["acc"] <= 1.0
