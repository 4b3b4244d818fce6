"""The keystone paper's claims, as data over the results of ``nshot reproduce keystone``.

Thresholds are targets fixed before the runs (from the paper's reported effects), not
calibrated on the results. They speak of a real pretrained model (the ``small`` preset runs
SmolLM2-135M-Instruct, ``paper`` any larger model): the tiny LM of the ``smoke`` preset has no
keystone neurons, so the claims are not evaluated on its results.

Paper sources: the abstract and introduction (keystone neurons exist, are extremely sparse,
stable across prompt sets, tightly calibrated, and keystone-only SFT matches full fine-tuning
while forgetting less), Table 1 (masking keystone versus random neurons), the stability and
calibration probes, and the keystone-only SFT experiments.
"""

from __future__ import annotations

from nshot.claims import Claim

_AT_SCALE = ("small", "paper")


def _calibration(r: str) -> str:
    dk = f'extra("probe", "calibration", "{r}", "calib_drop_keystone")'
    dr = f'extra("probe", "calibration", "{r}", "calib_drop_random")'
    return f"{dk} >= 3 * max({dr}, 0) and {dk} > 0"


CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="keystone_set_sparse",
        statement="The keystone set K* found by probing and masking is at most 0.5 % of the "
        "model's neurons.",
        source="Abstract; Table 1 (keystone sets below 0.2 % of neurons)",
        expr='keystone_off.n_neurons <= 0.005 * extra("probe", "space", "total")',
        presets=_AT_SCALE,
    ),
    Claim(
        id="keystone_off_collapses",
        statement="Zeroing the keystone neurons leaves at most 20 % of the unablated model's "
        "mean accuracy over the four capabilities.",
        source="Table 1 (keystones off: every benchmark drops to 0)",
        expr="keystone_off.collapse_ratio <= 0.2",
        presets=_AT_SCALE,
    ),
    # the mean relative change over the control draws; with the natural suite (unablated
    # accuracy 1 by construction, no draw above it) this equals the mean of |change| per draw
    Claim(
        id="random_off_harmless",
        statement="Zeroing as many random neurons, with the same module histogram as K*, "
        "changes the mean accuracy by at most 5 % relative (mean over the control draws).",
        source="Table 1 (random neurons off: scores within a point of the base model)",
        expr="abs(random_module_off.acc - full.acc) / full.acc <= 0.05",
        presets=_AT_SCALE,
    ),
    Claim(
        id="keystone_set_stable",
        statement="K* found from disjoint prompt groups overlaps with a mean pairwise IoU of at "
        "least 0.5.",
        source="Stability probe (IoU of 80-95 % between prompt groups)",
        expr='extra("probe", "stability", "iou_mean") >= 0.5',
        presets=_AT_SCALE,
    ),
    Claim(
        id="calibration_halved",
        statement="Halving the keystone outputs costs at least three times the accuracy that "
        "halving a same-size random set costs.",
        source="Calibration probe (keystone curve falls on both sides of r = 1, random flat)",
        expr=_calibration("0.5"),
        presets=_AT_SCALE,
    ),
    Claim(
        id="calibration_doubled",
        statement="Doubling the keystone outputs costs at least three times the accuracy that "
        "doubling a same-size random set costs.",
        source="Calibration probe (keystone curve falls on both sides of r = 1, random flat)",
        expr=_calibration("2"),
        presets=_AT_SCALE,
    ),
    Claim(
        id="sft_keystone_matches_full",
        statement="Fine-tuning only the keystone rows gains at least 90 % of full "
        "fine-tuning's gain on the new task (and full fine-tuning gains).",
        source="Abstract; keystone-only SFT experiments (comparable to or better than full FT)",
        expr="sft_keystone.gain >= 0.9 * sft_full.gain and sft_full.gain > 0",
        presets=_AT_SCALE,
    ),
    Claim(
        id="sft_keystone_forgets_less",
        statement="Keystone-only fine-tuning loses no more accuracy on the other capabilities "
        "than full fine-tuning.",
        source="Abstract; keystone-only SFT experiments (better preserves other capabilities)",
        expr="sft_keystone.forgetting <= sft_full.forgetting",
        presets=_AT_SCALE,
    ),
    Claim(
        id="sft_keystone_beats_random_rows",
        statement="Fine-tuning the keystone rows gains more on the new task than fine-tuning "
        "as many random rows with the same module histogram.",
        source="Keystone-only SFT experiments (the keystone rows, not any sparse rows)",
        expr="sft_keystone.gain > sft_random_rows.gain",
        presets=_AT_SCALE,
    ),
)
