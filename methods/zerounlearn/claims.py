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
"""

from __future__ import annotations

from nshot.claims import Claim

_AT_SCALE = ("small", "paper")

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="base_knows_facts",
        statement="Before any edit the model knows the facts to forget and the facts to "
        "retain (Eff and Spe of the unedited model at least 90 %).",
        source="Evaluation protocol of the main results table (facts the model knows)",
        expr="base.eff >= 90 and base.spe >= 90",
        presets=_AT_SCALE,
    ),
    Claim(
        id="forgets",
        statement="After the edit the model gives the true answer to at most 10 % of the "
        "forgotten facts' prompts and at most 25 % of their paraphrases.",
        source="Main results table (ZeroUnlearn Eff 0.40, Gen 4.60 on Multi-CounterFact)",
        expr="zerounlearn.eff <= 10 and zerounlearn.gen <= 25",
        presets=_AT_SCALE,
    ),
    Claim(
        id="keeps_retained_facts",
        statement="The edit keeps the retained facts: Spe stays within 10 points of the "
        "unedited model and at least 85 % of it.",
        source="Main results table (ZeroUnlearn Spe close to the base model's)",
        expr="zerounlearn.spe >= base.spe - 10 and zerounlearn.spe >= 0.85 * base.spe",
        presets=_AT_SCALE,
    ),
    Claim(
        id="keeps_perplexity",
        statement="The edit raises perplexity on held-out general text by at most 15 %.",
        source="Main results table (PPL 12.88 to 13.06 on Llama-3.2-3B)",
        expr="zerounlearn.ppl <= 1.15 * base.ppl",
        presets=_AT_SCALE,
    ),
    # "gradient ascent forgets as well only at a cost": its Eff is more than 10 points worse,
    # or its Spe lower, or its PPL higher than ZeroUnlearn's (an 'or' written as max(...) > 0)
    Claim(
        id="gradient_ascent_costs_utility",
        statement="Gradient ascent reaches ZeroUnlearn's forgetting only with a lower Spe or a "
        "higher perplexity.",
        source="Main results table (GA: Spe 1.06, PPL above 1000)",
        expr="max(gradient_ascent.eff - zerounlearn.eff - 10, "
        "zerounlearn.spe - gradient_ascent.spe, gradient_ascent.ppl - zerounlearn.ppl) > 0",
        presets=_AT_SCALE,
    ),
    Claim(
        id="gradient_ascent_breaks_model",
        statement="Gradient ascent at least quintuples the perplexity of the unedited model.",
        source="Main results table (GA PPL above 1000 against 12.88)",
        expr="gradient_ascent.ppl >= 5 * base.ppl",
        presets=_AT_SCALE,
    ),
    Claim(
        id="projection_helps_forgetting",
        statement="Without the orthogonal projection the edit forgets less: its Eff is at "
        "least 5 points above ZeroUnlearn's.",
        source="Supplement, ablations (w/o orthogonal projection: a higher Eff on ZsRE)",
        expr="wo_op.eff >= zerounlearn.eff + 5",
        presets=_AT_SCALE,
    ),
    Claim(
        id="utility_term_keeps_perplexity",
        statement="Without the general-text utility term the edit raises perplexity at least "
        "as much as ZeroUnlearn.",
        source="Supplement, ablations (w/o utility term: PPL 14.98 vs 13.08 on ZsRE)",
        expr="wo_ut.ppl >= zerounlearn.ppl",
        presets=_AT_SCALE,
    ),
)
