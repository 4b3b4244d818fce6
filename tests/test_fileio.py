"""nshot.fileio: the one atomic-write helper."""

from __future__ import annotations

import stat

import pytest

from nshot.fileio import atomic_path, atomic_write


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
