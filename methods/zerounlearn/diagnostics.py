"""Why an edit erases retained facts: the sensitive subspace, the projector alone, and the
remapping strength (``examples/zerounlearn_diagnose.py`` runs these on one seed).

* :func:`output_values`: the facts' down_proj outputs at the subject's last token, per layer.
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

from .edit import (
    EditHParams,
    Prepared,
    apply_edit,
    collect_at_subject,
    edited_weights,
    load_edited_weights,
    sensitive_basis,
)
from .evaluation import evaluate_model


def _share(values: torch.Tensor, q: torch.Tensor) -> float:
    """Share of the energy of the rows of ``values`` ([n, d]) inside span(q) (q: [d, r])."""
    return float(((values @ q) ** 2).sum() / (values**2).sum().clamp_min(1e-30))


@torch.no_grad()
def output_values(
    model: Any, tok: Any, requests: Sequence[Any], layers: Sequence[int]
) -> dict[int, torch.Tensor]:
    """``{layer: [N, d]}``: the down_proj outputs at the subject's last token of each request's
    bare rewrite prompt (what the shares below are computed on)."""
    return {
        int(layer): collect_at_subject(model, tok, requests, ["{}"], layer, "value")
        for layer in layers
    }


@torch.no_grad()
def subspace_shares(
    model: Any,
    stats: dict[int, Any],
    prep: Prepared,
    forget: dict[int, torch.Tensor],
    retain: dict[int, torch.Tensor],
) -> dict[int, dict[str, float]]:
    """``{layer: {forget, retain, general, rank, dim}}``: shares of down_proj output energy in
    span(Q) (Q from this layer's sensitive representations ``prep.vs``) for the forget and
    retained facts' outputs (:func:`output_values`), and for general text from its key
    statistics ``stats``."""
    out: dict[int, dict[str, float]] = {}
    for layer, vs in prep.vs.items():
        W = mlp(model, layer).down_proj.weight.detach().double()
        q = sensitive_basis(vs).to(W.device)
        C = W @ stats[layer].kkt.to(W.device) @ W.T
        out[int(layer)] = {
            "forget": _share(forget[layer], q),
            "retain": _share(retain[layer], q),
            "general": float(torch.trace(q.T @ C @ q) / torch.trace(C)),
            "rank": int(q.shape[1]),
            "dim": int(q.shape[0]),
        }
    return out


@torch.no_grad()
def shared_direction(values: dict[int, torch.Tensor], top: int = 4) -> dict[int, dict[str, Any]]:
    """``{layer: {mean_direction, top_dims, top_dims_share}}`` for the facts' outputs ``values``
    (:func:`output_values`): the share of their energy along their mean direction, and the
    ``top`` output dimensions with the most energy and their share."""
    out: dict[int, dict[str, Any]] = {}
    for layer, v in values.items():
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
    unknown = [n for n in names if n not in EDITS]
    if unknown:
        raise ValueError(f"unknown diagnostic edit {unknown[0]!r}; known: {sorted(EDITS)}")
    model, tok = setup.model, setup.tok
    original = edited_weights(model, hp.layers)  # the only weights an edit changes
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            variant, forget_term = EDITS[name]
            h = hp if forget_term else dataclasses.replace(hp, lam_f=0.0)
            load_edited_weights(model, original)
            diag = apply_edit(model, tok, setup.forget, prep, h, variant)
            row: dict[str, Any] = dict(evaluate_model(model, tok, setup.evalset))
            row["rel_weight_change"] = {
                int(k): v["rel_weight_change"] for k, v in diag["layers"].items()
            }
            rows[name] = row
    finally:
        load_edited_weights(model, original)
    return rows
