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
        if href.startswith("#"):
            assert href[1:] in page.ids, href
        else:  # the papers' own pages: the only links that leave the report
            assert href.startswith("https://"), f"a link leaves the report: {href}"
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
    from nshot.provenance import history_available

    if not history_available(ROOT):
        pytest.skip("no git history here: the table's freshness flags cannot be re-derived")
    entries, _ = committed
    assert report.readme_table(ROOT / "README.md") == report.status_table(entries, ROOT), (
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


def _claim(kind, holds, **kw):
    return {"id": f"{kind}-{holds}", "kind": kind, "holds": holds, "statement": "s.",
            "source": "T1", "expr": "a.m > b.m", "lhs": 1.0, "rhs": 0.5, "p": None, **kw}  # fmt: skip


def _entry(claims, fresh=None, name="caos"):
    from nshot.provenance import Freshness

    e = report.Entry(13, name, "A paper", "uncertainty", True)
    e.data = {"method": name, "preset": "small", "seeds": 3, "runtime_s": 12.0, "claims": claims,
              "metrics": {"m": {"higher_is_better": True}}, "rows": {"a": {"m": 1.0}}}  # fmt: skip
    e.fresh = Freshness(*fresh) if fresh else Freshness("fresh", "", "made at abc")
    e.run_date, e.run_commit = "2026-12-01", "abc1234"
    return e


def test_the_status_reads_headline_first_then_paper_claims_then_checks():
    claims = [
        _claim("headline", True), _claim("ablation", True), _claim("ablation", False),
        _claim("control", None), *[_claim("check", True) for _ in range(12)],
        _claim("check", None, applies=False),  # stated for another preset: not counted
    ]  # fmt: skip
    e = _entry(claims)
    assert e.status == (
        "partial: headline holds; 2 of 4 paper claims hold (1 fail, 1 not evaluable); "
        "12 checks hold, `small`"
    )
    every = _entry([_claim("headline", True), _claim("control", True), _claim("check", True)])
    assert every.status == (
        "**implemented**: headline holds; 2 of 2 paper claims hold; 1 check holds, `small`"
    )
    # every claim holds, but no headline is declared: not implemented
    no_head = _entry([_claim("ablation", True), _claim("check", False)])
    assert no_head.status == (
        "partial: no headline claim; 1 of 1 paper claims hold; "
        "0 of 1 checks hold (1 fail, 0 not evaluable), `small`"
    )
    untyped = _entry([_claim("headline", False), _claim(None, True)])
    assert untyped.status == (
        "partial: headline fails; 0 of 1 paper claims hold (1 fail, 0 not evaluable); "
        "1 of 1 claims of no kind hold, `small`"
    )
    unevaluable = _entry([_claim("headline", True), _claim("headline", None)])
    assert unevaluable.status.startswith("partial: headline not evaluable; 1 of 2 paper")


def test_a_stale_result_is_flagged_in_the_readme_markdown_and_red_in_html(tmp_path):
    claims = [_claim("headline", True), _claim("check", True)]
    fresh = _entry(claims, name="caos")
    stale = _entry(claims, ("stale", "dirty tree", "made from a dirty tree at abc"), "tail")
    assert "stale" not in fresh.status
    assert stale.status.endswith(", `small`; **stale**: dirty tree")
    table = report.status_table([fresh, stale])
    assert "| `tail` |" in table and table.count("**stale**: dirty tree") == 1
    md = report.to_markdown([fresh, stale])
    board = [line for line in md.splitlines() if line.startswith("| tail |")]
    assert board and board[0].endswith("| stale: dirty tree |")
    assert "Result stale: dirty tree: made from a dirty tree at abc." in md
    page = report.to_html([fresh, stale])
    assert page.count('<tr class="stale">') == 1
    assert '<span class="no">stale: dirty tree</span>' in page
    assert '<p class="stale">Result stale: dirty tree' in page
    lines = report.scoreboard_lines([fresh, stale])
    assert lines[0].split() == ["caos", "headline", "holds;", "1", "of", "1", "paper", "claims",
                                "hold;", "1", "check", "holds;", "12", "s;", "fresh"]  # fmt: skip
    assert lines[1].endswith("12 s; stale: dirty tree")


def test_the_html_claims_table_shows_kind_effect_and_premise():
    effect = {"mean_diff": 0.25, "ci95": [0.1, 0.4], "n": 5, "dz": 1.2}
    claims = [
        _claim("check", True),
        _claim(
            "headline",
            True,
            test="paired_t",
            alpha=0.05,
            p=0.01,
            effect=effect,
            requires="b.m > 0.1",
        ),  # fmt: skip
    ]
    page = report.to_html([_entry(claims)])
    assert "<th>kind</th>" in page and "<th>effect (95 % CI)</th>" in page
    assert "0.25 [0.1, 0.4], n=5" in page and "if b.m &gt; 0.1" in page
    assert page.index("headline-True") < page.index("check-True")  # headline first


def test_the_committed_results_carry_their_freshness(committed):
    entries, _ = committed
    for e in entries:
        if e.data is not None:
            assert e.fresh is not None and e.fresh.state in ("fresh", "stale", "unknown")
            assert ("**stale**" in e.status) is e.stale


def test_the_committed_report_is_generated_from_the_committed_results(committed):
    """``docs/report`` is what ``nshot report`` writes from the committed results: the same
    pages, plots linked where they are committed (no copies), each relative link resolving."""
    from nshot.provenance import history_available

    if not history_available(ROOT):
        pytest.skip("no git history here: the report's freshness flags cannot be re-derived")
    entries, _ = committed
    docs = ROOT / "docs" / "report"
    stale = "the committed report is stale: run `nshot report --readme README.md`"
    assert (docs / "report.md").read_text() == report.to_markdown(entries, docs), stale
    assert (docs / "index.html").read_text() == report.to_html(entries, docs), stale
    assert not list(docs.glob("*/*.png")), "plots are linked, not copied"
    page = _Links()
    page.feed((docs / "index.html").read_text())
    for ref in [*page.images, *page.links]:
        if not ref.startswith(("#", "https://")):
            assert (docs / ref).resolve().is_file(), ref
    md = (docs / "report.md").read_text()
    for e in entries:
        if e.data is not None:
            assert f"`nshot reproduce {e.name} --preset small --out methods/{e.name}/results`" in md


def test_the_readme_table_links_each_method_page_and_paper(committed):
    entries, _ = committed
    table = report.status_table(entries, ROOT)
    for e in entries:
        if e.registered:
            assert f"[`{e.name}`](methods/{e.name}/README.md)" in table
    caos = next(e for e in entries if e.name == "caos")
    assert f"[{caos.title}](https://arxiv.org/abs/2601.05219)" in table


def test_html_shows_markdown_code_as_code_not_backticks(committed):
    entries, out = committed
    text = (out / "index.html").read_text()
    for e in entries:
        if e.data is not None:
            assert f"Status: {report.inline(e.status)}." in text
    assert "`small`" not in text  # the statuses' code spans are <code>, not backticks
