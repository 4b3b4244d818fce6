"""The keystone paper's claims, as data over the results of ``nshot reproduce keystone``.

Thresholds are targets fixed before the runs (from the paper's reported effects), not
calibrated on the results. They speak of a real pretrained model (the ``small`` preset runs
SmolLM2-135M-Instruct, ``paper`` any larger model): the tiny LM of the ``smoke`` preset has no
keystone neurons, so the claims are not evaluated on its results.

Paper sources: the abstract and introduction (keystone neurons exist, are extremely sparse,
stable across prompt sets, tightly calibrated, and keystone-only SFT matches full fine-tuning
while forgetting less), Table 1 (masking keystone versus random neurons), the stability and
calibration probes, and the keystone-only SFT experiments.

Kinds (the claim language's ``kind``):

* ``headline``: ``keystone_off_beats_norm_off``, Table 1's comparison in the paper's direction:
  zeroing the keystone neurons costs more accuracy than zeroing as many neurons chosen
  otherwise, against the strongest such control nshot runs (the largest-norm neurons; the
  random sets cost far less), with a one-sided paired t-test over the probe's disjoint prompt
  groups (each finds its own K*). Nothing is trained in the probe: the prompt groups are its
  replicates, as trials are for a method whose rows are not trained networks.
* ``ablation``: the paper's other findings about the set, which the claim language files under
  the same kind (sparsity, collapse, stability, calibration), and keystone-only SFT against
  full fine-tuning (matching its gain; forgetting less). ``sft_keystone_forgets_less`` has a
  premise (``requires``): keystone-only SFT gained at least 90 % of full fine-tuning's gain
  (the paper's "comparable to full FT"). Rows that learned nothing forget nothing, so without
  the premise the claim held for that reason alone; now it is not evaluable then.
* ``control``: the random-neuron negative control of Table 1 (it fails when zeroing random
  neurons changes the accuracy by more than 5 %) and random rows against keystone rows in SFT
  (it fails when random rows gain as much).

Only kinds, the ``requires`` premise and the headline were added after the first runs; no
expression or threshold was changed.
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
        id="keystone_off_beats_norm_off",
        statement="Zeroing the keystone neurons K* lowers the mean accuracy over the four "
        "capabilities below what zeroing as many of the largest-norm neurons does, paired over "
        "disjoint probe prompt groups, each with its own K* (one-sided paired t-test, "
        "p < 0.05).",
        source="Abstract; Table 1 (keystones off: every benchmark drops to 0; as many random "
        "neurons off: within a point of the base model); the largest-norm neurons are the "
        "strongest of nshot's same-size controls (a reconstruction)",
        expr="keystone_off.acc < norm_off.acc",
        test="paired_t",
        presets=_AT_SCALE,
        kind="headline",
    ),
    Claim(
        id="keystone_set_sparse",
        statement="The keystone set K* found by probing and masking is at most 0.5 % of the "
        "model's neurons.",
        source="Abstract; Table 1 (keystone sets below 0.2 % of neurons)",
        expr='keystone_off.n_neurons <= 0.005 * extra("probe", "space", "total")',
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="keystone_off_collapses",
        statement="Zeroing the keystone neurons leaves at most 20 % of the unablated model's "
        "mean accuracy over the four capabilities.",
        source="Table 1 (keystones off: every benchmark drops to 0)",
        expr="keystone_off.collapse_ratio <= 0.2",
        presets=_AT_SCALE,
        kind="ablation",
    ),
    # the mean relative change over the control draws; with the natural suite (unablated
    # accuracy 1 by construction, no draw above it) this equals the mean of |change| per draw
    Claim(
        id="random_off_harmless",
        statement="Negative control: zeroing as many random neurons, with the same module "
        "histogram as K*, changes the mean accuracy by at most 5 % relative (mean over the "
        "control draws; it fails at a larger change).",
        source="Table 1 (random neurons off: scores within a point of the base model)",
        expr="abs(random_module_off.acc - full.acc) / full.acc <= 0.05",
        presets=_AT_SCALE,
        kind="control",
    ),
    Claim(
        id="keystone_set_stable",
        statement="K* found from disjoint prompt groups overlaps with a mean pairwise IoU of at "
        "least 0.5.",
        source="Stability probe (IoU of 80-95 % between prompt groups)",
        expr='extra("probe", "stability", "iou_mean") >= 0.5',
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="calibration_halved",
        statement="Halving the keystone outputs costs at least three times the accuracy that "
        "halving a same-size random set costs.",
        source="Calibration probe (keystone curve falls on both sides of r = 1, random flat)",
        expr=_calibration("0.5"),
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="calibration_doubled",
        statement="Doubling the keystone outputs costs at least three times the accuracy that "
        "doubling a same-size random set costs.",
        source="Calibration probe (keystone curve falls on both sides of r = 1, random flat)",
        expr=_calibration("2"),
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="sft_keystone_matches_full",
        statement="Fine-tuning only the keystone rows gains at least 90 % of full "
        "fine-tuning's gain on the new task (and full fine-tuning gains).",
        source="Abstract; keystone-only SFT experiments (comparable to or better than full FT)",
        expr="sft_keystone.gain >= 0.9 * sft_full.gain and sft_full.gain > 0",
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="sft_keystone_forgets_less",
        statement="Keystone-only fine-tuning loses no more accuracy on the other capabilities "
        "than full fine-tuning (evaluated only where it matched full fine-tuning's gain: rows "
        "that learned nothing forget nothing).",
        source="Abstract; keystone-only SFT experiments (better preserves other capabilities)",
        expr="sft_keystone.forgetting <= sft_full.forgetting",
        presets=_AT_SCALE,
        kind="ablation",
        requires="sft_keystone.gain >= 0.9 * sft_full.gain",
    ),
    Claim(
        id="sft_keystone_beats_random_rows",
        statement="Control: fine-tuning the keystone rows gains more on the new task than "
        "fine-tuning as many random rows with the same module histogram (it fails when the "
        "random rows gain as much or more).",
        source="Keystone-only SFT experiments (the keystone rows, not any sparse rows)",
        expr="sft_keystone.gain > sft_random_rows.gain",
        presets=_AT_SCALE,
        kind="control",
    ),
)
