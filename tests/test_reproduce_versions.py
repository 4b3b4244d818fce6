"""`nshot reproduce` records the package versions behind its numbers and warns, before it runs,
when this machine's versions differ from those of the committed results."""

from __future__ import annotations

import json

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
