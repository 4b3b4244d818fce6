"""Paper claims as data: the expression language, evaluation, paired tests, `nshot claims`."""

from __future__ import annotations

import json

import pytest

from nshot.claims import Claim, ClaimError, evaluate, summary, summary_line, to_markdown

RESULTS = {
    "method": "tail",
    "rows": {
        "tail": {"acc": 0.8, "acc_std": 0.01, "loss": 0.2},
        "base": {"acc": 0.6, "acc_std": 0.02, "loss": None},
    },
    "extra": {"equivariance": {"gmn": 1e-9}, "odd/key": 3.0},
    "samples": {"tail": {"acc": [0.79, 0.80, 0.81]}, "base": {"acc": [0.58, 0.61, 0.61]}},
}


def _claim(expr: str, **kw) -> Claim:
    return Claim(id="c", statement="a claim.", source="Table 1", expr=expr, **kw)


@pytest.mark.parametrize(
    ("expr", "holds", "lhs", "rhs"),
    [
        ("tail.acc > base.acc", True, 0.8, 0.6),
        ("tail.acc < base.acc", False, 0.8, 0.6),
        ("tail.acc - base.acc >= 0.15", True, pytest.approx(0.2), 0.15),
        ("tail.acc / base.acc >= 1.5", False, pytest.approx(4 / 3), 1.5),
        ("abs(tail.acc - 0.8) <= 1e-9", True, 0.0, 1e-9),
        ("extra('equivariance', 'gmn') <= 1e-6", True, 1e-9, 1e-6),
        ("extra('odd/key') == 3", True, 3.0, 3.0),
        ("0.5 < tail.acc <= 0.9", True, 0.5, 0.8),
        ("tail.acc > 0.5 and base.acc > 0.7", False, 0.8, 0.5),
        ("max(tail.acc, base.acc) == tail.acc", True, 0.8, 0.8),
        ("-tail.acc < 0", True, -0.8, 0.0),
    ],
)
def test_expressions_evaluate_over_rows_metrics_and_extra(expr, holds, lhs, rhs):
    out = _claim(expr).evaluate(RESULTS)
    assert out["holds"] is holds
    assert out["lhs"] == lhs and out["rhs"] == rhs
    assert set(out) >= {"id", "statement", "source", "expr", "holds", "lhs", "rhs", "p"}


@pytest.mark.parametrize(
    "expr",
    [
        "base.loss < 1",  # null value
        "missing.acc > 0",  # row not run
        "tail.nosuch > 0",  # metric not run
        "extra('nosuch') > 0",
        "tail.acc / (base.acc - base.acc) > 0",  # division by zero
    ],
)
def test_a_claim_that_cannot_be_evaluated_is_null_never_true(expr):
    assert _claim(expr).evaluate(RESULTS)["holds"] is None


@pytest.mark.parametrize(
    "expr",
    [
        "tail.acc",  # not a comparison
        "__import__('os').system('true') == 0",
        "tail.acc.x > 1",
        "tail.acc > 1 or base.acc > 1",
        "tail.acc ** 2 > 1",
        "'a' == 'a'",
        "tail.acc in base.acc",
        "lambda: 1",
        "tail.acc > True",
        "open('x') == 1",
        "extra(tail.acc) > 0",
    ],
)
def test_only_the_claim_language_parses(expr):
    with pytest.raises(ClaimError, match="claim 'c'"):
        _claim(expr)


def test_paired_test_needs_samples_and_a_small_p():
    c = _claim("tail.acc > base.acc", test="paired_t")
    out = c.evaluate(RESULTS)
    assert out["holds"] is True and 0 <= out["p"] < 0.05
    reverse = _claim("tail.acc < base.acc", test="paired_t").evaluate(RESULTS)
    assert reverse["holds"] is False and reverse["p"] > 0.5
    no_samples = {**RESULTS, "samples": {}}
    assert c.evaluate(no_samples)["holds"] is None  # a test that cannot run is not a pass
    noisy = {
        **RESULTS,
        "samples": {"tail": {"acc": [0.9, 0.5, 0.95]}, "base": {"acc": [0.6, 0.7, 0.5]}},
    }
    weak = c.evaluate(noisy)  # the means differ, the paired test is not convinced
    assert weak["lhs"] > weak["rhs"] and weak["p"] > 0.05 and weak["holds"] is False
    with pytest.raises(ClaimError, match="paired test needs one comparison"):
        _claim("tail.acc - base.acc > 0", test="paired_t")
    with pytest.raises(ClaimError, match="test must be one of"):
        _claim("tail.acc > base.acc", test="ttest")


def test_a_claim_stated_for_some_presets_is_not_evaluated_on_others():
    c = _claim("tail.acc > base.acc", presets=("small", "paper"))
    assert c.evaluate({**RESULTS, "preset": "small"})["holds"] is True
    smoke = c.evaluate({**RESULTS, "preset": "smoke"})
    assert smoke["holds"] is None and "small/paper" in smoke["note"]
    both = evaluate([c, _claim("tail.acc > 0.5")], {**RESULTS, "preset": "smoke"})
    assert summary(both) == {
        "held": 1, "failed": 0, "unevaluated": 0, "total": 1, "other_presets": 1,
        "other_experiments": 0,
    }  # fmt: skip
    assert summary_line(both) == "claims: 1 of 1 hold; 1 stated for other presets"


def test_a_claim_scoped_to_an_experiment_reads_only_its_results():
    """``Claim.experiment``: read on results whose ``experiment`` field names it; the method's
    other claims read only its main comparison (results without the field)."""
    scoped = _claim("tail.acc > base.acc", experiment="curve")
    main = _claim("tail.acc > 0.5")
    on_curve = evaluate([scoped, main], {**RESULTS, "experiment": "curve"})
    assert on_curve[0]["holds"] is True
    assert on_curve[1]["holds"] is None and on_curve[1]["note"] == "stated for the main comparison"
    on_main = evaluate([scoped, main], RESULTS)
    assert on_main[1]["holds"] is True
    assert on_main[0]["holds"] is None and on_main[0]["note"] == "stated for the curve experiment"
    assert summary(on_main) == {
        "held": 1, "failed": 0, "unevaluated": 0, "total": 1, "other_presets": 1,
        "other_experiments": 1,
    }  # fmt: skip
    assert summary_line(on_main) == "claims: 1 of 1 hold; 1 for another experiment"
    other = evaluate([scoped], {**RESULTS, "experiment": "another"})
    assert other[0]["holds"] is None and other[0]["applies"] is False


def test_summary_table_and_line():
    claims = [_claim("tail.acc > base.acc"), _claim("tail.acc < base.acc"), _claim("x.y > 0")]
    evaluated = evaluate(claims, RESULTS)
    assert summary(evaluated) == {
        "held": 1, "failed": 1, "unevaluated": 1, "total": 3, "other_presets": 0,
        "other_experiments": 0,
    }  # fmt: skip
    assert summary_line(evaluated) == "claims: 1 of 3 hold (1 fail, 1 not evaluable)"
    md = to_markdown(evaluated)
    assert "| c | yes |" in md and "| c | **no** |" in md and "| c | n/a |" in md


def test_every_registered_claim_parses_and_names_declared_rows_and_metrics():
    """A method's claims read only rows its experiments produce and metrics it declares
    (checked against its committed small results where they exist: ``small.json``, or
    ``small-<experiment>.json`` for a claim scoped to another experiment)."""
    from pathlib import Path

    from nshot.method import available, get
    from nshot.reproduce import committed_results_name

    root = Path(__file__).parents[1] / "methods"
    for name in available():
        method = get(name)
        ids = [c.id for c in method.claims]
        assert len(ids) == len(set(ids)), f"{name}: duplicate claim ids"
        for claim in method.claims:
            committed = root / name / "results" / committed_results_name("small", claim.experiment)
            if not committed.is_file():
                continue
            data = json.loads(committed.read_text())
            assert data.get("experiment") == claim.experiment, committed
            for system, metric in claim.references():
                assert system in data["rows"], f"{name}.{claim.id}: no row {system!r}"
                assert metric in data["metrics"], f"{name}.{claim.id}: no metric {metric!r}"


def test_nshot_claims_reevaluates_a_results_file_without_rerunning(tmp_path, capsys, monkeypatch):
    from nshot import method as method_mod
    from nshot.cli import main

    tail = method_mod.get("tail")
    monkeypatch.setattr(
        type(tail),
        "claims",
        (
            Claim("beats", "TAIL beats the base.", "Table 1", "tail.acc > base.acc"),
            Claim("loses", "The base beats TAIL.", "Table 1", "base.acc > tail.acc"),
        ),
    )
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps({**RESULTS, "preset": "small", "seeds": 3, "metrics": {}, "runtime_s": 1.0})
    )
    assert main(["claims", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "claims: 1 of 2 hold (1 fail, 0 not evaluable)"
    assert "claims" not in json.loads(path.read_text())  # not written without --write
    assert main(["claims", str(path), "--write", "--json"]) == 0
    captured = capsys.readouterr()
    assert [c["holds"] for c in json.loads(captured.out)] == [True, False]  # stdout: JSON only
    assert "claims: 1 of 2 hold" in captured.err
    written = json.loads(path.read_text())["claims"]
    assert [c["holds"] for c in written] == [True, False]
    assert "## Claims" in (tmp_path / "results.md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["claims", str(bad)]) == 2
    assert "cannot read results JSON" in capsys.readouterr().err
