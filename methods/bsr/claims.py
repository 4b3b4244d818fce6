"""BSR's claims as data, evaluated over the results of ``nshot reproduce bsr``.

The paper's abstract gives no number: the thresholds are this reproduction's targets on the
generated EEG, stated before the run (pretraining learns and helps; rendering makes the model
montage-agnostic while a channel-first network is not; BSR is at least as good as band-power
features; destroying the electrode topology breaks cross-montage transfer). They need the
``small`` (or ``paper``) training scale. The renderer's unit checks live in the tests.

Kinds (the claim language's ``kind``):

* ``headline``: ``bsr_beats_spectrum_methods``, the abstract's comparison in its own direction
  ("significantly outperforms state-of-the-art spectrum-based methods"): BSR's balanced
  accuracy at k = 5 on montage A above band power + logistic regression's, the strongest
  spectrum-based baseline nshot runs (the topomap CNN is below it), one-sided paired t-test over
  the (support draw, target subject) runs of ``small``'s training seeds. Its premise
  (``requires``) is a baseline above chance (0.25, four classes). The channel-first EEGNet,
  stronger than every row here, is trained on labelled source subjects; the paper claims an
  advantage over channel-first networks across montages only (the EEGNet controls below).
  A second headline, ``bsr_beats_time_resolved_bandpower`` (declared with generator version 2,
  whose trials have a time course), compares BSR with band power per frame + logistic
  regression (``bandpower_frames_lr``: the spectrum video's own band powers before
  interpolation), the spectrum-based baseline that can read that time course; the headline
  verdict needs both.
* ``ablation``: pretraining (against the same VideoMAE from scratch), the layout-agnostic
  rendering (montages B and C) and the band-power comparisons declared before the tested
  headline (``>=``, ties allowed, untested; kept).
* ``control``: the channel-first EEGNet breaking across montages (positive controls of the
  failure mode the paper addresses), the scrambled-positions negative control, and
  ``pretraining_beats_position_mean`` (declared with generator version 2): the precondition
  that masked pretraining learned more than the head disc's layout, its held-out masked MSE at
  least 10 % below the position-mean predictor's on the same clips (the margin declared before
  the run, not from a result); the fine-tuning claims are read against it.
* ``check``: ``pretraining_learns``, a sanity check of the pretraining objective.

Only kinds, the ``requires`` premise, the headlines and the pretraining control were added
after the first runs; no expression or threshold was changed.
"""

from __future__ import annotations

from nshot.claims import Claim

TRAINED = ("small", "paper")

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="bsr_beats_spectrum_methods",
        statement="BSR outperforms the spectrum-based methods: at k = 5 on montage A its "
        "balanced accuracy is above band power + logistic regression's, paired over support "
        "draws and target subjects (one-sided paired t-test, p < 0.05).",
        source="Abstract (BSR + VideoMAE significantly outperforms state-of-the-art "
        "spectrum-based methods; subject-level few-shot learning)",
        expr="bsr.bacc_k5_A > bandpower_lr.bacc_k5_A",
        test="paired_t",
        presets=TRAINED,
        kind="headline",
        requires="bandpower_lr.bacc_k5_A > 0.25",
    ),
    Claim(
        id="bsr_beats_time_resolved_bandpower",
        statement="BSR outperforms band power read per frame: at k = 5 on montage A its "
        "balanced accuracy is above band power per channel and frame + logistic "
        "regression's (the spectrum video's own band powers), paired over support draws and "
        "target subjects (one-sided paired t-test, p < 0.05).",
        source="Abstract (BSR + VideoMAE significantly outperforms state-of-the-art "
        "spectrum-based methods; spectrum videos carry the trial's time course)",
        expr="bsr.bacc_k5_A > bandpower_frames_lr.bacc_k5_A",
        test="paired_t",
        presets=TRAINED,
        kind="headline",
        requires="bandpower_frames_lr.bacc_k5_A > 0.25",
    ),
    Claim(
        id="pretraining_beats_position_mean",
        statement="Precondition: masked pretraining learns more than the layout: its held-out "
        "masked MSE is at least 10 % below that of the predictor that gives every masked "
        "tubelet its position's mean target (it fails at a smaller margin).",
        source="Paper §3 (VideoMAE self-supervised pretraining on spectrum videos); the "
        "position-mean reference and the 10 % margin declared before the run",
        expr="bsr.mae_mse <= 0.9 * extra('pretrain', 'mae_mse_position_mean')",
        presets=TRAINED,
        kind="control",
    ),
    Claim(
        id="pretraining_learns",
        statement="Masked pretraining learns: held-out masked-tubelet MSE in normalised-target "
        "units is at most 0.7 (predicting 0 scores about 1).",
        source="Paper §3 (VideoMAE self-supervised pretraining on spectrum videos)",
        expr="bsr.mae_mse <= 0.7",
        presets=TRAINED,
        kind="check",
    ),
    Claim(
        id="pretraining_helps",
        statement="At k = 5 on montage A, BSR's balanced accuracy beats the same VideoMAE "
        "fine-tuned from scratch by at least 5 points.",
        source="Abstract (a video foundation model pretrained on spectrum videos)",
        expr="bsr.bacc_k5_A >= videomae_scratch.bacc_k5_A + 0.05",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="bsr_montage_agnostic",
        statement="Cross-montage: BSR on montage B (19 channels) is within 5 points of montage A "
        "(32 channels) at k = 5.",
        source="Abstract (layout-agnostic rendering; cross-montage fine-tuning)",
        expr="bsr.drop_A_to_B <= 0.05",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="eegnet_channel_first_breaks",
        statement="Positive control, cross-montage: the channel-first EEGNet (missing channels "
        "zero-filled) drops by at least 10 points from montage A to B at k = 5 (it fails at a "
        "smaller drop).",
        source="Abstract (rigid channel-first architectures)",
        expr="eegnet.drop_A_to_B >= 0.10",
        presets=TRAINED,
        kind="control",
    ),
    Claim(
        id="montage_c_agnostic",
        statement="Cross-montage without the class electrodes: BSR on montage C (montage A "
        "without C3, Cz, C4, O1, O2, the electrodes above the class sources) is within 5 "
        "points of montage A at k = 5.",
        source="Abstract (layout-agnostic rendering); montage C added because montage B keeps "
        "every class electrode",
        expr="bsr.drop_A_to_C <= 0.05",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="eegnet_breaks_on_montage_c",
        statement="Positive control, cross-montage without the class electrodes: the "
        "channel-first EEGNet (missing channels zero-filled) drops by at least 10 points from "
        "montage A to C at k = 5 (it fails at a smaller drop).",
        source="Abstract (rigid channel-first architectures); montage C as above",
        expr="eegnet.drop_A_to_C >= 0.10",
        presets=TRAINED,
        kind="control",
    ),
    Claim(
        id="beats_bandpower_k1",
        statement="BSR's balanced accuracy is at least band-power + logistic regression's at "
        "k = 1 on montage A.",
        source="Abstract (outperforms spectrum-based methods)",
        expr="bsr.bacc_k1_A >= bandpower_lr.bacc_k1_A",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="beats_bandpower_k5",
        statement="BSR's balanced accuracy is at least band-power + logistic regression's at "
        "k = 5 on montage A.",
        source="Abstract (outperforms spectrum-based methods)",
        expr="bsr.bacc_k5_A >= bandpower_lr.bacc_k5_A",
        presets=TRAINED,
        kind="ablation",
    ),
    Claim(
        id="scrambled_positions_break",
        statement="Negative control: with each montage's electrode positions permuted before "
        "rendering, balanced accuracy on montage B at k = 5 is at least 5 points below BSR's "
        "(it fails when the scrambled row comes within 5 points of BSR or above it).",
        source="Negative control (the gain must come from the electrode topology)",
        expr="bsr_scrambled_positions.bacc_k5_B <= bsr.bacc_k5_B - 0.05",
        presets=TRAINED,
        kind="control",
    ),
)
