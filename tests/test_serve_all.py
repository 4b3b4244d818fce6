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
        "replica_cpus": 1.0,  # two applications fit the tests' two CPUs at 1 each
        "replica_gpus": 0.0,
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
        (["--replica-cpus", "0"], "--replica-cpus 0: a replica asks a number of CPUs above 0"),
        (["--replica-cpus", "nan"], "--replica-cpus nan: a replica asks a number of CPUs"),
        (["--replica-gpus", "-1"], "--replica-gpus -1: a replica asks 0 GPUs"),
        (["--replica-gpus", "1.5"], "above 1, GPUs are whole"),
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


# ------------------------------------------------------------------ what each replica asks Ray for


def test_the_default_request_is_scaled_down_only_when_the_replicas_would_not_fit():
    from nshot.serve.app import ServeOptions
    from nshot.serve.resources import Capacity, fit

    two = Capacity(cpus=2.0, gpus=0.0, where="the Ray cluster")
    opts, note = fit(ServeOptions(), 2, two)  # 2 replicas at 1 CPU fit 2 CPUs
    assert opts.replica_cpus == 1.0 and note is None
    opts, note = fit(ServeOptions(), 19, two)  # min(1, 0.9 x 2 / 19), down to Ray's 0.0001
    assert opts.replica_cpus == 0.0947 and 19 * opts.replica_cpus <= 2
    assert note == (
        "19 replicas (19 applications x 1) at 1 CPU each would need 19 CPUs, more than the 2 "
        "CPUs of the Ray cluster: each replica asks 0.0947 CPU instead (0.9 x 2 / 19; "
        "--replica-cpus sets it)"
    )
    # replicas count: num_replicas per application, or the most that autoscaling allows
    assert fit(ServeOptions(num_replicas=3), 1, two)[0].replica_cpus == 0.6
    opts, note = fit(ServeOptions(autoscale="1:4"), 2, two)
    assert opts.replica_cpus == 0.225 and "up to 8 replicas" in note and "1:4" in note
    assert fit(ServeOptions(autoscale="1:1"), 2, two) == (
        ServeOptions(autoscale="1:1", replica_cpus=1.0),
        None,
    )
    # a cluster that reports no CPU yet (its workers still to come) is not fitted
    assert fit(ServeOptions(), 19, Capacity(0.0, 0.0, "the Ray cluster"))[0].replica_cpus == 1.0


def test_an_explicit_request_that_cannot_fit_is_refused_with_the_numbers():
    from nshot.serve.app import ServeOptions
    from nshot.serve.resources import Capacity, fit

    two = Capacity(cpus=2.0, gpus=0.0, where="the Ray cluster")
    with pytest.raises(NshotError) as err:
        fit(ServeOptions(replica_cpus=1.0), 19, two)
    assert str(err.value) == (
        "--replica-cpus 1: 19 replicas (19 applications x 1) x 1 CPU = 19 CPUs, more than the 2 "
        "CPUs of the Ray cluster; pass --replica-cpus 0.1052 or less (leaving it out asks "
        "0.0947), or fewer replicas"
    )
    # the request it names fits, and so does any explicit one that fits: kept as given
    assert fit(ServeOptions(replica_cpus=0.1052), 19, two) == (
        ServeOptions(replica_cpus=0.1052),
        None,
    )
    assert fit(ServeOptions(replica_cpus=2.0), 1, two)[0].replica_cpus == 2.0
    with pytest.raises(NshotError, match="x 0.6667 CPU = 2.0001 CPUs, more than the 2 CPUs"):
        fit(ServeOptions(replica_cpus=0.6667), 3, two)  # Ray counts in steps of 0.0001
    with pytest.raises(NshotError) as err:
        fit(ServeOptions(replica_gpus=1.0), 3, two)
    assert str(err.value) == (
        "--replica-gpus 1: 3 replicas (3 applications x 1) x 1 GPU = 3 GPUs, but the Ray "
        "cluster has no GPU; leave --replica-gpus out to serve on CPUs"
    )
    one_gpu = Capacity(cpus=2.0, gpus=1.0, where="the Ray cluster")
    with pytest.raises(NshotError, match="= 1.5 GPUs, more than the 1 GPUs .* 0.3333 or less"):
        fit(ServeOptions(replica_gpus=0.5), 3, one_gpu)
    assert fit(ServeOptions(replica_gpus=0.3333), 3, one_gpu)[0].replica_gpus == 0.3333
    with pytest.raises(NshotError, match="pass --replica-gpus 2 or less"):
        fit(ServeOptions(replica_gpus=3.0), 2, Capacity(2.0, 4.0, "the Ray cluster"))


def test_serve_help_shows_the_replica_request_flags(capsys):
    from nshot.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--replica-cpus CPUS CPUs each replica asks Ray for" in text
    assert "min(1, 0.9 x the cluster's CPUs / replicas)" in text
    assert "--replica-gpus GPUS GPUs each replica asks Ray for" in text


def test_single_method_replica_request_is_checked_before_ray(untrained_tail_checkpoint, capsys):
    from nshot.cli import main

    argv = ["serve", "tail", "--checkpoint", str(untrained_tail_checkpoint)]
    assert main([*argv, "--port", str(_free_port()), "--replica-cpus", "-0.5"]) == 2
    assert "--replica-cpus -0.5: a replica asks a number of CPUs above 0" in capsys.readouterr().err


def test_write_config_refuses_an_explicit_request_the_cluster_cannot_hold(
    runs_dir, tmp_path, capsys
):
    from nshot.cli import main

    out = tmp_path / "serve.yaml"
    base = ["serve", "--all", str(runs_dir), "--write-config", str(out)]
    assert main([*base, "--replicas", "2", "--replica-cpus", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "--replica-cpus 1: 4 replicas (2 applications x 2) x 1 CPU = 4 CPUs, more than the 2 "
        "CPUs of the Ray cluster; pass --replica-cpus 0.5 or less" in err
    )
    # more GPUs than any test machine has: refused whether it has a GPU or none
    assert main([*base, "--replicas", "64", "--replica-gpus", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--replica-gpus 1: 128 replicas (2 applications x 64) x 1 GPU = 128 GPUs" in err
    assert not out.exists()
    assert main([*base, "--replicas", "2", "--replica-cpus", "0.5"]) == 0
    args = [a["args"] for a in yaml.safe_load(out.read_text())["applications"]]
    assert [(a["replica_cpus"], a["replica_gpus"]) for a in args] == [(0.5, 0.0)] * 2


def test_start_all_refuses_an_explicit_request_before_deploying(runs_dir):
    from ray import serve

    from nshot.serve import start_all
    from nshot.serve.app import ServeOptions
    from nshot.serve.runs import find_runs

    runs = find_runs(runs_dir)
    with pytest.raises(NshotError, match=r"2 replicas \(2 applications x 1\) x 1.5 CPU = 3 CPUs"):
        start_all(runs.chosen, port=_free_port(), options=ServeOptions(replica_cpus=1.5))
    from ray.serve.exceptions import RayServeException

    try:
        deployed = serve.status().applications
    except RayServeException:  # no Serve instance: nothing was deployed either
        deployed = {}
    assert not set(deployed) & {"tail", "urs"}


@pytest.fixture(scope="module")
def more_apps_than_cpus(runs_dir, tmp_path_factory):
    """A storage folder with four methods' runs (the TAIL and URS runs above, TimeMoDE and
    ModHNN trained at smoke): one application each, more than the tests' two CPUs."""
    from nshot.train import Scaling, fit

    root = tmp_path_factory.mktemp("four-runs")
    shutil.copytree(runs_dir / "tail-new", root / "tail-new")
    shutil.copytree(runs_dir / "urs-1", root / "urs-1")
    for method in ("timemode", "modhnn"):
        cfg = get(method).config("smoke")
        fit(method, cfg, scaling=Scaling(workers=0), storage=root, name=f"{method}-1")
    return root


def test_written_config_brings_up_more_applications_than_cpus(
    more_apps_than_cpus, tmp_path, capsys
):
    """`nshot serve --all RUNS --write-config FILE` then `serve run FILE`, as Ray's CLI deploys
    a config (Serve's controller builds each application from `app_builder` and its args):
    four applications on a Ray of two CPUs all come up and answer, where four replicas of 1 CPU
    would leave two of them waiting forever."""
    import time
    import urllib.request

    import ray
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    from nshot.cli import main

    cpus = ray.cluster_resources()["CPU"]
    assert cpus == 2  # the tests' shared Ray (conftest)
    out, port = tmp_path / "serve.yaml", _free_port()
    argv = ["serve", "--all", str(more_apps_than_cpus), "--write-config", str(out)]
    assert main([*argv, "--port", str(port)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "4 replicas (4 applications x 1) at 1 CPU each would need 4 CPUs, more than the 2 CPUs "
        "of the Ray cluster: each replica asks 0.45 CPU instead (0.9 x 2 / 4" in said
    )
    config = ServeDeploySchema.model_validate(yaml.safe_load(out.read_text()))
    names = [a.name for a in config.applications]
    assert names == ["modhnn", "tail", "timemode", "urs"]
    assert {a.args["replica_cpus"] for a in config.applications} == {0.45}
    client = serve_api.serve_start(  # what `serve run FILE` does with a config file
        http_options=config.http_options.model_dump(),
        proxy_location=config.proxy_location,
        grpc_options=gRPCOptions(**config.grpc_options.model_dump()),
        controller_options=config.controller_options,
    )
    try:
        client.deploy_apps(config, _blocking=False)
        deadline = time.monotonic() + 240
        while True:
            status = {n: a.status for n, a in serve.status().applications.items()}
            if all(status.get(n) == "RUNNING" for n in names):
                break
            assert "DEPLOY_FAILED" not in status.values(), status
            assert time.monotonic() < deadline, (status, ray.available_resources())
            time.sleep(1)
        for name in names:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{name}/healthz") as resp:
                assert resp.status == 200
        details = client.get_serve_details()["applications"]
        for name in names:
            deployment = details[name]["deployments"]["MethodServer"]
            assert deployment["deployment_config"]["ray_actor_options"]["num_cpus"] == 0.45
    finally:
        for name in names:
            serve.delete(name)
        serve.shutdown()
