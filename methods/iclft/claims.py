"""The paper's claims about fine-tuning a linear-attention in-context learner, as data.

Every claim compares seed means of the test MSE ``err_{target,unseen}_n{n}`` (target task θ0,
unseen task −θ0, n demonstrations) between the rows of ``experiments()``: the pretrained model
and its zero-shot (``zs_*``) and zero-shot plus auxiliary few-shot (``zsfs_*``) fine-tunings of
all attention matrices (``all``), of V only (``v``) or of Q and K (``qk``). The thresholds were
calibrated on a single-seed run of the ``small`` sizes (d = 5, N_pt = 20, σ² = 0.1, 2000
iterations); the ``smoke`` preset does not leave the saddle of the initialisation, so the claims
are stated for ``small`` and ``paper`` only. The paper shows its results as plots of error
against the number of demonstrations, backed by closed-form optima; the sources name those parts.

Kinds. The paper's central comparison is between ways of fine-tuning for zero-shot accuracy:
fine-tuning V alone preserves in-context learning, also on tasks not seen in fine-tuning, where
fine-tuning Q, K and V destroys it and where the auxiliary few-shot loss degrades it. The two
headline claims test that direction on the unseen task's 20-shot error, V alone against all
matrices (the paper's main contrast) and against V with the auxiliary few-shot loss (the
strongest of the other fine-tunings nshot runs on that error), paired over the training seeds
(``samples``). Each is guarded by its premise: the pretrained model learns in context on the
unseen task (its 20-shot error is below its zero-shot error); without it there is no in-context
learning to preserve. On the target task the paper makes no such claim against the auxiliary
loss, which helps there. The threshold claims on each variant (the matrices fine-tuned, the
auxiliary few-shot loss, Q/K only) are ``ablation``; the two properties of the pretrained model
(the closed form's 1/(n+1) dilution, its 20-shot error) are ``check``.
"""

from __future__ import annotations

from nshot.claims import Claim

_AT_SCALE = ("small", "paper")

_UNSEEN_ICL = "pretrained.err_unseen_n20 < pretrained.err_unseen_n0"

CLAIMS: tuple[Claim, ...] = (
    # the paper's central comparison: V-only fine-tuning preserves in-context learning
    Claim(
        id="v_only_preserves_icl_vs_all",
        kind="headline",
        statement="Zero-shot fine-tuning of V alone preserves in-context learning on an unseen "
        "task where fine-tuning Q, K and V destroys it: its 20-shot error on the unseen task "
        "−θ0 is lower (paired over seeds).",
        source="Main results on fine-tuning all attention parameters and on value-only "
        "fine-tuning (synthetic error-vs-demonstrations figure, unseen task)",
        expr="zs_v.err_unseen_n20 < zs_all.err_unseen_n20",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_UNSEEN_ICL,
    ),
    Claim(
        id="v_only_preserves_icl_vs_fs_loss",
        kind="headline",
        statement="Zero-shot fine-tuning of V alone keeps in-context learning on an unseen task "
        "better than V with the auxiliary few-shot loss: its 20-shot error on the unseen task "
        "−θ0 is lower (paired over seeds).",
        source="Auxiliary few-shot loss result (it degrades in-context learning on tasks not "
        "seen in fine-tuning; synthetic figure, unseen task)",
        expr="zs_v.err_unseen_n20 < zsfs_v.err_unseen_n20",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_UNSEEN_ICL,
    ),
    # fine-tuning every attention matrix for zero-shot accuracy destroys in-context learning
    Claim(
        id="zs_all_reaches_noise_floor",
        kind="ablation",
        statement="Zero-shot fine-tuning of Q, K and V brings the zero-shot error on the target "
        "task down to the noise floor (at most 0.15, σ² = 0.1).",
        source="Main result on fine-tuning all attention parameters (ZS optimum of all "
        "parameters; synthetic error-vs-demonstrations figure)",
        expr="zs_all.err_target_n0 <= 0.15",
        presets=_AT_SCALE,
    ),
    Claim(
        id="zs_all_destroys_icl_target",
        kind="ablation",
        statement="After zero-shot fine-tuning of Q, K and V, the 20-shot error on the target "
        "task is at least 3 times the pretrained model's: demonstrations no longer help.",
        source="Main result on fine-tuning all attention parameters (synthetic "
        "error-vs-demonstrations figure)",
        expr="zs_all.err_target_n20 >= 3 * pretrained.err_target_n20",
        presets=_AT_SCALE,
    ),
    Claim(
        id="zs_all_destroys_icl_unseen",
        kind="ablation",
        statement="After zero-shot fine-tuning of Q, K and V, the 20-shot error on the unseen "
        "task −θ0 is at least 3 times the pretrained model's.",
        source="Main result on fine-tuning all attention parameters (synthetic "
        "error-vs-demonstrations figure, unseen task)",
        expr="zs_all.err_unseen_n20 >= 3 * pretrained.err_unseen_n20",
        presets=_AT_SCALE,
    ),
    # fine-tuning V only improves zero-shot error and keeps in-context learning
    Claim(
        id="zs_v_reaches_vonly_floor",
        kind="ablation",
        statement="Zero-shot fine-tuning of V alone brings the target task's zero-shot error "
        "into [0.25, 0.40], around its irreducible floor 2/(d+4) + σ² = 0.322, not to the "
        "noise floor.",
        source="Value-only fine-tuning result (closed-form V-only ZS optimum)",
        expr="0.25 <= zs_v.err_target_n0 <= 0.40",
        presets=_AT_SCALE,
    ),
    Claim(
        id="zs_v_preserves_icl_target",
        kind="ablation",
        statement="After zero-shot fine-tuning of V alone, the 20-shot error on the target task "
        "stays within 25 % of the pretrained model's.",
        source="Value-only fine-tuning result (synthetic error-vs-demonstrations figure)",
        expr="abs(zs_v.err_target_n20 / pretrained.err_target_n20 - 1) <= 0.25",
        presets=_AT_SCALE,
    ),
    Claim(
        id="zs_v_preserves_icl_unseen",
        kind="ablation",
        statement="After zero-shot fine-tuning of V alone, the 20-shot error on the unseen task "
        "stays within 25 % of the pretrained model's.",
        source="Value-only fine-tuning result (synthetic error-vs-demonstrations figure, "
        "unseen task)",
        expr="abs(zs_v.err_unseen_n20 / pretrained.err_unseen_n20 - 1) <= 0.25",
        presets=_AT_SCALE,
    ),
    # an auxiliary few-shot loss helps the target task and hurts unseen tasks
    Claim(
        id="fs_loss_v_helps_target",
        kind="ablation",
        statement="Adding the auxiliary few-shot loss to V-only fine-tuning lowers the target "
        "task's error at 1, 2 and 5 demonstrations.",
        source="Auxiliary few-shot loss result (FS pull on the in-context weight; synthetic "
        "figure)",
        expr="zsfs_v.err_target_n1 < zs_v.err_target_n1 and "
        "zsfs_v.err_target_n2 < zs_v.err_target_n2 and "
        "zsfs_v.err_target_n5 < zs_v.err_target_n5",
        presets=_AT_SCALE,
    ),
    Claim(
        id="fs_loss_v_hurts_unseen",
        kind="ablation",
        statement="Adding the auxiliary few-shot loss to V-only fine-tuning raises the unseen "
        "task's 20-shot error.",
        source="Auxiliary few-shot loss result (synthetic figure, unseen task)",
        expr="zsfs_v.err_unseen_n20 > zs_v.err_unseen_n20",
        presets=_AT_SCALE,
    ),
    Claim(
        id="fs_loss_all_keeps_target",
        kind="ablation",
        statement="With the auxiliary few-shot loss, fine-tuning Q, K and V keeps the target "
        "task's error at or below 0.7 at every evaluated number of demonstrations.",
        source="Auxiliary few-shot loss result, all parameters (synthetic figure)",
        expr="max(zsfs_all.err_target_n0, zsfs_all.err_target_n1, zsfs_all.err_target_n2, "
        "zsfs_all.err_target_n5, zsfs_all.err_target_n10, zsfs_all.err_target_n20) <= 0.7",
        presets=_AT_SCALE,
    ),
    Claim(
        id="fs_loss_all_hurts_unseen",
        kind="ablation",
        statement="With the auxiliary few-shot loss, fine-tuning Q, K and V still leaves the "
        "unseen task's 20-shot error at least 3 times the pretrained model's.",
        source="Auxiliary few-shot loss result, all parameters (synthetic figure, unseen task)",
        expr="zsfs_all.err_unseen_n20 >= 3 * pretrained.err_unseen_n20",
        presets=_AT_SCALE,
    ),
    # fine-tuning the attention scores only (harmful in the paper)
    Claim(
        id="zs_qk_explodes",
        kind="ablation",
        statement="Zero-shot fine-tuning of Q and K alone makes the 20-shot error on the target "
        "task at least 10 times the pretrained model's.",
        source="Fine-tuning of the query/key matrices (harmful; synthetic figure)",
        expr="zs_qk.err_target_n20 >= 10 * pretrained.err_target_n20",
        presets=_AT_SCALE,
    ),
    # the pretrained model itself
    Claim(
        id="pretrained_one_shot_worse_than_zero_shot",
        kind="check",
        statement="The pretrained model's 1-shot error exceeds its 0-shot error on the target "
        "and the unseen task (the 1/(n+1) normalisation dilutes the query).",
        source="Pretrained linear-attention optimum (closed form, normalisation by n+1)",
        expr="pretrained.err_target_n1 > pretrained.err_target_n0 and "
        "pretrained.err_unseen_n1 > pretrained.err_unseen_n0",
        presets=_AT_SCALE,
    ),
    Claim(
        id="pretrained_learns_in_context",
        kind="check",
        statement="The pretrained model's 20-shot error on the target task is at most 0.45.",
        source="Pretrained linear-attention optimum (closed form; error at N_pt = 20)",
        expr="pretrained.err_target_n20 <= 0.45",
        presets=_AT_SCALE,
    ),
)
