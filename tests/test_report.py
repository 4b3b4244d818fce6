"""`nshot report`: the reproducibility report and the README's method table."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from nshot import report
from nshot.catalog import PAPERS
from nshot.method import available

ROOT = Path(__file__).parents[1]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "img":
            self.images.append(a["src"])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if "id" in a:
            self.ids.add(a["id"])


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    entries = report.gather()
    out = tmp_path_factory.mktemp("report")
    report.write(entries, out)
    return entries, out


def test_the_html_report_opens_offline_and_every_image_and_link_resolves(committed):
    entries, out = committed
    page = _Links()
    page.feed((out / "index.html").read_text())
    assert page.images, "the committed results have plots"
    for src in page.images:
        assert not src.startswith(("http:", "https:", "//", "/")), src
        assert (out / src).is_file(), src
    for href in page.links:
        assert href.startswith("#"), f"a link leaves the report: {href}"
        assert href[1:] in page.ids, href
    assert not {"script", "link", "iframe"} & page.tags  # nothing to fetch, nothing to run
    names = {p.name for p in PAPERS} | set(available())
    assert names <= page.ids, "every paper and method has a section"
    md = (out / "report.md").read_text()
    for e in entries:
        assert f"`{e.name}`" in md
        for img in e.images:
            assert f"({e.name}/{img.name})" in md


def test_the_scoreboard_counts_the_claims_of_the_committed_results(committed):
    entries, _ = committed
    with_results = [e for e in entries if e.data is not None]
    assert with_results, "methods commit results/small.json"
    for e in with_results:
        c = e.counts
        assert c["total"] + c["other_presets"] == len(e.data["claims"])
        assert c["held"] + c["failed"] + c["unevaluated"] == c["total"]
        assert e.run_date and e.run_commit  # from the results or from git
    planned = [e for e in entries if not e.registered]
    assert all(e.status == "planned" for e in planned)


def test_the_readme_method_table_is_generated_from_the_committed_results(committed):
    entries, _ = committed
    assert report.readme_table(ROOT / "README.md") == report.status_table(entries), (
        "README's method table is stale: run `nshot report --readme README.md`"
    )


def test_fresh_results_replace_the_committed_ones(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(
        json.dumps(
            {
                "method": "caos",
                "preset": "smoke",
                "seeds": 1,
                "metrics": {"coverage_a10": {"higher_is_better": True}},
                "rows": {"caos": {"coverage_a10": 0.9, "coverage_a10_std": None}},
                "runtime_s": 2.0,
                "notes": [],
                "extra": {},
                "run": {"date": "2026-12-01", "commit": "abc1234", "nshot_version": "0"},
            }
        )
    )
    (run / "results.png").write_bytes(b"\x89PNG")
    entries = {e.name: e for e in report.gather(results=[run])}
    caos = entries["caos"]
    assert caos.results_path == run / "results.json"
    assert (caos.run_date, caos.run_commit) == ("2026-12-01", "abc1234")
    assert [p.name for p in caos.images] == ["results.png"]
    assert entries["tail"].data is None  # only what was given
    with pytest.raises(Exception, match="no results.json"):
        report.gather(results=[tmp_path / "empty"])


def test_plots_belong_to_the_longest_results_stem(tmp_path):
    for name in ("small.json", "small-seed1.json", "small.png", "small-regret.png",
                 "small-seed1-regret.png", "other.png"):  # fmt: skip
        (tmp_path / name).write_text("{}")
    got = [p.name for p in report._images(tmp_path / "small.json")]
    assert got == ["small-regret.png", "small.png"]
    assert [p.name for p in report._images(tmp_path / "small-seed1.json")] == [
        "small-seed1-regret.png"
    ]


def test_nshot_report_writes_and_regenerates_a_readme_table(tmp_path, capsys):
    from nshot.cli import main

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report.README_BEGIN}\nSTALE-TABLE\n{report.README_END}\n\nrest\n")
    assert main(["report", "--out", str(tmp_path / "out"), "--readme", str(readme)]) == 0
    assert "claims:" in capsys.readouterr().out
    assert (tmp_path / "out" / "index.html").is_file()
    text = readme.read_text()
    assert "STALE-TABLE" not in text and text.endswith("rest\n") and "| 3 | `tail` |" in text
