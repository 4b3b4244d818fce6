"""`nshot reproduce` records the package versions behind its numbers and warns, before it runs,
when this machine's versions differ from those of the committed results; it records the run's
provenance (commit, tree, config, machine, time) and writes committed results only from a clean
tree."""

from __future__ import annotations

import json

import pytest

from nshot import reproduce


def test_results_record_the_versions_of_the_platform_and_the_methods_packages():
    versions = reproduce.package_versions("urs")
    assert versions["python"].count(".") == 2
    for name in ("nshot", "torch", "numpy", "ray", "pyvrp", "ortools"):
        assert isinstance(versions[name], str) and versions[name], name
    assert "pyvrp" not in reproduce.package_versions("tail")  # only the method's own
    info = reproduce.run_info("urs")
    assert info["versions"] == versions


def test_a_version_that_differs_from_the_committed_results_is_named(tmp_path, monkeypatch):
    here = reproduce.package_versions("urs")
    monkeypatch.setattr(reproduce, "method_results_dir", lambda name: tmp_path)
    assert reproduce.version_drift("urs", "small") == []  # nothing committed
    (tmp_path / "small.json").write_text(json.dumps({"run": {"date": "2026-01-01"}}))
    assert reproduce.version_drift("urs", "small") == []  # committed before versions existed
    committed = {**here, "ortools": None, "torch": "2.5.0"}
    (tmp_path / "small.json").write_text(json.dumps({"run": {"versions": committed}}))
    lines = reproduce.version_drift("urs", "small")
    assert len(lines) == 2
    assert lines[0].startswith(f"ortools {here['ortools']} here, not installed in the committed")
    assert lines[1].startswith(f"torch {here['torch']} here, 2.5.0 in the committed results")
    assert all(str(tmp_path / "small.json") in line for line in lines)
    (tmp_path / "small.json").write_text(json.dumps({"run": {"versions": here}}))
    assert reproduce.version_drift("urs", "small") == []


# --------------------------------------------------------------------------- provenance


def test_the_run_block_records_code_config_machine_and_time():
    from nshot.method import get
    from nshot.provenance import git_state

    cfg = get("caos").config("smoke", trials=10)
    info = reproduce.run_info("caos", cfg, {"trials": 10})
    git = git_state()
    assert info["commit"] == git["commit"] and info["dirty"] == git["dirty"]
    if info["commit"] is not None:  # a checkout: the full sha
        assert len(info["commit"]) == 40 and int(info["commit"], 16) >= 0
        assert isinstance(info["dirty"], bool)
        assert info["dirty_files"] == git["dirty_files"][:20]
    assert info["config"] == cfg.model_dump(mode="json") and info["config"]["trials"] == 10
    assert info["overrides"] == {"trials": 10}
    assert info["seeds"] == {k: v for k, v in info["config"].items() if "seed" in k}
    assert "seed" in info["seeds"]
    assert info["torch_threads"] >= 1 and info["cpu_count"] >= 1
    assert len(info["loadavg_start"]) == 3
    assert info["versions"] == reproduce.package_versions("caos")
    assert info["started_at"].startswith(info["date"]) and info["started_at"].endswith("Z")
    json.dumps(info)  # it goes into results.json as it is
    given = reproduce.run_info("caos", cfg, git={"commit": "f" * 40, "dirty": False})
    assert (given["commit"], given["dirty"], given["dirty_files"]) == ("f" * 40, False, [])


def _table(cfg):
    from nshot.method import ResultsTable

    return ResultsTable(
        "caos", cfg.preset, 1, {"coverage_a10": {"higher_is_better": True}},
        {"caos": {"coverage_a10": 0.9}}, runtime_s=0.0,
    )  # fmt: skip


def test_reproduce_records_its_run_and_names_committed_results_as_committed(tmp_path, monkeypatch):
    """Into the method's own results folder the files get the committed names (``smoke.json``,
    the extra plots ``smoke-*.png``) and the comparison works elsewhere; anywhere else they are
    ``results.*`` beside what the comparison wrote."""
    from nshot.method import get

    caos = get("caos")
    seen = []

    def fake_experiments(cfg, workdir):
        seen.append(workdir)
        (workdir / "sizes.png").write_bytes(b"\x89PNG")
        return _table(cfg)

    monkeypatch.setattr(type(caos), "experiments", lambda self, cfg, w: fake_experiments(cfg, w))
    committed = tmp_path / "committed"
    monkeypatch.setattr(reproduce, "method_results_dir", lambda name: committed)
    cfg = caos.config("smoke")
    data = reproduce.run("caos", cfg, committed, {"seed": 0})
    assert sorted(p.name for p in committed.iterdir()) == [
        "smoke-sizes.png", "smoke.json", "smoke.md", "smoke.png"
    ]  # fmt: skip
    assert seen[0] != committed and not seen[0].exists()  # a scratch folder, removed
    run = json.loads((committed / "smoke.json").read_text())["run"]
    assert run == data["run"] and run["overrides"] == {"seed": 0}
    assert run["wall_s"] >= 0 and "ray_cpus" in run
    assert "Run " in (committed / "smoke.md").read_text()
    other = tmp_path / "other"
    reproduce.run("caos", cfg, other)
    assert sorted(p.name for p in other.iterdir()) == [
        "results.json", "results.md", "results.png", "sizes.png"
    ]  # fmt: skip


def test_reproduce_refuses_a_dirty_tree_into_committed_results_before_any_work(monkeypatch):
    from nshot import provenance
    from nshot.errors import NshotError
    from nshot.method import get

    root = provenance.repo_root()
    if root is None:
        pytest.skip("not a git checkout")
    caos = get("caos")
    monkeypatch.setattr(
        type(caos), "experiments", lambda self, cfg, w: (_ for _ in ()).throw(AssertionError)
    )
    files = [f"methods/caos/f{i}.py" for i in range(7)]
    monkeypatch.setattr(provenance, "dirty_files", lambda root: files)
    with pytest.raises(NshotError) as err:
        reproduce.run("caos", caos.config("small"), root / "methods" / "caos" / "results")
    msg = str(err.value)
    assert "f0.py, " in msg and "f4.py and 2 more" in msg and "f5.py" not in msg


def test_files_from_a_remote_run_get_the_destinations_names(tmp_path):
    files = {"results.json": b"{}", "results.md": b"#", "results.png": b"P", "sizes.png": b"S",
             "small-curve.png": b"C"}  # fmt: skip
    reproduce._install(files, tmp_path / "committed", "small")
    assert sorted(p.name for p in (tmp_path / "committed").iterdir()) == [
        "small-curve.png", "small-sizes.png", "small.json", "small.md", "small.png"
    ]  # fmt: skip
    reproduce._install(files, tmp_path / "out", "results")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(files)
