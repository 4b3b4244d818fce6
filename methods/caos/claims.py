"""The CAOS paper's claims, as checks over ``nshot reproduce caos``'s rows.

Rows: ``caos``, ``split_conformal_best``, ``split_conformal_agg``, ``no_loo_control``,
``full_conformal``; metrics ``coverage_aXX`` and ``size_aXX`` for alpha = 0.05, 0.1, 0.2 (means
over trials and test images). The validity claims allow a Monte Carlo margin below 1 - alpha:
0.02 at the ``small`` and ``paper`` scales, 0.05 on the few trials of ``smoke``. The efficiency
thresholds were set on the ``small`` protocol (n = 20 labelled examples, k = 3) before it was run.
Every preset uses n = 20, which is what the alpha = 0.05 claims rely on: split conformal then has
10 calibration points and cannot reach the rank 11 that alpha = 0.05 needs.

Kinds. The headline is the paper's comparison in its direction: at the same nominal coverage
CAOS's sets are smaller than split conformal's, against the stronger of the two split baselines
(the aggregated score), paired over trials (``samples`` holds each trial's mean over its test
images; the rows are not trained networks, so trials are the replications). Its premise is
CAOS's own validity at that alpha (the bar of ``validity_caos_a10``): smaller sets bought by
under-coverage are no win. The validity of CAOS (the leave-one-out calibration the coverage
theorem rests on) and the size thresholds (the gains of not splitting and of aggregating) are
``ablation``; ``negative_control_a10`` is the ``control`` of the leave-one-out indexing. The
split baselines' validity, the smoke gates, the over-coverage bound and ``split_trivial_a05``
(true by the rank rule whenever n = 20) are ``check``.
"""

from __future__ import annotations

from nshot.claims import Claim

COVERAGE = "Theorem (marginal coverage of the leave-one-out calibrated aggregate)"
EFFICIENCY = "Experiments: set size against split conformal at equal nominal coverage"
SPLIT_RANK = "Split conformal baseline: rank ceil((1 - alpha)(m + 1)) of m calibration scores"
LOO = "Proof of coverage: the calibration score of example j leaves predictor j out"

_ALPHAS = (("a05", 0.05), ("a10", 0.1), ("a20", 0.2))


def _validity() -> tuple[Claim, ...]:
    out: list[Claim] = []
    for sfx, alpha in _ALPHAS:
        level = f"{1 - alpha:g}"
        out.append(
            Claim(
                id=f"validity_caos_{sfx}",
                kind="ablation",
                statement=f"CAOS's sets cover the true landmark at least {level} of the time "
                f"at alpha = {alpha:g} (Monte Carlo margin 0.02).",
                source=COVERAGE,
                expr=f"caos.coverage_{sfx} >= {level} - 0.02",
                presets=("small", "paper"),
            )
        )
        out.append(
            Claim(
                id=f"validity_split_{sfx}",
                kind="check",
                statement=f"Both split-conformal baselines cover at least {level} at alpha = "
                f"{alpha:g} (Monte Carlo margin 0.02).",
                source=SPLIT_RANK,
                expr=f"min(split_conformal_best.coverage_{sfx}, split_conformal_agg.coverage_{sfx})"
                f" >= {level} - 0.02",
                presets=("small", "paper"),
            )
        )
    return tuple(out)


def _worst_deficit(*systems: str) -> str:
    """``min`` over systems and alphas of coverage - (1 - alpha)."""
    terms = [f"{s}.coverage_{sfx} - {1 - a:g}" for s in systems for sfx, a in _ALPHAS]
    return "min(" + ", ".join(terms) + ")"


CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="smaller_sets_than_split_conformal",
        kind="headline",
        statement="At the same nominal coverage (alpha = 0.1) CAOS gives substantially smaller "
        "prediction sets than split conformal, here the stronger split baseline (the same "
        "aggregated score): smaller sets, paired over trials.",
        source="Abstract and experiments: smaller prediction sets than split conformal at the "
        "same nominal coverage (about 55 % smaller on one-shot facial landmarking)",
        expr="caos.size_a10 < split_conformal_agg.size_a10",
        test="paired_t",
        presets=("small", "paper"),
        requires="caos.coverage_a10 >= 0.9 - 0.02",
    ),
    *_validity(),
    Claim(
        id="validity_caos_smoke",
        kind="check",
        statement="On the few trials of smoke, CAOS covers at least 1 - alpha - 0.05 at every "
        "alpha.",
        source=COVERAGE,
        expr=f"{_worst_deficit('caos')} >= -0.05",
        presets=("smoke",),
    ),
    Claim(
        id="validity_split_smoke",
        kind="check",
        statement="On the few trials of smoke, both split-conformal baselines cover at least "
        "1 - alpha - 0.05 at every alpha.",
        source=SPLIT_RANK,
        expr=f"{_worst_deficit('split_conformal_best', 'split_conformal_agg')} >= -0.05",
        presets=("smoke",),
    ),
    Claim(
        id="not_trivially_conservative_a10",
        kind="check",
        statement="At alpha = 0.1 CAOS does not buy its coverage by over-covering: it covers at "
        "most 0.96.",
        source=COVERAGE,
        expr="caos.coverage_a10 <= 0.96",
        presets=("small", "paper"),
    ),
    Claim(
        id="efficiency_vs_agg_a10",
        kind="ablation",
        statement="At alpha = 0.1 CAOS's sets are at most 0.75 times the size of split "
        "conformal's with the same aggregated score.",
        source=EFFICIENCY,
        expr="caos.size_a10 <= 0.75 * split_conformal_agg.size_a10",
        presets=("small", "paper"),
    ),
    Claim(
        id="efficiency_vs_agg_a20",
        kind="ablation",
        statement="At alpha = 0.2 CAOS's sets are at most 0.8 times the size of split "
        "conformal's with the same aggregated score.",
        source=EFFICIENCY,
        expr="caos.size_a20 <= 0.8 * split_conformal_agg.size_a20",
        presets=("small", "paper"),
    ),
    Claim(
        id="efficiency_vs_best_a10",
        kind="ablation",
        statement="At alpha = 0.1 CAOS's sets are at most a quarter of the size of split "
        "conformal's with the single best one-shot predictor.",
        source=EFFICIENCY,
        expr="caos.size_a10 <= 0.25 * split_conformal_best.size_a10",
        presets=("small", "paper"),
    ),
    Claim(
        id="split_trivial_a05",
        kind="check",
        statement="At alpha = 0.05 with n = 20, both split-conformal baselines return every "
        "candidate (size 256, coverage 1): 10 calibration points cannot reach rank 11.",
        source=SPLIT_RANK,
        expr="min(split_conformal_best.size_a05, split_conformal_agg.size_a05) == 256 and "
        "min(split_conformal_best.coverage_a05, split_conformal_agg.coverage_a05) == 1",
    ),
    Claim(
        id="caos_small_a05",
        kind="ablation",
        statement="At alpha = 0.05 with n = 20, where splitting is trivial, CAOS's sets hold at "
        "most 20 of the 256 candidates.",
        source=EFFICIENCY,
        expr="caos.size_a05 <= 20",
    ),
    Claim(
        id="negative_control_a10",
        kind="control",
        statement="Calibrating with each example's own zero self-score (no leave-one-out) "
        "destroys coverage: below 0.5 at alpha = 0.1. A coverage of 0.5 or more fails the "
        "control (the leave-one-out indexing would then be wrong).",
        source=LOO,
        expr="no_loo_control.coverage_a10 < 0.5",
    ),
)
