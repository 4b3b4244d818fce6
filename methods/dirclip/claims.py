"""UCAT's claims as data, evaluated over the results of ``nshot reproduce dirclip``.

Rows: the digits toy (tiny CLIP pre-trained on scikit-learn's digits, ε = 0.1), means over
seeds. The paper's numbers are ViT-B/32 on 16 zero-shot sets at ε = 1/255; the thresholds
here are this reproduction's targets for the abstract's claims, stated before the run:
adversarial perturbations suppress CLIP's uncertainty; UCAT is more robust than TeCoA at
matched steps without losing clean accuracy; the reverse KL direction matters; the
in-distribution gain survives a small shift; the λ = 0 path of UCAT is TeCoA (a check of the
code paths); and UCAT calibrates adversarial predictions better (the paper's title claim,
whose size the available text does not give; the toy is not expected to show it). The unit
guard holds at any preset.

Kinds (the claim language's ``kind``):

* ``headline``: ``ucat_more_robust_than_tecoa``, the paper's central comparison in its own
  direction: UCAT's PGD accuracy above TeCoA's, the strongest of the paper's baselines nshot
  runs on that metric (FARE and the original CLIP are below it), with a one-sided paired t-test
  over the training seeds. Its premise (``requires``) is that TeCoA learned robustness at all
  (its PGD accuracy above the original CLIP's): beating a baseline at the floor says nothing.
* ``ablation``: the KL direction (``reverse_kl_matters``) and the paper's secondary claims,
  which the claim language files under the same kind: the size of the robustness gain
  (``robust_beyond_tecoa``, a 2-point margin, untested; declared before the tested headline and
  kept), clean accuracy kept (``clean_matched``, declared two-sided), the shifted digits
  (``shift_clean_kept``) and calibration (``calibration_gain``).
* ``control``: ``uncertainty_suppression``, the positive control that the original CLIP shows
  the over-confidence under attack that UCAT addresses (it fails at a ratio of 0.6 or more).
* ``check``: ``lambda0_is_tecoa`` (CE + 0 · KL is TeCoA's loss, so it holds by construction;
  it checks that the two code paths agree) and the frozen-parts guard.

Only kinds, the ``requires`` premise and the headline were added after the first runs; no
expression or threshold was changed.
"""

from __future__ import annotations

from nshot.claims import Claim

TRAINED = ("small", "paper")

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="ucat_more_robust_than_tecoa",
        statement="UCAT is more robust than TeCoA: its PGD accuracy at matched training steps "
        "is above TeCoA's, paired over training seeds (one-sided paired t-test, p < 0.05).",
        source="Abstract (competitive robustness); main table, 16-set average (PGD-100: UCAT "
        "32.20 vs TeCoA 29.86)",
        expr="ucat.pgd > tecoa.pgd",
        test="paired_t",
        presets=TRAINED,
        kind="headline",
        requires="tecoa.pgd > clip.pgd",
    ),
    Claim(
        id="uncertainty_suppression",
        statement="Positive control: on the original CLIP, wrong PGD predictions have less "
        "than 0.6 times the normalised entropy of wrong clean predictions (it fails at a ratio "
        "of 0.6 or more).",
        source="Abstract and §1 (adversarial perturbations suppress uncertainty)",
        expr="clip.ent_ratio < 0.6",
        presets=TRAINED,
        kind="control",
    ),
    Claim(
        id="robust_beyond_tecoa",
        statement="At matched training steps UCAT's PGD accuracy beats TeCoA's by at least "
        "2 points.",
        source="Abstract; main table (UCAT 32.20 vs TeCoA 29.86 PGD-100)",
        expr="ucat.pgd >= tecoa.pgd + 0.02",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="clean_matched",
        statement="UCAT's clean zero-shot accuracy is within 1 point of TeCoA's.",
        source="Abstract (clean accuracy preserved); main table",
        expr="abs(ucat.clean - tecoa.clean) <= 0.01",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="reverse_kl_matters",
        statement="The reverse Dirichlet KL (UCAT) beats the forward one by at least 2 PGD "
        "points at the same λ.",
        source="Ablation (forward KL 36.72 / 24.36 vs reverse 54.17 / 30.58 clean / AA)",
        expr="ucat.pgd >= ucat_forward_kl.pgd + 0.02",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="shift_clean_kept",
        statement="On the digits rolled by one pixel UCAT's clean accuracy is no more than "
        "1 point below TeCoA's.",
        source="Abstract (zero-shot generalisation preserved)",
        expr="ucat.clean_rolled >= tecoa.clean_rolled - 0.01",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="lambda0_is_tecoa",
        statement="Check (true by construction: CE + 0 · KL is TeCoA's loss): the UCAT code "
        "path with λ = 0 matches TeCoA within 1 point of PGD and of clean accuracy.",
        source="Negative control of the reproduction (the gain must come from the Dirichlet term); "
        "a check that the two code paths agree",
        expr="abs(ucat_lambda0.pgd - tecoa.pgd) <= 0.01 and "
        "abs(ucat_lambda0.clean - tecoa.clean) <= 0.01",
        presets=TRAINED,
        kind="check",
    ),
    Claim(
        id="calibration_gain",
        statement="UCAT's adversarial ECE is at least 0.02 below TeCoA's (the paper's "
        "calibration claim; not expected at toy scale).",
        source="Abstract (restores calibration)",
        expr="ucat.ece_adv <= tecoa.ece_adv - 0.02",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="balanced_kl_calibrates_better",
        statement="With the KL weighted against the frozen model's mean concentration "
        "(kl_normalisation = mean_alpha0, w = 30), UCAT's adversarial ECE is below that of "
        "UCAT with the released code's constant λ on the same backbone (ucat_max_alpha), paired "
        "over seeds: the KL outweighing the cross-entropy is what turns calibration the wrong "
        "way on the tiny CLIP.",
        source="Abstract (restores calibration); §3 (λ balances the KL against the cross-entropy)",
        expr="ucat.ece_adv < ucat_max_alpha.ece_adv",
        test="paired_t",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="kl_balanced_against_ce",
        statement="Under kl_normalisation = mean_alpha0 the weighted KL is within a factor 10 "
        "of the cross-entropy at the first validation point (the released code's constant puts "
        "it about 3e4 times above on this backbone).",
        source="§3 (the loss CE + λ·KL)",
        expr="extra('kl_to_ce', 'ucat') <= 10",
        presets=TRAINED,
        kind="check",
    ),
    Claim(
        id="frozen_parts_unchanged",
        statement="After UCAT training the text features and every parameter of g₀ are "
        "bitwise unchanged, and KL(Dir(α(g₀(x))) ‖ Dir(α(g₀(x)))) is 0.",
        source="Method §3 (frozen text encoder and original model)",
        expr="extra('unit', 'frozen_max_abs_diff') == 0 and extra('unit', 'kl_self') == 0",
        kind="check",
    ),
)
