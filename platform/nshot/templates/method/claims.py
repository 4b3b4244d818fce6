"""skeleton's claims: checks over the rows of ``nshot reproduce skeleton``.

Every claim names its kind: the ``headline`` (the paper's central comparison, in its direction,
against the strongest baseline run here, with a paired test over the per-seed values), an
``ablation`` (a component the paper says matters), a ``control`` (a result that must come out
a known way, whose statement says what would fail it) and a ``check`` (a sanity check, not a
claim of the paper). ``requires`` is a claim's premise: when it does not hold, the claim is not
evaluable rather than true. Replace these with your paper's claims, citing where each is made.
"""

from __future__ import annotations

from nshot.claims import Claim

SOURCE = "Template: the comparison of experiments.py (cite the paper's table or figure here)"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="beats_raw_prototypes",
        kind="headline",
        statement="Prototypes in the trained embedding classify held-out classes more "
        "accurately than prototypes on the raw features (paired over training seeds).",
        source=SOURCE,
        expr="protonet.acc > raw_prototypes.acc",
        test="paired_t",
        requires='raw_prototypes.acc > extra("chance")',
    ),
    Claim(
        id="training_matters",
        kind="ablation",
        statement="The trained embedding is more accurate than the same network untrained.",
        source=SOURCE,
        expr="protonet.acc > untrained.acc",
    ),
    Claim(
        id="permuted_labels_at_chance",
        kind="control",
        statement="Scored against permuted query labels the trained model is at chance (within "
        "0.1 of 1/ways); an accuracy above that would mean the evaluation leaks labels.",
        source=SOURCE,
        expr='abs(permuted_labels.acc - extra("chance")) < 0.1',
    ),
    Claim(
        id="above_chance",
        kind="check",
        statement="The trained model is above chance on held-out classes.",
        source=SOURCE,
        expr='protonet.acc > extra("chance")',
    ),
)
