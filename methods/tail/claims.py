"""The TAIL paper's claims, as checks over ``nshot reproduce tail``'s rows.

Rows: ``tail``, ``protohead``, ``linear_probe`` and the ablations ``no_projection`` (a fixed
zero-padding map instead of the random projection) and ``fixed_label_slots``; metrics: episode
accuracy per setting (``acc_seen_5w5s``: held-out classes of the training modality A;
``acc_unseen_modality_5w5s``: modality B, 32-d, never seen in training; ``acc_20way``: 20-way
5-shot on modality A after training on at most 5 ways; audio, digits, MNIST and text are reported,
not claimed). The thresholds were set before the ``small`` protocol was run and are stated for the
``small`` and ``paper`` presets (``smoke`` trains for 50 steps). ``experiment=ingredients`` adds
the rows ``tail_depth2x``, ``tail_steps4x`` and ``tail_steps16x`` (one scale ingredient each) and
two claims on each; those on ``tail_steps16x`` were added after a first run of the other two rows
(which failed), before any run of it.

The paper's headline comparison (TAIL ahead of ProtoHead and LinearProbe at 5-way 5-shot on
frozen image-encoder features) comes from a 16-layer model on ImageNet-scale features; it is
declared here on the small offline substitute all the same, and reported whether it holds or not.
"""

from __future__ import annotations

from nshot.claims import Claim

HEADLINE = "Headline table: 5-way 5-shot accuracy against LinearProbe and ProtoHead"
EXTRAPOLATION = "Label extrapolation: a model trained on 5-way tasks applied to more classes"
PROJECTION = "Ablation: TAIL without the random projection (cross-domain transfer)"
CROSS_MODAL = "Cross-modal transfer: unseen modalities of other feature widths"

SCALE = "Setting: the headline's 16-block model trained for 100k steps (scale ingredients)"

_BIG = ("small", "paper")


def _ingredient_claims(row: str, what: str) -> tuple[Claim, ...]:
    """``experiment=ingredients``: one scale ingredient (``row``) against ProtoHead on the
    unseen modality B and on real MNIST pixels, the two columns where ``small`` TAIL trails."""
    return tuple(
        Claim(
            id=f"{row.removeprefix('tail_')}_beats_protohead_{col}",
            statement=f"With {what}, TAIL is more accurate than ProtoHead on {name}.",
            source=SCALE,
            expr=f"{row}.acc_{metric}_5w5s > protohead.acc_{metric}_5w5s",
            presets=("small",),
            experiment="ingredients",
        )
        for col, metric, name in (
            ("unseen", "unseen_modality", "the unseen modality B (5-way 5-shot)"),
            ("mnist", "mnist", "MNIST pixels (5-way 5-shot)"),
        )
    )


CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="label_extrapolation_vs_chance",
        statement="Trained on at most 5 ways, TAIL classifies 20-way episodes at least 4 times "
        "better than chance.",
        source=EXTRAPOLATION,
        expr="tail.acc_20way >= 4 / 20",
        presets=_BIG,
    ),
    Claim(
        id="label_extrapolation_vs_protohead",
        statement="On 20-way episodes TAIL reaches at least 0.8 times ProtoHead's accuracy.",
        source=EXTRAPOLATION,
        expr="tail.acc_20way >= 0.8 * protohead.acc_20way",
        presets=_BIG,
    ),
    Claim(
        id="projection_carries_cross_modal",
        statement="On the unseen modality B, TAIL with its random projection beats TAIL without "
        "it by at least 5 points.",
        source=PROJECTION,
        expr="tail.acc_unseen_modality_5w5s - no_projection.acc_unseen_modality_5w5s >= 0.05",
        presets=_BIG,
    ),
    Claim(
        id="cross_modal_near_protohead",
        statement="On the unseen modality B, TAIL is within 3 points of ProtoHead or better.",
        source=CROSS_MODAL,
        expr="tail.acc_unseen_modality_5w5s >= protohead.acc_unseen_modality_5w5s - 0.03",
        presets=_BIG,
    ),
    Claim(
        id="beats_protohead_5w5s",
        statement="At 5-way 5-shot on held-out classes of the training modality, TAIL is more "
        "accurate than ProtoHead.",
        source=HEADLINE,
        expr="tail.acc_seen_5w5s > protohead.acc_seen_5w5s",
        presets=_BIG,
    ),
    Claim(
        id="beats_linear_probe_5w5s",
        statement="At 5-way 5-shot on held-out classes of the training modality, TAIL is more "
        "accurate than LinearProbe.",
        source=HEADLINE,
        expr="tail.acc_seen_5w5s > linear_probe.acc_seen_5w5s",
        presets=_BIG,
    ),
    # experiment=ingredients: one scale ingredient changed alone per row
    *_ingredient_claims("tail_depth2x", "twice the depth (8 blocks in small)"),
    *_ingredient_claims("tail_steps4x", "four times the training steps (6,000 in small)"),
    *_ingredient_claims("tail_steps16x", "sixteen times the training steps (24,000 in small)"),
)
