"""The `nshot` command line, in-process (sharing the session's Ray) and as an installed script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    assert tail["presets"] == ["paper", "small", "smoke", "tabular"] and "TAIL" in tail["paper"]


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
        ["train", "tail", "--preset", "smoke", "--output", str(tmp_path), "--name", "r", "--json"]
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
        main(["train", "tail", "--preset", "smoke", "--output", str(tmp_path), "--name", "r"]) == 2
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
