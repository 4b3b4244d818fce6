"""nshot.fileio: the one atomic-write helper."""

from __future__ import annotations

import json
import stat

import pytest

from nshot.fileio import atomic_path, atomic_write, print_report


def test_atomic_write_replaces_the_file_readable_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "state.json"
    atomic_write(target, "one")
    atomic_write(target, b"two")
    assert target.read_text() == "two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = tmp_path / "table.parquet"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


def test_print_report_prints_and_writes_the_same_json(tmp_path, capsys):
    out = tmp_path / "r" / "report.json"
    text = print_report({"a": [1, 2.5], "b": None}, out)
    assert capsys.readouterr().out == text + "\n"
    assert out.read_text() == text + "\n" and json.loads(text) == {"a": [1, 2.5], "b": None}
    print_report({"c": 1})
    assert (
        json.loads(capsys.readouterr().out) == {"c": 1} and not (tmp_path / "report.json").exists()
    )
