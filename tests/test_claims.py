"""Paper claims as data: the expression language, evaluation, paired tests, `nshot claims`."""

from __future__ import annotations

import json

import pytest

from nshot.claims import (
    KINDS,
    PAPER_KINDS,
    Claim,
    ClaimError,
    evaluate,
    headline_verdict,
    summary,
    summary_line,
    to_markdown,
)

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
    both = evaluate([c, _claim("tail.acc > 0.5", kind="ablation")], {**RESULTS, "preset": "smoke"})
    s = summary(both)
    assert _counts(s) == {"held": 1, "failed": 0, "unevaluated": 0, "total": 1}
    assert (s["other_presets"], s["other_experiments"]) == (1, 0)
    assert _counts(s["paper"]) == {"held": 1, "failed": 0, "unevaluated": 0, "total": 1}
    assert s["checks"]["total"] == 0 and s["headline"]["verdict"] is None
    assert summary_line(both) == (
        "claims: no headline claim; 1 of 1 paper claims hold; 1 stated for other presets"
    )


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
    s = summary(on_main)
    assert _counts(s) == {"held": 1, "failed": 0, "unevaluated": 0, "total": 1}
    assert (s["other_presets"], s["other_experiments"]) == (1, 1)
    assert summary_line(on_main) == (
        "claims: no headline claim; 0 of 0 paper claims hold; 1 of 1 checks hold; "
        "1 for another experiment"
    )
    other = evaluate([scoped], {**RESULTS, "experiment": "another"})
    assert other[0]["holds"] is None and other[0]["applies"] is False


def _counts(s: dict) -> dict:
    return {k: s[k] for k in ("held", "failed", "unevaluated", "total")}


def test_summary_table_and_line():
    claims = [
        _claim("tail.acc > base.acc", kind="headline"),
        _claim("tail.acc < base.acc", kind="ablation"),
        _claim("x.y > 0", kind="control"),
        _claim("tail.acc > 0.5", kind="check"),
        _claim("tail.acc > 0.9", kind="check"),
    ]
    evaluated = evaluate(claims, RESULTS)
    s = summary(evaluated)
    assert _counts(s) == {"held": 2, "failed": 2, "unevaluated": 1, "total": 5}
    assert _counts(s["paper"]) == {"held": 1, "failed": 1, "unevaluated": 1, "total": 3}
    assert _counts(s["checks"]) == {"held": 1, "failed": 1, "unevaluated": 0, "total": 2}
    assert s["headline"] == {
        "held": 1, "failed": 0, "unevaluated": 0, "total": 1, "verdict": True
    }  # fmt: skip
    assert (s["other_presets"], s["other_experiments"]) == (0, 0)
    assert summary_line(evaluated) == (
        "claims: headline holds; 1 of 3 paper claims hold (1 fail, 1 not evaluable); "
        "1 of 2 checks hold (1 fail, 0 not evaluable)"
    )
    md = to_markdown(evaluated)
    assert "| c | headline | yes |" in md and "| c | ablation | **no** |" in md
    assert "| c | control | n/a |" in md and "| c | check | yes |" in md
    # the table lists headline claims first and checks last
    kinds = [line.split(" | ")[1] for line in md.splitlines() if line.startswith("| c |")]
    assert kinds == ["headline", "ablation", "control", "check", "check"]


def test_the_summary_line_reads_headline_first_then_paper_claims_then_checks():
    """The example the claims module documents: 5 of 8 paper claims, 4 of 4 checks."""
    paper = [
        _claim("tail.acc > base.acc", kind="headline"),
        *[_claim("tail.acc > 0.5", kind="ablation") for _ in range(3)],
        _claim("tail.acc > 0.5", kind="control"),
        *[_claim("tail.acc > 0.9", kind="ablation") for _ in range(2)],
        _claim("nosuch.acc > 0", kind="control"),
    ]
    checks = [_claim("tail.acc > 0.5", kind="check") for _ in range(4)]
    evaluated = evaluate(paper + checks, RESULTS)
    assert summary_line(evaluated) == (
        "claims: headline holds; 5 of 8 paper claims hold (2 fail, 1 not evaluable); "
        "4 of 4 checks hold"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_accepted_and_paper_kinds_are_all_but_check(kind):
    assert _claim("tail.acc > 0", kind=kind).evaluate(RESULTS)["kind"] == kind
    assert (kind in PAPER_KINDS) is (kind != "check")


@pytest.mark.parametrize("kind", ["main", "Headline", "", "claim"])
def test_a_kind_outside_the_four_is_refused(kind):
    with pytest.raises(ClaimError, match="kind must be one of"):
        _claim("tail.acc > 0", kind=kind)


def test_a_claim_without_a_kind_is_counted_with_the_checks_not_the_paper_claims():
    s = summary(evaluate([_claim("tail.acc > 0")], RESULTS))
    assert s["paper"]["total"] == 0 and s["checks"]["total"] == 1
    assert s["headline"]["verdict"] is None


def test_a_premise_must_parse_in_the_claim_language():
    with pytest.raises(ClaimError, match="claim 'c'"):
        _claim("tail.acc > 0", requires="__import__('os') == 0")
    with pytest.raises(ClaimError, match="must be a comparison"):
        _claim("tail.acc > 0", requires="tail.acc")


def test_a_claim_whose_premise_fails_is_not_evaluable_never_true():
    failing = _claim("tail.acc > base.acc", kind="control", requires="base.acc > 0.7")
    out = failing.evaluate(RESULTS)
    assert out["holds"] is None and out["premise"] is False
    assert out["requires"] == "base.acc > 0.7" and "premise does not hold" in out["note"]
    # the comparison itself would hold: the premise alone makes it not evaluable
    assert (out["lhs"], out["rhs"]) == (0.8, 0.6)
    s = summary([out])
    assert _counts(s["paper"]) == {"held": 0, "failed": 0, "unevaluated": 1, "total": 1}
    assert summary_line([out]) == (
        "claims: no headline claim; 0 of 1 paper claims hold (0 fail, 1 not evaluable)"
    )
    # a failing comparison behind a failed premise is not a failure either
    assert (
        _claim("tail.acc < base.acc", requires="base.acc > 0.7").evaluate(RESULTS)["holds"] is None
    )


@pytest.mark.parametrize("requires", ["nosuch.acc > 0", "base.loss < 1", "extra('nosuch') > 0"])
def test_a_claim_whose_premise_cannot_be_evaluated_is_not_evaluable(requires):
    out = _claim("tail.acc > base.acc", requires=requires).evaluate(RESULTS)
    assert out["holds"] is None and out["premise"] is False


@pytest.mark.parametrize(
    ("expr", "holds"), [("tail.acc > base.acc", True), ("tail.acc < base.acc", False)]
)
def test_a_claim_whose_premise_holds_is_evaluated(expr, holds):
    out = _claim(expr, requires="tail.acc > 0.5 and base.acc > 0.5").evaluate(RESULTS)
    assert out["premise"] is True and out["holds"] is holds and "note" not in out
    tested = _claim(expr, requires="base.acc > 0.5", test="paired_t").evaluate(RESULTS)
    assert tested["premise"] is True and tested["holds"] is holds and tested["p"] is not None


def test_a_claim_without_a_premise_records_none():
    out = _claim("tail.acc > base.acc").evaluate(RESULTS)
    assert "premise" not in out and "requires" not in out


def test_a_tested_claim_records_the_paired_effect_and_its_interval_by_hand():
    """a - b = (0.5, 1, 1, 2.5): mean 1.25, sd sqrt(0.75), t(0.975, 3) = 3.18245, so the 95 %
    interval is 1.25 ± 3.18245 * 0.866025 / 2 = [-0.12804, 2.62804] and d_z = 1.25 / 0.866025;
    the one-sided paired t (t = 2.88675, 3 df) gives p = 0.03159."""
    import numpy as np
    from scipy import stats

    a, b = [1.0, 2.0, 4.0, 7.0], [0.5, 1.0, 3.0, 4.5]
    results = {
        "rows": {"m": {"acc": float(np.mean(a))}, "base": {"acc": float(np.mean(b))}},
        "samples": {"m": {"acc": a}, "base": {"acc": b}},
    }
    out = _claim("m.acc > base.acc", test="paired_t", kind="headline").evaluate(results)
    eff = out["effect"]
    assert eff["n"] == 4
    assert eff["mean_diff"] == pytest.approx(1.25)
    assert eff["ci95"] == pytest.approx([-0.12803967, 2.62803967], abs=1e-7)
    assert eff["dz"] == pytest.approx(1.25 / np.sqrt(0.75))
    assert out["p"] == pytest.approx(0.0315900, abs=1e-6)
    # the same numbers from numpy / scipy directly
    d = np.subtract(a, b)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert eff["ci95"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert out["p"] == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue)
    # one-sided p < 0.05 although the two-sided interval covers 0: the claim holds on its test
    assert out["holds"] is True
    assert "1.25 [-0.128, 2.628], n=4" in to_markdown([out])
    # Wilcoxon: the same effect, its own p (exact: 1/16 for four positive differences)
    w = _claim("m.acc > base.acc", test="wilcoxon").evaluate(results)
    assert w["effect"] == eff and w["p"] == pytest.approx(1 / 16) and w["holds"] is False


def test_the_effect_needs_two_pairs_and_a_spread_for_dz():
    from nshot.claims import paired_effect

    assert paired_effect([1.0], [0.0]) is None
    assert paired_effect([1.0, 2.0], [0.0]) is None
    const = paired_effect([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert const["mean_diff"] == pytest.approx(0.5) and const["dz"] is None
    assert const["ci95"] == pytest.approx([0.5, 0.5])
    untested = _claim("tail.acc > base.acc").evaluate(RESULTS)
    assert "effect" not in untested


def _kinded(kind: str, expr: str, **kw) -> Claim:
    return Claim(id=f"{kind}-{expr}", statement="s.", source="T1", expr=expr, kind=kind, **kw)


@pytest.mark.parametrize(
    ("heads", "verdict"),
    [
        (["tail.acc > base.acc"], True),
        (["tail.acc > base.acc", "tail.acc > 0.5"], True),
        (["tail.acc > base.acc", "tail.acc < base.acc"], False),
        (["tail.acc > base.acc", "nosuch.acc > 0"], None),
        (["nosuch.acc > 0", "tail.acc < base.acc"], False),  # a failure outweighs a gap
        ([], None),
    ],
)
def test_the_headline_verdict(heads, verdict):
    claims = [_kinded("headline", e) for e in heads] + [_kinded("ablation", "tail.acc < 0")]
    evaluated = evaluate(claims, RESULTS)
    assert headline_verdict(evaluated) is verdict
    assert summary(evaluated)["headline"]["verdict"] is verdict
    word = {True: "holds", False: "fails", None: "not evaluable"}[verdict]
    first = summary_line(evaluated).split("; ")[0]
    assert first == (f"claims: headline {word}" if heads else "claims: no headline claim")


def test_a_headline_stated_for_another_preset_gives_no_verdict():
    claims = [_kinded("headline", "tail.acc > base.acc", presets=("small",))]
    evaluated = evaluate(claims, {**RESULTS, "preset": "smoke"})
    assert headline_verdict(evaluated) is None
    assert summary(evaluated)["headline"]["total"] == 0
    premise = [_kinded("headline", "tail.acc > base.acc", requires="base.acc > 0.9")]
    assert headline_verdict(evaluate(premise, RESULTS)) is None


# Claims on a metric the experiment now records but the committed small results predate: they
# are not evaluable until small is re-made (the test fails once the metric appears, so the entry
# cannot outlive the rerun).
AWAITING_RERUN: set[tuple[str, str]] = set()
# claims whose row a declared change adds: the committed small results predate the row (the test
# fails once the row appears, so the entry cannot outlive the rerun)
AWAITING_ROW: set[tuple[str, str]] = set()
# claims whose rows the declared `small` leaves out (the method's README names the flag that runs
# them): not evaluable on the committed small results (the test fails once the rows come back)
ROWS_OFF: set[tuple[str, str]] = {
    ("tgdt", "minilm_beats_language_baseline"),  # --set minilm_row=true
    ("tgdt", "minilm_approaches_oracle"),
}


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
            if (name, claim.id) in AWAITING_ROW | ROWS_OFF:
                assert any(system not in data["rows"] for system, _ in claim.references()), (
                    f"{name}.{claim.id}: the committed results now hold every row it reads; "
                    "remove the claim from AWAITING_ROW / ROWS_OFF"
                )
                continue
            for system, metric in claim.references():
                assert system in data["rows"], f"{name}.{claim.id}: no row {system!r}"
                if (name, claim.id) in AWAITING_RERUN:
                    assert metric not in data["metrics"], (
                        f"{name}.{claim.id}: the committed results now hold {metric!r}; "
                        "remove the claim from AWAITING_RERUN"
                    )
                    continue
                assert metric in data["metrics"], f"{name}.{claim.id}: no metric {metric!r}"


def test_nshot_claims_reevaluates_a_results_file_without_rerunning(tmp_path, capsys, monkeypatch):
    from nshot import method as method_mod
    from nshot.cli import main

    tail = method_mod.get("tail")
    monkeypatch.setattr(
        type(tail),
        "claims",
        (
            Claim(
                "beats", "TAIL beats the base.", "Table 1", "tail.acc > base.acc",
                test="paired_t", kind="headline",
            ),
            Claim("loses", "The base beats TAIL.", "Table 1", "base.acc > tail.acc", kind="ablation"),
            Claim("sane", "Accuracy is a share.", "§3", "tail.acc <= 1", kind="check"),
        ),
    )  # fmt: skip
    path = tmp_path / "results.json"
    run = {"date": "2026-12-01", "commit": "0" * 40, "dirty": False, "wall_s": 1.0}
    path.write_text(
        json.dumps(
            {**RESULTS, "preset": "small", "seeds": 3, "metrics": {}, "runtime_s": 1.0, "run": run}
        )
    )
    assert main(["claims", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == (
        "claims: headline holds; 1 of 2 paper claims hold (1 fail, 0 not evaluable); "
        "1 of 1 checks hold"
    )
    assert "claims" not in json.loads(path.read_text())  # not written without --write
    assert main(["claims", str(path), "--write", "--json"]) == 0
    captured = capsys.readouterr()
    assert [c["holds"] for c in json.loads(captured.out)] == [True, False, True]  # JSON only
    assert "claims: headline holds; 1 of 2 paper claims hold" in captured.err
    data = json.loads(path.read_text())
    written = data["claims"]
    assert [c["holds"] for c in written] == [True, False, True]
    assert [c["kind"] for c in written] == ["headline", "ablation", "check"]
    assert written[0]["effect"]["n"] == 3
    # a re-evaluation is no re-run: the run's record (commit, tree, timing) is kept as it was
    assert data["run"] == run and data["runtime_s"] == 1.0
    assert "## Claims" in (tmp_path / "results.md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["claims", str(bad)]) == 2
    assert "cannot read results JSON" in capsys.readouterr().err
