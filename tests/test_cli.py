"""The `nshot` command line, in-process (sharing the session's Ray) and as an installed script."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _ray_stub import RayStarted

from nshot.cli import main


def _json_out(capsys) -> dict:
    return json.loads(capsys.readouterr().out)  # --json: stdout holds the JSON only


def test_list_as_installed_script():
    res = subprocess.run(
        [sys.executable, "-m", "nshot.cli", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    tail = next(r for r in rows if r["name"] == "tail")
    assert (
        tail["presets"]
        == [
            "paper",
            "quickstart",
            "small",
            "small-v1",
            "smoke",
            "tabular",
        ]
        and "TAIL" in tail["paper"]
    )


def test_user_errors_exit_2_with_one_line(capsys, tmp_path):
    assert main(["train", "nope", "--preset", "smoke"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert main(["train", "tail", "--preset", "smoke", "--set", "depth=0"]) == 2
    assert "field 'depth'" in capsys.readouterr().err
    assert main(["train", "tail", "--preset", "smoke", "--set", "colour=red"]) == 2
    assert "field 'colour': unknown field" in capsys.readouterr().err
    assert main(["eval", "tail", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.usefixtures("ray_session")
def test_train_then_eval(capsys, tmp_path):
    code = main(
        ["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--name", "r", "--json"]
    )
    assert code == 0
    out = _json_out(capsys)
    assert out["metrics"]["step"] == 50.0 and out["checkpoint"].endswith("checkpoint_00000050")
    code = main(
        ["eval", "tail", "--checkpoint", str(tmp_path / "r"), "--set", "eval_episodes=10", "--json"]
    )
    assert code == 0
    metrics = _json_out(capsys)["metrics"]
    for key in ("acc_seen_5w5s", "acc_unseen_modality_5w5s", "acc_digits_5w5s", "acc_20way"):
        assert 0.0 <= metrics[key] <= 1.0
    # the run exists now: training it again needs --resume or --overwrite
    assert (
        main(["train", "tail", "--preset", "smoke", "--storage", str(tmp_path), "--name", "r"]) == 2
    )
    assert "--resume" in capsys.readouterr().err


@pytest.mark.usefixtures("ray_session")
def test_reproduce_writes_three_files(capsys, tmp_path):
    code = main(
        [
            "reproduce", "tail", "--preset", "smoke", "--out", str(tmp_path / "res"),
            "--set", "eval_episodes=10", "--set", "steps=20", "--json",
        ]
    )  # fmt: skip
    assert code == 0
    for f in ("results.json", "results.md", "results.png"):
        assert (tmp_path / "res" / f).stat().st_size > 0
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert set(data) >= {"method", "preset", "seeds", "metrics", "rows", "runtime_s"}
    assert list(data["rows"]) == [
        "tail",
        "protohead",
        "linear_probe",
        "no_projection",
        "fixed_label_slots",
    ]
    assert data["metrics"]["acc_20way"] == {"higher_is_better": True}
    assert data["rows"]["fixed_label_slots"]["acc_20way"] is None  # n/a: only max_ways slots
    assert 0.0 <= data["rows"]["tail"]["acc_unseen_modality_5w5s"] <= 1.0
    assert "acc_unseen_modality_5w5s_std" in data["rows"]["tail"]
    md = (tmp_path / "res" / "results.md").read_text()
    assert "| tail |" in md and "n/a" in md


def test_nshot_cluster_is_the_local_cluster_tool(tmp_path, capsys):
    from nshot.cli import main

    assert main(["cluster", "status", "--state-dir", str(tmp_path)]) == 1
    assert "no local cluster recorded" in capsys.readouterr().out
    assert main(["cluster", "stop", "--state-dir", str(tmp_path)]) == 0
    with pytest.raises(SystemExit):
        main(["cluster", "--help"])
    assert "usage: nshot cluster" in capsys.readouterr().out


def test_reproduce_all_runs_each_method_then_writes_the_report_and_a_scoreboard(
    capsys, tmp_path, monkeypatch
):
    """`nshot reproduce --all --only A,B --out DIR`: two quick `smoke` comparisons (in this
    process, without Ray), each into DIR/<method>/ with its run recorded, then the report over
    them and one scoreboard line per method."""
    monkeypatch.setenv("NSHOT_IN_PROCESS", "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "all"
    code = main(["reproduce", "--all", "--preset", "smoke", "--out", str(out),
                 "--only", "iclft,caos"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("caos", "iclft"):
        for f in ("results.json", "results.md", "results.png"):
            assert (out / name / f).stat().st_size > 0, (name, f)
        data = json.loads((out / name / "results.json").read_text())
        assert data["method"] == name and data["preset"] == "smoke"
        run = data["run"]
        assert run["config"]["preset"] == "smoke" and run["overrides"] == {}
        assert run["wall_s"] > 0 and run["cpu_count"] >= 1 and "dirty" in run
        assert run["commit"] is None or len(run["commit"]) == 40
    assert (out / "report" / "index.html").is_file() and (out / "report" / "report.md").is_file()
    board = [line for line in captured.out.splitlines() if line.startswith("made")]
    assert [line.split()[1] for line in board] == ["caos", "iclft"]  # the registry's order
    assert all("paper claims" in line and " s; " in line for line in board)
    assert "caos: reproducing `smoke` (1 of 2)" in captured.err


def test_reproduce_all_refuses_what_it_cannot_do(capsys, tmp_path):
    assert main(["reproduce", "--all", "tail", "--out", str(tmp_path)]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert main(["reproduce", "--all", "--set", "steps=2", "--out", str(tmp_path)]) == 2
    assert "--set applies to one method" in capsys.readouterr().err
    assert main(["reproduce", "--all", "--only", "tail,nope", "--out", str(tmp_path)]) == 2
    assert "unknown method(s) ['nope']" in capsys.readouterr().err
    assert main(["reproduce", "--all", "--preset", "huge", "--out", str(tmp_path)]) == 2
    assert main(["reproduce"]) == 2
    assert "or --all" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.usefixtures("ray_session")
def test_reproduce_all_on_a_cluster_runs_one_ray_task_per_method(capsys, tmp_path, monkeypatch):
    """With RAY_ADDRESS naming a cluster (here: the session's Ray), each method runs as a Ray
    task in a scratch folder of its node and its files come back into DIR/<method>/."""
    import ray

    monkeypatch.delenv("NSHOT_IN_PROCESS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    out = tmp_path / "all"
    assert main(["reproduce", "--all", "--preset", "smoke", "--out", str(out),
                 "--only", "caos"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "1 reproductions submitted to the cluster as Ray tasks" in captured.err
    assert sorted(p.name for p in (out / "caos").iterdir()) == [
        "results.json", "results.md", "results.png", "smoke-sizes.png"
    ]  # fmt: skip
    run = json.loads((out / "caos" / "results.json").read_text())["run"]
    assert run["ray_cpus"] >= 1  # the task's own view of the cluster
    assert [line.split()[:2] for line in captured.out.splitlines()] == [["made", "caos"]]


# --------------------------------------------------------------------------- a finished CLI


def _parsers(parser):
    """``parser`` and every subcommand's parser below it."""
    import argparse

    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_version(capsys):
    import nshot

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"nshot {nshot.__version__}\n"


def test_every_argument_of_every_subcommand_has_help():
    import argparse

    from nshot import cli

    parsers = list(_parsers(cli.build_parser()))
    assert {p.prog for p in parsers} >= {"nshot", "nshot train", "nshot new", "nshot claims"}
    for parser in parsers:
        for action in parser._actions:
            name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
            if action.help == argparse.SUPPRESS:  # only a deprecated spelling is hidden
                assert isinstance(action, cli._Deprecated), name
                continue
            assert action.help and action.help.strip(), f"{name} has no help"
        parser.format_help()  # every help expands (%(choices)s included)


def test_method_arguments_list_the_registered_methods():
    from nshot import cli
    from nshot.method import available

    assert cli.method_names() == available()  # read without importing a method
    text = next(p for p in _parsers(cli.build_parser()) if p.prog == "nshot train").format_help()
    assert "METHOD" in text and "unpaired_iv" in " ".join(text.split())


def test_a_third_party_method_is_a_choice(monkeypatch):
    """A method registered outside nshot (here: in this process) is listed and accepted."""
    import nshot.method as registry
    from nshot import cli
    from nshot.method import get

    class Plugin(type(get("caos"))):
        name = "plugin_method"

    monkeypatch.setattr(registry, "_REGISTRY", {**registry._REGISTRY, "plugin_method": Plugin})
    assert "plugin_method" in cli.method_names()
    args = cli.build_parser().parse_args(["eval", "plugin_method", "--checkpoint", "x"])
    assert args.method == "plugin_method" and cli._method("plugin_method").name == "plugin_method"


def test_output_is_a_deprecated_spelling_of_storage(capsys):
    from nshot.cli import _current_spelling, build_parser

    for cmd in ("train", "tune"):
        parser = build_parser()
        args = parser.parse_args([cmd, "tail", "--output", "/x"])
        assert args.storage == "/x"
        err = capsys.readouterr().err.splitlines()
        assert err == ["nshot: warning: --output is deprecated; use --storage"]
        assert build_parser().parse_args([cmd, "tail", "--storage", "/y"]).storage == "/y"
        assert (
            "--output"
            not in next(p for p in _parsers(parser) if p.prog == f"nshot {cmd}").format_help()
        )
    assert capsys.readouterr().err == ""  # --storage: no note
    # the resume command an interrupted run prints spells it as it is now
    assert _current_spelling(["train", "tail", "--output", "/x", "--output=/y"]) == [
        "train", "tail", "--storage", "/x", "--storage=/y"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "argv, usage, hint",
    [
        (["train", "tail", "--stoarge", "/x"], "usage: nshot train", "did you mean '--storage'?"),
        (["list", "--jsn"], "usage: nshot list", "did you mean '--json'?"),
        (["reproduce", "tail", "--in-procss"], "usage: nshot reproduce", "'--in-process'?"),
        (["tune", "tail", "--scheduler", "ash"], "usage: nshot tune", "did you mean 'asha'?"),
        (["trian", "tail"], "usage: nshot [-h]", "did you mean 'train'?"),
        (["history", "--zzz"], "usage: nshot history", "unrecognized arguments: --zzz"),
    ],
)
def test_a_bad_option_prints_the_subcommands_usage_and_a_close_one(
    argv, usage, hint, capsys, monkeypatch
):
    from nshot import cli

    def ran(args):
        raise AssertionError(f"nshot {args.command} ran")

    for name in dir(cli):  # a command line that parses must not run its command here
        if name.startswith("cmd_"):
            monkeypatch.setattr(cli, name, ran)
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and hint in err, err
    assert err.strip().splitlines()[-1].startswith(("nshot: error:", f"{usage[7:]}: error:"))


@pytest.mark.usefixtures("ray_refused")
@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "tial"], "unknown method 'tial' (did you mean 'tail'?)"),
        (["train", "tail", "--preset", "smok"], "no preset 'smok' (did you mean 'smoke'?)"),
        (["train", "tail", "--set", "dept=3"], "field 'dept': unknown field (did you mean 'depth'"),
        (["train", "tail", "--set", "depth=0"], "field 'depth'"),
        (["train", "tail", "--scale", "cpu3"], "--scale: unknown preset 'cpu3' (did you mean"),
        (["train", "tail", "--workers", "-1"], "--workers"),
        (["eval", "tial", "--checkpoint", "x"], "(did you mean 'tail'?)"),
        (["eval", "tail", "--checkpoint", "x", "--set", "eval_episods=1"], "'eval_episodes'?"),
        (["tune", "tail", "--search", "optna"], "unknown searcher 'optna' (did you mean 'optuna'"),
        (["tune", "tail", "--preset", "smoke", "--num-samples", "0"], "--num-samples"),
        (["tune", "tail", "--space", "{not json"], "space"),
        (["reproduce", "tail", "--preset", "huge"], "no preset 'huge'"),
        (["reproduce", "tail", "--set", "stesp=2"], "(did you mean 'steps'?)"),
        (["reproduce", "--all", "--only", "tail,tial"], "unknown method(s) ['tial']"),
        (["history", "--method", "tial"], "unknown method 'tial' (did you mean 'tail'?)"),
        (["serve", "tial", "--checkpoint", "x"], "(did you mean 'tail'?)"),
        (["bench", "train", "--method", "tial"], "(did you mean 'tail'?)"),
        (["bench", "train", "--preset", "smal"], "(did you mean 'small'?)"),
        (["bench", "serve", "--levels", "1,x"], "--levels '1,x'"),
        (["bench", "serve", "--ingress", "proxi"], "(did you mean 'proxy'?)"),
        (["quickstart", "--preset", "smal"], "(did you mean 'small'?)"),
        (["claims", "tial"], "(did you mean 'tail'?)"),
        (["claims", "tail", "--preset", "smal"], "(did you mean 'small'?)"),
    ],
)
def test_bad_arguments_are_refused_before_ray_starts(argv, message, capsys, tmp_path):
    argv = [*argv, "--out", str(tmp_path)] if argv[0] == "reproduce" else argv
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nshot: error: ") and message in err[0], err


@pytest.mark.usefixtures("ray_refused")
def test_the_stand_in_sees_a_command_that_passes_its_checks(tmp_path):
    """The counterpart of the test above: good arguments do reach ``ray.init``."""
    with pytest.raises(RayStarted):
        main(["tune", "tail", "--preset", "smoke", "--scheduler", "asha", "--num-samples", "1",
              "--storage", str(tmp_path), "--no-history"])  # fmt: skip


def test_history_of_a_known_method_without_sweeps_is_an_empty_table(capsys, tmp_path):
    assert main(["history", "--method", "tail", "--history", str(tmp_path), "--json"]) == 0
    assert _json_out(capsys) == []


def test_off_a_terminal_a_markdown_table_stays_intact(capsys):
    """`nshot claims tail > x.md`: one line per table row, however long, and no ANSI codes."""
    from nshot.method import get

    assert main(["claims", "tail"]) == 0  # tail's committed results/small.json
    out = capsys.readouterr().out
    assert "\x1b" not in out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| claim | kind | holds |") and rows[0].endswith("| expression |")
    assert len(rows) == 1 + len(get("tail").claims)  # the header and one line per claim
    assert all(line.endswith("|") for line in rows) and max(map(len, rows)) > 200


def test_off_a_terminal_worker_lines_come_without_colour(monkeypatch):
    """Ray's own printing of worker lines and of the errors the raylet reports (fed here by
    hand: no Ray starts), under a command's output: no colour codes, and the error every Serve
    shutdown reports is dropped."""
    import io
    import sys

    from ray._private import worker as ray_worker
    from ray._private.ray_logging import WorkerStandardStreamDispatcher

    from nshot import cli

    for var in ("RAY_COLOR_PREFIX", "NSHOT_VERBOSE", "FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)
    dispatcher = WorkerStandardStreamDispatcher()  # as ray.init sets it up on the driver
    dispatcher.add_handler(
        "ray_print_logs", lambda data: ray_worker.print_worker_logs(data, sys.stdout)
    )
    cli._quiet_serve_shutdown()  # what the commands that serve do
    shutdown = (
        "Task ServeController.graceful_shutdown failed. There are infinite retries remaining, "
        "so the task will be retried. Error: The actor is dead because it was killed by "
        "`ray.kill`."
    )
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with cli._plain_output():
        assert os.environ["RAY_COLOR_PREFIX"] == "0"
        dispatcher.emit({"pid": 4321, "ip": "h", "localhost": "h", "lines": ["hello"]})
        for line in (shutdown, "another error"):  # Ray's thread that listens for errors
            error = {"lines": [line], "pid": "raylet", "is_err": False}
            ray_worker.print_to_stdstream(error, ignore_prefix=False)
        print("\x1b[1m\x1b[32mhttp://127.0.0.1:8265\x1b[39m\x1b[22m")  # Ray's start-up line
    assert "RAY_COLOR_PREFIX" not in os.environ  # restored
    assert out.getvalue().splitlines() == [
        "(pid=4321) hello",
        "(raylet) another error",
        "http://127.0.0.1:8265",
    ]


def test_the_papers_have_one_title_in_list_and_report(capsys):
    """`nshot list` and `nshot report` read each paper's title (and area) from its method."""
    from nshot import catalog, report
    from nshot.method import available

    assert main(["list", "--json"]) == 0
    listed = {r["name"]: (r["paper"], r["area"]) for r in _json_out(capsys)}
    entries = report.gather(preset="no-such-preset")  # the table's rows, no results read
    reported = {e.name: (e.title, e.area) for e in entries}
    assert listed == reported and set(listed) == set(available())
    assert [e.name for e in entries][: len(catalog.ORDER)] == list(catalog.ORDER)
    assert [e.number for e in entries] == list(range(1, len(entries) + 1))
    assert [p.name for p in catalog.PAPERS] == [e.name for e in entries]
