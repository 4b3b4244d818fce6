"""TG-DT's claims as data, evaluated over the results of ``nshot reproduce tgdt``.

The thresholds are the targets written down before any run (paper abstract: zero-shot
adaptation from a description through text–behaviour alignment; §3: the TBC and TBM
objectives; reviews of the paper: the description's return field may leak the target); none
was calibrated on a result. Rows are means over training seeds on the held-out goals (5
PointRobot goals; 10 Meta-World ML1 reach goals in ``small-metaworld``, where the same claims,
declared before that track existed, are read unchanged: both tracks have 50 tasks).

Kinds. The paper's central comparison is zero-shot adaptation from a description: the headline
claim tests TG-DT against the naive text DT, the strongest zero-shot baseline nshot runs (a
language-conditioned DT: text embedding concatenated to every token, L_DT only), on the
normalised score, paired over the training seeds (``samples``). Prompt-DT sees an expert
segment of the held-out task (few-shot) and the oracle DT the true goal: they are references,
not zero-shot baselines. The headline's premise is that the goal can be reached at this budget:
the oracle DT scores above the random data's floor (normalised score 0); without it every
comparison of zero-shot rows is noise (on Meta-World ML10 every row sits near 0). Premises were
added to three claims that held vacuously there, their expressions and thresholds unchanged:
``zero_shot_near_oracle`` (0.7 × an oracle at or below 0 is met by any row at the floor) needs
the same premise; ``zero_shot_beats_agnostic`` and ``negative_control_shuffled_text`` also need
the oracle above the task-agnostic DT (knowing the goal pays at all). ``ablation``: the margin claim against the naive
text DT (TG-DT without its alignment objectives), the comparisons with the task-agnostic DT (no
task information) and the oracle DT (the true goal instead of the text), and the matching
head's pair of claims (§3: TBM with negatives tells quality apart, TBC alone cannot).
``control``: the retrieval rate, the shuffled descriptions and the return-field leak test.
``check``: the unit tests.

Declared with the re-made ``small`` (200 training goals, 1,000 steps, the alignment losses
balanced on the text encoder, the MiniLM rows; before its run, thresholds from the spec's §7):
a second headline, ``zero_shot_approaches_oracle`` (TG-DT reaches 0.7 × the oracle DT's
normalised score, paired over the seeds against the untrained row ``oracle_dt_70pct``, which
holds 0.7 × the oracle's score of each seed); the ablations ``alignment_helps_the_policy``
(TG-DT against the same cross-attending text DT trained on L_DT alone, ``tgdt_no_align``: the
alignment objectives and nothing else), ``minilm_beats_language_baseline`` and
``minilm_approaches_oracle`` (the two comparisons with the frozen MiniLM text tower on both
sides); and the control ``goal_matters`` (the benchmark's precondition: a DT without task
information scores at most half the oracle DT's normalised score, so that reading the goal
from the text can pay; it fails on Meta-World ML1 reach, where the agnostic DT nearly equals
the oracle).
"""

from __future__ import annotations

from nshot.claims import Claim

TRAINED = ("small", "small-metaworld", "paper")  # small-metaworld: the Meta-World ML1 track

# a DT given the true goal scores above the random data's floor (normalised score 0)
ORACLE_ABOVE_FLOOR = "oracle_dt.norm_score > 0"
# ... and above the task-agnostic DT: knowing the goal pays on this benchmark
GOAL_MATTERS = f"{ORACLE_ABOVE_FLOOR} and oracle_dt.norm_score > agnostic_dt.norm_score"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="zero_shot_beats_language_baseline",
        kind="headline",
        statement="Zero-shot from the task description alone, TG-DT reaches a higher normalised "
        "score on the held-out tasks than the language-conditioned baseline (the naive text DT), "
        "paired over training seeds.",
        source="abstract (zero-shot adaptation from a natural-language task description); §4 "
        "(language-conditioned baselines)",
        expr="tgdt.norm_score > naive_text_dt.norm_score",
        test="paired_t",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="zero_shot_approaches_oracle",
        kind="headline",
        statement="Zero-shot from the task description alone, TG-DT reaches at least 0.7 × the "
        "normalised score of a DT given the true goal on the held-out tasks, paired over the "
        "training seeds (against 0.7 × the oracle DT's score of the same seed).",
        source="abstract (strong zero-shot generalisation from the description); the spec's "
        "§7 target (0.7 × the oracle)",
        expr="tgdt.norm_score >= oracle_dt_70pct.norm_score",
        test="paired_t",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="alignment_helps_the_policy",
        kind="ablation",
        statement="TG-DT scores higher than the same cross-attending text DT trained on L_DT "
        "alone (no TBC, no TBM), paired over the training seeds: the alignment objectives "
        "make the policy read the description better.",
        source="§3 (TBC and TBM align the text with behaviour for the policy); §5 ablations",
        expr="tgdt.norm_score > tgdt_no_align.norm_score",
        test="paired_t",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="minilm_beats_language_baseline",
        kind="ablation",
        statement="With a frozen pretrained sentence encoder (MiniLM) as the text tower on both "
        "sides, TG-DT scores higher than the naive text DT, paired over the training seeds.",
        source="§3 (a pretrained text encoder, BLIP's); §4 (language-conditioned baselines)",
        expr="tgdt_minilm.norm_score > naive_text_dt_minilm.norm_score",
        test="paired_t",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="minilm_approaches_oracle",
        kind="ablation",
        statement="With the frozen MiniLM text tower, TG-DT reaches at least 0.7 × the oracle "
        "DT's normalised score, paired over the training seeds.",
        source="abstract; §3 (a pretrained text encoder); the spec's §7 target",
        expr="tgdt_minilm.norm_score >= oracle_dt_70pct.norm_score",
        test="paired_t",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="goal_matters",
        kind="control",
        statement="Precondition of every zero-shot comparison: on the held-out tasks a DT "
        "without task information scores at most half the normalised score of the DT given "
        "the true goal (fails where the goal barely matters, as on ML1 reach).",
        source="evaluator check (zero-shot adaptation can only show where the task matters)",
        expr="agnostic_dt.norm_score <= 0.5 * oracle_dt.norm_score",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="goal_matters_success",
        kind="control",
        statement="Precondition on success: a DT without task information reaches the goal in "
        "at most half as many held-out episodes as the DT given the true goal (fails where "
        "the goal barely matters).",
        source="evaluator check (zero-shot adaptation can only show where the task matters)",
        expr="agnostic_dt.success <= 0.5 * oracle_dt.success",
        presets=TRAINED,
        requires="oracle_dt.success > 0",
    ),
    Claim(
        id="zero_shot_beats_naive_text",
        kind="ablation",
        statement="Zero-shot from the description, TG-DT's normalised score is at least 0.10 "
        "above the naive text DT (text embedding concatenated to every token, L_DT only).",
        source="abstract; §4 (language-conditioned baselines)",
        expr="tgdt.norm_score >= naive_text_dt.norm_score + 0.10",
        presets=TRAINED,
    ),
    Claim(
        id="zero_shot_beats_agnostic",
        kind="ablation",
        statement="TG-DT scores at least as high as a task-agnostic multi-task DT.",
        source="abstract (adapts to unseen tasks from text)",
        expr="tgdt.norm_score >= agnostic_dt.norm_score",
        presets=TRAINED,
        requires=GOAL_MATTERS,
    ),
    Claim(
        id="zero_shot_near_oracle",
        kind="ablation",
        statement="TG-DT reaches at least 0.7 × the normalised score of a DT given the true goal.",
        source="abstract (strong zero-shot generalisation)",
        expr="tgdt.norm_score >= 0.7 * oracle_dt.norm_score",
        presets=TRAINED,
        requires=ORACLE_ABOVE_FLOOR,
    ),
    Claim(
        id="retrieval_above_chance",
        kind="control",
        statement="Description → trajectory top-1 retrieval among all tasks is at least 0.10 "
        "(5 × chance among the first small's 50 tasks; 22 × among the re-made small's 220).",
        source="§3 (TBC aligns descriptions and trajectories)",
        expr="tgdt.retrieval_top1 >= 0.10",
        presets=TRAINED,
    ),
    Claim(
        id="tbm_separates_quality",
        kind="ablation",
        statement="The matching head tells a task's expert trajectory from its medium one: "
        "ROC-AUC ≥ 0.8.",
        source="§3 (TBM with negatives)",
        expr="tgdt.tbm_auc >= 0.8",
        presets=TRAINED,
    ),
    Claim(
        id="tbc_only_blind_to_quality",
        kind="ablation",
        statement="A TBC-only model (no TBM) cannot tell expert from medium trajectories of "
        "the same task: its cosine AUC lies in [0.4, 0.6].",
        source="§3 (why TBM is needed beside TBC)",
        expr="tgdt_no_tbm.tbm_auc >= 0.4 and tgdt_no_tbm.tbm_auc <= 0.6",
        presets=TRAINED,
    ),
    Claim(
        id="negative_control_shuffled_text",
        kind="control",
        statement="Negative control: TG-DT rolled out with the descriptions permuted among the "
        "held-out goals falls to the task-agnostic DT's level (at most +0.05).",
        source="evaluator check (the policy must find the goal through the text)",
        expr="tgdt_shuffled_text.norm_score <= agnostic_dt.norm_score + 0.05",
        presets=TRAINED,
        requires=GOAL_MATTERS,
    ),
    Claim(
        id="return_field_does_not_leak",
        kind="control",
        statement="Scaling the description's return field by 0.5 or 1.5 changes TG-DT's "
        "achieved return by less than 20 % (the policy follows the goal, not the number).",
        source="reviews (metadata leakage through the description)",
        expr="tgdt.leak_delta < 0.20",
        presets=TRAINED,
    ),
    Claim(
        id="unit_padding",
        kind="check",
        statement="Padded positions never change the predicted actions or L_DT (1e-6).",
        source="§3 (L_DT over non-padded positions)",
        expr='extra("unit", "padding_max_abs_change") <= 1e-6',
    ),
    Claim(
        id="unit_causal",
        kind="check",
        statement="The action at step t does not depend on a_t or any token after s_t (1e-6).",
        source="§3 (actions predicted from the state token)",
        expr='extra("unit", "causal_max_abs_change") <= 1e-6',
    ),
    Claim(
        id="unit_tbm_negatives",
        kind="check",
        statement="Every TBM batch holds negatives (a quarter of its pairs are positive).",
        source="§3 (TBM needs negatives; all-positive labels make L_TBM trivial)",
        expr='extra("unit", "tbm_positive_fraction_min") == 0.25 '
        'and extra("unit", "tbm_positive_fraction_max") == 0.25',
    ),
)
