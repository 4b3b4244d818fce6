"""`nshot serve --all RUNS_DIR`: every method's newest run under one Serve instance and one port,
one application per method; the runs left out and why; the Serve config it can write instead."""

from __future__ import annotations

import os
import shutil
import socket

import pytest
import yaml

from nshot.errors import NshotError
from nshot.method import get
from nshot.train.checkpoint import load_checkpoint

TOKEN = "all-apps-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs_dir(ray_session, tmp_path_factory, untrained_tail_checkpoint):
    """A storage folder as `nshot train` leaves it: two TAIL runs (the newer one wins), one URS
    run, a run without a checkpoint, a symbolic link to a run elsewhere, and a stray file."""
    from nshot.train import Scaling, fit

    root = tmp_path_factory.mktemp("runs")
    fit("urs", get("urs").config("smoke"), scaling=Scaling(workers=0), storage=root, name="urs-1")
    old = root / "tail-old" / "checkpoint_00000001"
    shutil.copytree(untrained_tail_checkpoint, old)
    new = root / "tail-new" / "checkpoint_00000001"
    shutil.copytree(untrained_tail_checkpoint, new)
    os.utime(old / "state.json", (1_000_000_000, 1_000_000_000))  # the older run
    (root / "empty-run").mkdir()
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "tail-x"
    shutil.copytree(root / "tail-new", elsewhere)
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "notes.txt").write_text("not a run")
    return root


def test_find_runs_takes_each_methods_newest_and_says_what_it_leaves_out(runs_dir):
    from nshot.serve.runs import find_runs

    runs = find_runs(runs_dir)
    assert sorted(runs.chosen) == ["tail", "urs"]
    assert runs.runs["tail"] == runs_dir / "tail-new"
    assert runs.chosen["tail"] == runs_dir / "tail-new" / "checkpoint_00000001"
    why = {p.name: r for p, r in runs.skipped}
    assert set(why) == {"empty-run", "linked", "tail-old"}
    assert "symbolic link" in why["linked"] and "no nshot checkpoint" in why["empty-run"]
    assert why["tail-old"].startswith("an older run of tail")
    with pytest.raises(NshotError, match="no run with a servable checkpoint"):
        find_runs(runs_dir / "empty-run")
    with pytest.raises(NshotError, match="not a folder of runs"):
        find_runs(runs_dir / "notes.txt")


def test_write_config_is_one_application_per_method_without_the_token(runs_dir, tmp_path, capsys):
    from nshot.cli import main

    out = tmp_path / "serve.yaml"
    argv = ["serve", "--all", str(runs_dir), "--write-config", str(out), "--port", "8123"]
    assert main([*argv, "--token", TOKEN, "--max-batch-size", "4"]) == 0
    text = out.read_text()
    assert TOKEN not in text
    config = yaml.safe_load(text)
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}
    apps = {a["name"]: a for a in config["applications"]}
    assert sorted(apps) == ["tail", "urs"] and apps["urs"]["route_prefix"] == "/urs"
    assert apps["tail"]["import_path"] == "nshot.serve.app:app_builder"
    assert apps["tail"]["args"] == {
        "method": "tail",
        "checkpoint": str(runs_dir / "tail-new" / "checkpoint_00000001"),
        "max_batch_size": 4,
    }
    err = capsys.readouterr().out
    assert "left out" in err and "tail-old" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["tail"], "give no METHOD or --checkpoint"),
        (["--conformal", "caos"], "prediction sets are per application"),
        (["--ingress", "direct"], "every application on one port"),
        (["--autoscale", "3:1"], "autoscale '3:1'"),
    ],
)
def test_bad_all_arguments_are_one_line_errors(runs_dir, extra, message, capsys):
    from nshot.cli import main

    assert main(["serve", "--all", str(runs_dir), *extra]) == 2
    assert message in capsys.readouterr().err


def test_both_methods_answer_on_one_port_as_in_process(runs_dir):
    from ray import serve

    from nshot.serve import Client, ServeError, start_all
    from nshot.serve.app import ServeOptions
    from nshot.serve.runs import find_runs

    runs = find_runs(runs_dir)
    port = _free_port()
    urls = start_all(runs.chosen, port=port, options=ServeOptions(token=TOKEN))
    try:
        assert urls == {m: f"http://127.0.0.1:{port}/{m}" for m in ("tail", "urs")}
        for method, url in urls.items():
            client = Client(url, token=TOKEN)
            meta = client.metadata()
            assert meta["method"] == method
            pred = get(method).predictor(load_checkpoint(runs.chosen[method]))
            body = pred.example_request()
            assert client.predict(body) == pred(pred.Request.model_validate(body)).model_dump(
                mode="json"
            )
            with pytest.raises(ServeError) as err:
                Client(url).metadata()  # every application needs the token
            assert err.value.status == 401
    finally:
        serve.shutdown()
