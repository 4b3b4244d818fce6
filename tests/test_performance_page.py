"""docs/performance.md: its benchmark tables are generated from the committed JSON they name."""

from __future__ import annotations

import json
from pathlib import Path

from nshot import bench

ROOT = Path(__file__).parents[1]


def test_every_marked_table_is_generated_from_its_committed_json():
    page = (ROOT / "docs" / "performance.md").read_text()
    found = list(bench.PAGE_TABLE.finditer(page))
    assert len(found) >= 2, "the page's serve tables carry their generator markers"
    for m in found:
        data = json.loads((ROOT / m["path"]).read_text())
        assert m["table"] == bench.serve_rows(data), (
            f"{m['path']}: the table differs from the JSON; regenerate it with "
            "nshot.bench.update_page('docs/performance.md', '.')"
        )


def test_update_page_rewrites_a_stale_table(tmp_path):
    src = ROOT / "methods" / "tail" / "results" / "serve-bench.json"
    (tmp_path / "b.json").write_text(src.read_text())
    page = tmp_path / "p.md"
    page.write_text(
        "x\n<!-- nshot:bench-table b.json -->\n| old |\n<!-- nshot:bench-table:end -->\ny\n"
    )
    assert bench.update_page(page, tmp_path) is True
    text = page.read_text()
    assert "| old |" not in text and "| block | system | 1 client |" in text
    assert bench.update_page(page, tmp_path) is False  # generated: nothing left to change
