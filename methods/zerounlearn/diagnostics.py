"""Why an edit erases retained facts: the sensitive subspace, the projector alone, and the
remapping strength (``examples/zerounlearn_diagnose.py`` runs these on one seed).

* :func:`subspace_shares`: per edited layer, the share of the down_proj output energy that lies
  in span(Q), the sensitive subspace the soft projector P shrinks by ε, for the forget facts,
  the retained facts and general text (``tr(QᵀWCWᵀQ) / tr(WCWᵀ)`` with C = E[k kᵀ] on general
  text). The method assumes span(Q) is specific to the forgotten facts: a retain share close to
  the forget share means P erases the retained facts too.
* :func:`shared_direction`: how much of the facts' output energy lies along one shared
  direction (their mean) and on a few fixed output dimensions.
* :func:`edit_rows`: Eff / Gen / Spe / PPL after edits that isolate one part of the method: the
  closed form with no forget term and P = I (what the general-text statistics alone do), the
  projector alone (no forget term), the full edit, and the edit without P; each at the given
  remapping targets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from nshot.nn.lm import mlp

from .edit import EditHParams, Prepared, apply_edit, collect_at_subject, sensitive_basis
from .evaluation import evaluate_model


def _share(values: torch.Tensor, q: torch.Tensor) -> float:
    """Share of the energy of the rows of ``values`` ([n, d]) inside span(q) (q: [d, r])."""
    return float(((values @ q) ** 2).sum() / (values**2).sum().clamp_min(1e-30))


@torch.no_grad()
def subspace_shares(setup: Any, prep: Prepared) -> dict[int, dict[str, float]]:
    """``{layer: {forget, retain, general}}``: shares of down_proj output energy in span(Q)
    (Q from this layer's sensitive representations ``prep.vs``), at the subject's last token
    of the bare rewrite prompts; ``general`` from the general-text key statistics."""
    model, tok = setup.model, setup.tok
    out: dict[int, dict[str, float]] = {}
    for layer, vs in prep.vs.items():
        q = sensitive_basis(vs)
        W = mlp(model, layer).down_proj.weight.detach().double()
        q = q.to(W.device)
        st = setup.stats[layer]
        C = W @ st.kkt.to(W.device) @ W.T
        row = {
            "forget": _share(
                collect_at_subject(model, tok, setup.forget, ["{}"], layer, "value"), q
            ),
            "retain": _share(
                collect_at_subject(model, tok, setup.retain, ["{}"], layer, "value"), q
            ),
            "general": float(torch.trace(q.T @ C @ q) / torch.trace(C)),
            "rank": int(q.shape[1]),
            "dim": int(q.shape[0]),
        }
        out[int(layer)] = row
    return out


@torch.no_grad()
def shared_direction(setup: Any, layers: Sequence[int], top: int = 4) -> dict[int, dict[str, Any]]:
    """``{layer: {mean_direction, top_dims, top_dims_share}}`` over the forget and retained
    facts' down_proj outputs at the subject's last token: the share of their energy along their
    mean direction, and the ``top`` output dimensions with the most energy and their share."""
    model, tok = setup.model, setup.tok
    reqs = list(setup.forget) + list(setup.retain)
    out: dict[int, dict[str, Any]] = {}
    for layer in layers:
        v = collect_at_subject(model, tok, reqs, ["{}"], layer, "value")
        u = v.mean(0)
        u = u / u.norm().clamp_min(1e-30)
        energy = (v**2).sum(0)
        best = energy.topk(min(top, energy.numel()))
        out[int(layer)] = {
            "mean_direction": _share(v, u[:, None]),
            "top_dims": [int(i) for i in best.indices.tolist()],
            "top_dims_share": float(best.values.sum() / energy.sum().clamp_min(1e-30)),
        }
    return out


EDITS = {
    # name: (variant, keep the forget term)
    "statistics_only": ("wo_op", False),
    "projector_only": ("zerounlearn", False),
    "zerounlearn": ("zerounlearn", True),
    "wo_op": ("wo_op", True),
}


def edit_rows(
    setup: Any, prep: Prepared, hp: EditHParams, names: Sequence[str] = tuple(EDITS)
) -> dict[str, dict[str, Any]]:
    """Metrics after each edit of ``names`` (see :data:`EDITS`), the model restored between
    edits and at the end; each row also holds the per-layer relative weight change."""
    model, tok = setup.model, setup.tok
    original = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            if name not in EDITS:
                raise ValueError(f"unknown diagnostic edit {name!r}; known: {sorted(EDITS)}")
            variant, forget_term = EDITS[name]
            h = hp if forget_term else dataclasses.replace(hp, lam_f=0.0)
            model.load_state_dict(original)
            diag = apply_edit(model, tok, setup.forget, prep, h, variant)
            row: dict[str, Any] = dict(evaluate_model(model, tok, setup.evalset))
            row["rel_weight_change"] = {
                int(k): v["rel_weight_change"] for k, v in diag["layers"].items()
            }
            rows[name] = row
    finally:
        model.load_state_dict(original)
    return rows
