"""FRONT's paper claims as data, evaluated over the results of ``nshot reproduce front``.

The rows are the depth-4, width-64 descendants of the 12-layer ancestry on the digits (the
comparison's gated setting); ``extra["unit"]`` holds the unit measurements of the DCT transfer
and ``extra["refine"]`` the spectral refinement of the ancestry (means over seeds). The paper
publishes no per-table numbers: the thresholds are this reproduction's targets for the
abstract's claims (up to 15× faster convergence; state of the art against the initialisation
baselines). The unit claims hold at any preset; the others need the ``small`` (or ``paper``)
training scale.

Kinds. The headline is the abstract's claim in its direction: a FRONT descendant converges
faster than one initialised by the strongest of the paper's initialisation baselines run here,
uniform layer selection (weight selection gives the same descendant at this width; truncation is
slower), in epochs to the random-init descendant's final accuracy, as a paired t-test over the
seeds (``samples``: one value per seed; every system of a seed starts from the same ancestry and
trains with the same loop). Its premise is that the target is not trivial: the random-init
descendant needs more than one epoch to reach its own final accuracy. The faster start and the
speed-up over random init are ``ablation`` (the learngene against none), as is the new
``refinement_helps``: a descendant of the refined ancestry converges faster than one of the
ancestry trained for the same extra steps with λ = 0, the control that separates the spectral
regulariser from the extra training. The thresholds against the copy baselines that allow a
tie or a loss (``final_not_below_truncation``, ``not_slower_than_truncation``,
``not_slower_than_layer_selection``) are weaker than the paper's direction and are ``check``,
like the unit measurements of the transfer and the refinement's own spectrum and cost.

The speed-up over random init is held to 2×, not to the abstract's 15×: "up to 15×" is the
paper's best case over its settings, not a floor for each, and on ``small`` it is the
measurement's own ceiling (epochs to target count whole epochs of a 15-epoch run, and the
random-init descendant reaches its final accuracy at epoch 12 to 15, so 15× needs FRONT at the
target after its first epoch on every seed while random init needs all 15).

``ancestry_trained_every_seed`` is a ``control`` of the comparison's precondition: every seed's
ancestry must have learned the task before a learngene is taken from it (the paper's ancestries
are trained DeiTs). It reads the lowest of the seeds' ancestry test accuracies and fails when one
seed's ancestry did not train (below half the test digits, five times the chance level of 0.1),
so a failed ancestry is reported as such instead of only leaving the descendant comparison not
evaluable. No expression or threshold of an earlier claim changed.
"""

from __future__ import annotations

from nshot.claims import Claim

TRAINED = ("small", "paper")

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="headline_converges_faster_than_layer_selection",
        kind="headline",
        statement="A FRONT descendant reaches the random-init descendant's final accuracy in "
        "fewer epochs than one initialised by uniform layer selection, the strongest of the "
        "initialisation baselines here (paired over seeds; a seed on which uniform selection "
        "never reaches the target counts as one epoch past the run, a lower bound on what it "
        "needs, so the count can only favour uniform selection; FRONT must reach the target "
        "on every seed).",
        source="Abstract (state of the art against the initialisation baselines; convergence up "
        "to 15× faster)",
        expr="front.epochs_censored < uniform.epochs_censored",
        test="paired_t",
        presets=TRAINED,
        requires="random.epochs_to_target > 1 and front.epochs_to_target > 0",
    ),
    Claim(
        id="faster_start_init",
        kind="ablation",
        statement="Before any training, a FRONT descendant is at least 10 points more accurate "
        "than a randomly initialised one.",
        source="Abstract (faster start of descendants)",
        expr="front.acc_init >= random.acc_init + 0.10",
        presets=TRAINED,
    ),
    Claim(
        id="faster_start_epoch1",
        kind="ablation",
        statement="After one epoch, a FRONT descendant is at least 5 points more accurate than "
        "a randomly initialised one.",
        source="Abstract (faster start of descendants)",
        expr="front.acc_e1 >= random.acc_e1 + 0.05",
        presets=TRAINED,
    ),
    Claim(
        id="convergence_2x",
        kind="ablation",
        statement="A FRONT descendant reaches the random-init descendant's final accuracy at "
        "least twice as fast. The paper reports up to 15×, its best case over its settings; on "
        "small 15× is the measurement's ceiling (random init reaches its target at epoch 12-15 "
        "of 15), so the floor held here is 2×.",
        source="Abstract (convergence up to 15× faster on vision tasks)",
        expr="front.speedup >= 2",
        presets=TRAINED,
    ),
    Claim(
        id="final_not_below_truncation",
        kind="check",
        statement="FRONT's final accuracy is at most 1 point below copying the first layers "
        "(truncation).",
        source="Abstract (state of the art against the initialisation baselines)",
        expr="front.acc_final >= truncation.acc_final - 0.01",
        presets=TRAINED,
    ),
    Claim(
        id="not_slower_than_truncation",
        kind="check",
        statement="FRONT reaches the target in no more epochs than truncation.",
        source="Abstract (state of the art against the initialisation baselines)",
        expr="front.epochs_to_target <= truncation.epochs_to_target",
        presets=TRAINED,
    ),
    Claim(
        id="not_slower_than_layer_selection",
        kind="check",
        statement="FRONT converges at least as fast as the other copy baselines, uniform layer "
        "selection and weight selection.",
        source="Abstract (state of the art against the initialisation baselines)",
        expr="front.speedup >= uniform.speedup and front.speedup >= weight_selection.speedup",
        presets=TRAINED,
    ),
    Claim(
        id="roundtrip",
        kind="check",
        statement="With keep ratio 1 and the source's own shape, extraction followed by "
        "reconstruction gives back the source weights (max error below 1e-5 in float32).",
        source="Method: DCT extraction and reconstruction (released code)",
        expr="extra('unit', 'roundtrip_max_abs_err') < 1e-5",
    ),
    Claim(
        id="amplitude_12to4",
        kind="check",
        statement="On a smooth 12-layer stack the faithful 12 → 4 depth transfer scales each "
        "standardised layer by about 3 (between 2.5 and 3.5), as the unnormalised DCT implies.",
        source="Method: depth transfer (released code)",
        expr="extra('unit', 'amplitude_12to4') >= 2.5 and extra('unit', 'amplitude_12to4') <= 3.5",
    ),
    Claim(
        id="amplitude_12to24",
        kind="check",
        statement="On the same stack the faithful 12 → 24 depth transfer scales each layer by "
        "about 0.5 (between 0.4 and 0.6).",
        source="Method: depth transfer (released code)",
        expr="extra('unit', 'amplitude_12to24') >= 0.4 and extra('unit', 'amplitude_12to24') <= 0.6",
    ),
    Claim(
        id="amplitude_fixed",
        kind="check",
        statement="With the depth amplitude fix (× L_t/L_s) both transfers keep the layer "
        "amplitude within [0.8, 1.25].",
        source="Method: depth transfer (released code)",
        expr="extra('unit', 'amplitude_12to4_fixed') >= 0.8 "
        "and extra('unit', 'amplitude_12to4_fixed') <= 1.25 "
        "and extra('unit', 'amplitude_12to24_fixed') >= 0.8 "
        "and extra('unit', 'amplitude_12to24_fixed') <= 1.25",
    ),
    Claim(
        id="refinement_hf_halved",
        kind="check",
        statement="The spectral refinement at least halves the ancestry's high-frequency "
        "energy fraction.",
        source="Abstract (refinement with a spectral regulariser)",
        expr="extra('refine', 'hf_fraction_after') <= 0.5 * extra('refine', 'hf_fraction_before')",
        presets=TRAINED,
    ),
    Claim(
        id="refinement_acc_cost_le_1pt",
        kind="check",
        statement="The spectral refinement costs at most 1 point of the ancestry's test accuracy.",
        source="Abstract (refinement with a spectral regulariser)",
        expr="extra('refine', 'acc_after') >= extra('refine', 'acc_before') - 0.01",
        presets=TRAINED,
    ),
    Claim(
        id="ancestry_trained_every_seed",
        kind="control",
        statement="Every seed's ancestry has learned the task before its learngene is taken: "
        "the lowest of the seeds' ancestry test accuracies is at least 0.5 (half the test "
        "digits, five times chance). Fails when one seed's ancestry did not train, as the "
        "seed-1 ancestry at lr 1e-3 did (0.336).",
        source="Method: the learngene is extracted from a trained ancestry (the paper's "
        "pretrained DeiTs)",
        expr="extra('ancestry', 'acc_min') >= 0.5",
        presets=TRAINED,
    ),
    Claim(
        id="refinement_helps",
        kind="ablation",
        statement="A descendant of the ancestry refined with the spectral regulariser reaches the "
        "target in fewer epochs than one of the ancestry trained for the same extra steps with "
        "λ = 0 (paired over seeds).",
        source="Abstract (refinement with a spectral regulariser improves transferability)",
        expr="front_refined.epochs_to_target < front_more.epochs_to_target",
        test="paired_t",
        presets=TRAINED,
    ),
)
