"""The ZeroUnlearn paper's claims, as data over the results of ``nshot reproduce zerounlearn``.

Metrics are in % (``eff``, ``gen``, ``spe``) and perplexity (``ppl``), means over seeds. The
thresholds are targets set from the paper's ordering of the systems before any run, not
calibrated on the results; where two stated targets differ, the claim holds only if both do
(the stricter one decides). They speak of a pretrained model that knows its facts (the
``small`` preset runs SmolLM2-135M-Instruct, ``paper`` a larger model): the tiny LM and the few
optimisation steps of the ``smoke`` preset only test the code paths, so the claims are not
evaluated on its results.

Paper sources: the main results table (Eff / Gen / Spe / PPL of ZeroUnlearn and the baselines
on Multi-CounterFact and ZsRE) and the supplement's ablations (without the orthogonal
projection, without the utility term).

Kinds. The headline is the main table's comparison in the paper's direction against the
strongest of its baselines that nshot runs, as the paper states it: better forgetting than the
editing baselines, and forgetting without the utility cost of the retraining-based ones.

* Forgetting against the editors: Eff of ZeroUnlearn below AlphaEdit's (the paper's strongest
  editor: Multi-CounterFact Eff 2.60, Gen 11.80) and below MEMIT's (17.00, 18.30), both
  headlines so that the verdict covers whichever editor is stronger on the model nshot runs.
  MEMIT and AlphaEdit write ZeroUnlearn's own remapping targets with its keys and residual
  spreading (:mod:`.edit`), so the rows differ only in the update rule. Paired t-tests over the
  (seed, forgotten fact) instances (``samples``: one value per fact, seed after seed).
* Utility against the forgetters: gradient ascent (GA) forgets about as well as ZeroUnlearn in
  the paper (Eff 2.00 against 0.40) but breaks the model (PPL above 1000 against 13.06); its
  budget (learning rate and steps) is chosen per seed on held-out facts (``ga_budget``). Its
  headline compares perplexity, paired over seeds, guarded by both forgetting (Eff at most 10).
  Fine-tuning toward the neutral target (FT) forgets as completely as ZeroUnlearn (Eff 0.00
  against 0.40) and in nshot; against it the paper shows the utility kept: Spe 14.90 against
  0.00 and PPL 13.06 against 18.25, paired over seeds.

Every headline is guarded by its premise: the edit forgets (Eff at most 10, the bar of
``forgets``; an edit that forgets nothing keeps every retained fact and the perplexity
trivially), the unedited model knows the facts (otherwise both rows sit at the floor). The
threshold claims of the main table, the paraphrase comparison with AlphaEdit and the
supplement's ablations are ``ablation`` (paper claims other than the headline comparison).
``base_knows_facts`` is a ``check`` (the facts are filtered to those the model answers, so it
holds by construction), as are the two sanity checks of the baselines: each editor forgets
something (an editor that did nothing would make its headline vacuous), and GA's chosen budget
forgets its held-out facts (a GA that forgets nothing is not the paper's baseline).
"""

from __future__ import annotations

from nshot.claims import Claim

_AT_SCALE = ("small", "paper")

_FORGETS = "zerounlearn.eff <= 10"
_KNOWS = "base.eff >= 90"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="forgets_more_than_alphaedit",
        kind="headline",
        statement="ZeroUnlearn forgets more than AlphaEdit writing the same neutral target: "
        "fewer forgotten facts are still answered on their rewrite prompt (Eff), paired over "
        "the forgotten facts of every seed.",
        source="Main results table, Multi-CounterFact on Llama-3.2-3B (Eff: ZeroUnlearn 0.40, "
        "AlphaEdit 2.60; ZsRE 27.85 and 29.59)",
        expr="zerounlearn.eff < alphaedit.eff",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_KNOWS,
    ),
    Claim(
        id="forgets_more_than_memit",
        kind="headline",
        statement="ZeroUnlearn forgets more than MEMIT writing the same neutral target: lower "
        "Eff, paired over the forgotten facts of every seed.",
        source="Main results table, Multi-CounterFact on Llama-3.2-3B (Eff: ZeroUnlearn 0.40, "
        "MEMIT 17.00; ZsRE 27.85 and 32.32)",
        expr="zerounlearn.eff < memit.eff",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_KNOWS,
    ),
    Claim(
        id="perplexity_below_gradient_ascent",
        kind="headline",
        statement="Where both forget, gradient ascent at a budget validated on held-out facts "
        "costs more general utility than ZeroUnlearn: ZeroUnlearn's perplexity on held-out "
        "general text is lower (paired over seeds).",
        source="Main results table, Multi-CounterFact on Llama-3.2-3B (GA: Eff 2.00, PPL above "
        "1000; ZeroUnlearn: Eff 0.40, PPL 13.06)",
        expr="zerounlearn.ppl < gradient_ascent.ppl",
        test="paired_t",
        presets=_AT_SCALE,
        requires=f"{_FORGETS} and gradient_ascent.eff <= 10",
    ),
    Claim(
        id="keeps_more_facts_than_finetuning",
        kind="headline",
        statement="ZeroUnlearn forgets as fine-tuning toward the neutral target does, yet keeps "
        "more of the retained facts: its Spe is higher than fine-tuning's (paired over seeds).",
        source="Main results table, Multi-CounterFact on Llama-3.2-3B (Spe: ZeroUnlearn 14.90, "
        "FT 0.00; Eff 0.40 and 0.00)",
        expr="zerounlearn.spe > finetune_neutral.spe",
        test="paired_t",
        presets=_AT_SCALE,
        requires=f"{_FORGETS} and base.spe >= 90",
    ),
    Claim(
        id="perplexity_below_finetuning",
        kind="headline",
        statement="ZeroUnlearn keeps general utility better than fine-tuning toward the neutral "
        "target: its perplexity on held-out general text is lower (paired over seeds).",
        source="Main results table, Multi-CounterFact on Llama-3.2-3B (PPL: ZeroUnlearn 13.06, "
        "FT 18.25)",
        expr="zerounlearn.ppl < finetune_neutral.ppl",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_FORGETS,
    ),
    Claim(
        id="base_knows_facts",
        kind="check",
        statement="Before any edit the model knows the facts to forget and the facts to "
        "retain (Eff and Spe of the unedited model at least 90 %).",
        source="Evaluation protocol of the main results table (facts the model knows)",
        expr="base.eff >= 90 and base.spe >= 90",
        presets=_AT_SCALE,
    ),
    Claim(
        id="forgets",
        kind="ablation",
        statement="After the edit the model gives the true answer to at most 10 % of the "
        "forgotten facts' prompts and at most 25 % of their paraphrases.",
        source="Main results table (ZeroUnlearn Eff 0.40, Gen 4.60 on Multi-CounterFact)",
        expr="zerounlearn.eff <= 10 and zerounlearn.gen <= 25",
        presets=_AT_SCALE,
    ),
    Claim(
        id="keeps_retained_facts",
        kind="ablation",
        statement="The edit keeps the retained facts: Spe stays within 10 points of the "
        "unedited model and at least 85 % of it.",
        source="Main results table (ZeroUnlearn Spe close to the base model's)",
        expr="zerounlearn.spe >= base.spe - 10 and zerounlearn.spe >= 0.85 * base.spe",
        presets=_AT_SCALE,
    ),
    Claim(
        id="keeps_perplexity",
        kind="ablation",
        statement="The edit raises perplexity on held-out general text by at most 15 %.",
        source="Main results table (PPL 12.88 to 13.06 on Llama-3.2-3B)",
        expr="zerounlearn.ppl <= 1.15 * base.ppl",
        presets=_AT_SCALE,
    ),
    # "gradient ascent forgets as well only at a cost": its Eff is more than 10 points worse,
    # or its Spe lower, or its PPL higher than ZeroUnlearn's (an 'or' written as max(...) > 0)
    Claim(
        id="gradient_ascent_costs_utility",
        kind="ablation",
        statement="Gradient ascent reaches ZeroUnlearn's forgetting only with a lower Spe or a "
        "higher perplexity.",
        source="Main results table (GA: Spe 1.06, PPL above 1000)",
        expr="max(gradient_ascent.eff - zerounlearn.eff - 10, "
        "zerounlearn.spe - gradient_ascent.spe, gradient_ascent.ppl - zerounlearn.ppl) > 0",
        presets=_AT_SCALE,
    ),
    Claim(
        id="gradient_ascent_breaks_model",
        kind="ablation",
        statement="Gradient ascent at least quintuples the perplexity of the unedited model.",
        source="Main results table (GA PPL above 1000 against 12.88)",
        expr="gradient_ascent.ppl >= 5 * base.ppl",
        presets=_AT_SCALE,
    ),
    Claim(
        id="projection_helps_forgetting",
        kind="ablation",
        statement="Without the orthogonal projection the edit forgets less: its Eff is at "
        "least 5 points above ZeroUnlearn's.",
        source="Supplement, ablations (w/o orthogonal projection: a higher Eff on ZsRE)",
        expr="wo_op.eff >= zerounlearn.eff + 5",
        presets=_AT_SCALE,
    ),
    Claim(
        id="paraphrases_forgotten_more_than_alphaedit",
        kind="ablation",
        statement="ZeroUnlearn's forgetting reaches the paraphrases more than AlphaEdit's: "
        "lower Gen, paired over the forgotten facts of every seed.",
        source="Main results table (Gen: ZeroUnlearn 4.60, AlphaEdit 11.80 on "
        "Multi-CounterFact; 27.52 and 29.90 on ZsRE)",
        expr="zerounlearn.gen < alphaedit.gen",
        test="paired_t",
        presets=_AT_SCALE,
        requires=_KNOWS,
    ),
    Claim(
        id="editing_baselines_forget_something",
        kind="check",
        statement="MEMIT and AlphaEdit edit the model: each leaves fewer forget prompts "
        "answered than the unedited model does (Eff below the base's).",
        source="Sanity check of the baseline rows (an editor that did nothing would make the "
        "forgetting headline hold vacuously)",
        expr="memit.eff < base.eff and alphaedit.eff < base.eff",
        presets=_AT_SCALE,
    ),
    Claim(
        id="gradient_ascent_budget_forgets_held_out_facts",
        kind="check",
        statement="On every seed the validated gradient-ascent budget forgets its held-out "
        "facts (Eff at most 10 on them).",
        source="Sanity check of the gradient-ascent row (a budget that forgets nothing is not "
        "the paper's baseline)",
        expr='extra("ga_budget", "forgot_on_validation") >= 1',
        presets=_AT_SCALE,
    ),
    Claim(
        id="utility_term_keeps_perplexity",
        kind="ablation",
        statement="Without the general-text utility term the edit raises perplexity at least "
        "as much as ZeroUnlearn.",
        source="Supplement, ablations (w/o utility term: PPL 14.98 vs 13.08 on ZsRE)",
        expr="wo_ut.ppl >= zerounlearn.ppl",
        presets=_AT_SCALE,
    ),
)
