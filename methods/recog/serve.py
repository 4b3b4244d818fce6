"""ReCoG's predictor: a new property defined by its support set, predicted for query SMILES.

The request's auxiliary context: the model's computed properties are filled in with RDKit for
every molecule (unless given); assay properties (the training targets of the real-label track)
are unmeasured edges unless ``aux_labels`` gives them. The model's ``n_aux`` auxiliaries are
chosen as in training (observed assays first, then computed properties, ties by ``seed``);
injected distractors are never served.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.data.molecules import ecfp, parse_smiles
from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .data import COMPUTED, Episode, computed_properties, rank_aux
from .model import RecogModel, episode_tensors, load_model

MAX_SUPPORT = 64
MAX_QUERIES = 1000


class SupportMolecule(StrictRequest):
    smiles: str
    label: int


class RecogRequest(StrictRequest):
    support: list[SupportMolecule] = Field(
        ..., max_length=MAX_SUPPORT, description="labelled molecules defining the property"
    )
    query: list[str] = Field(..., max_length=MAX_QUERIES, description="SMILES to predict")
    aux_labels: dict[str, dict[str, int]] | None = Field(
        None, description="SMILES (of the support or the query) -> {property: 0 or 1}"
    )
    return_gates: bool = True
    seed: int = Field(0, ge=0, description="tie-break of the auxiliaries' choice")

    @model_validator(mode="after")
    def _check(self) -> RecogRequest:
        if not self.support:
            raise ValueError("support: the support set is empty")
        if not self.query:
            raise ValueError("query: no query molecule")
        for i, m in enumerate(self.support):
            if m.label not in (0, 1):
                raise ValueError(f"support[{i}].label: must be 0 or 1, got {m.label}")
        if len({m.label for m in self.support}) < 2:
            raise ValueError(
                "support: needs at least one molecule of each class (label 0 and label 1)"
            )
        for i, m in enumerate(self.support):
            _parse(m.smiles, f"support[{i}].smiles")
        for i, s in enumerate(self.query):
            _parse(s, f"query[{i}]")
        known = {m.smiles for m in self.support} | set(self.query)
        for smi, labels in (self.aux_labels or {}).items():
            if smi not in known:
                raise ValueError(
                    f"aux_labels: {smi[:80]!r} is not a SMILES of the support or the query"
                )
            for prop, v in labels.items():
                if v not in (0, 1):
                    raise ValueError(
                        f"aux_labels: label of {prop[:80]!r} for {smi[:80]!r} must be 0 or 1, "
                        f"got {v}"
                    )
        return self


def _parse(smiles: str, field: str):
    try:
        return parse_smiles(smiles)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None


class AuxSource(BaseModel):
    computed: int
    given: int
    missing: int


class RecogResponse(BaseModel):
    probs: list[float] = Field(..., description="P(label 1) per query, in query order")
    gates: dict[str, float] = Field(..., description="π_a of each auxiliary used (CGIB)")
    n_aux: int
    aux_source: AuxSource


class RecogPredictor(Predictor[RecogRequest, RecogResponse]):
    Request = RecogRequest
    Response = RecogResponse

    def __init__(self, model: torch.nn.Module, cfg, props: dict[str, Any]) -> None:
        self.model = model.eval()
        self.cfg = cfg
        self.names: list[str] = list(props["names"])
        kinds = list(props["kinds"])
        test = set(props.get("test_targets", []))
        # servable auxiliaries: informative properties the model trained with as context
        self.cand = [
            j for j, k in enumerate(kinds) if k != "distractor" and self.names[j] not in test
        ]
        self.assay = np.array([kinds[j] == "target" for j in self.cand])
        self.computed_col = {n: c for c, n in enumerate(COMPUTED)}
        self.index = {n: j for j, n in enumerate(self.names)}
        self.servable = {self.names[j] for j in self.cand}

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> RecogPredictor:
        model, cfg, props = load_model(checkpoint)
        return cls(model, cfg, props)

    def metadata(self) -> dict[str, Any]:
        return {
            "system": self.cfg.system,
            "track": self.cfg.track,
            "n_aux": self.cfg.n_aux if isinstance(self.model, RecogModel) else 0,
            "properties": sorted(self.servable),
            "computed_properties": list(COMPUTED),
            "max_support": MAX_SUPPORT,
            "max_queries": MAX_QUERIES,
        }

    def example_request(self) -> dict[str, Any]:
        """Phenols (label 1) against other small molecules (label 0), three queries."""
        return {
            "support": [
                {"smiles": "Oc1ccccc1", "label": 1},
                {"smiles": "Cc1ccc(O)cc1", "label": 1},
                {"smiles": "CCOC(C)=O", "label": 0},
                {"smiles": "CCN(CC)CC", "label": 0},
            ],
            "query": ["Oc1ccc(Cl)cc1", "CCCCCC", "COc1ccccc1"],
        }

    def _context(self, request: RecogRequest, smiles: list[str]):
        """The auxiliary label matrix over all candidates ``[n, C]`` and its sources."""
        given = request.aux_labels or {}
        for smi, labels in given.items():
            for prop in labels:
                if prop not in self.servable:
                    raise ValueError(
                        f"aux_labels: property {prop[:80]!r} (for {smi[:80]!r}) is not one this "
                        "model knows; see /metadata properties"
                    )
        comp = computed_properties([parse_smiles(s, i) for i, s in enumerate(smiles)])
        mat = np.full((len(smiles), len(self.cand)), np.nan, dtype=np.float32)
        source = np.zeros(mat.shape, dtype=np.int8)  # 0 missing, 1 computed, 2 given
        for c, j in enumerate(self.cand):
            col = self.computed_col.get(self.names[j])
            if col is not None:
                mat[:, c] = comp[:, col]
                source[:, c] = 1
        pos = {self.names[j]: c for c, j in enumerate(self.cand)}
        for i, s in enumerate(smiles):
            for prop, v in given.get(s, {}).items():
                mat[i, pos[prop]] = float(v)
                source[i, pos[prop]] = 2
        return mat, source

    def _episode(self, request: RecogRequest):
        ss = [m.smiles for m in request.support]
        smiles = ss + list(request.query)
        n_s = len(ss)
        fp = ecfp(smiles, n_bits=self.cfg.fp_bits).astype(np.float32)
        if isinstance(self.model, RecogModel):
            mat, source = self._context(request, smiles)
            observed = (~np.isnan(mat)).sum(0)
            rng = np.random.default_rng([request.seed, 1])
            pick = rank_aux(self.assay, observed, self.cfg.n_aux, rng)
            aux = np.array([self.cand[c] for c in pick], dtype=np.int64)
            mat, source = mat[:, pick], source[:, pick]
            r_aux = self.model.pair_counts[aux][:, aux].numpy()
        else:
            mat = np.zeros((len(smiles), 0), dtype=np.float32)
            source = np.zeros((len(smiles), 0), dtype=np.int8)
            aux = np.zeros(0, dtype=np.int64)
            r_aux = np.zeros((0, 0, 4), dtype=np.float32)
        ep = Episode(
            target=-1, xs=fp[:n_s], ys=np.array([m.label for m in request.support], np.float32),
            xq=fp[n_s:], yq=np.zeros(len(request.query), np.float32), ls=mat[:n_s],
            lq=mat[n_s:], aux=aux, distractor=np.zeros(len(aux), bool), r_aux=r_aux,
            smiles_s=ss, smiles_q=list(request.query),
        )  # fmt: skip
        return ep, source

    @torch.no_grad()
    def __call__(self, request: RecogRequest) -> RecogResponse:
        ep, source = self._episode(request)
        out = self.model(**episode_tensors(ep))
        probs = torch.sigmoid(out.logits).tolist()
        gates: dict[str, float] = {}
        if request.return_gates and out.gates is not None:
            gates = {self.names[a]: float(g) for a, g in zip(ep.aux.tolist(), out.gates.tolist())}
        return RecogResponse(
            probs=[float(p) for p in probs],
            gates=gates,
            n_aux=len(ep.aux),
            aux_source=AuxSource(
                computed=int((source == 1).sum()),
                given=int((source == 2).sum()),
                missing=int((source == 0).sum()),
            ),
        )

    @torch.no_grad()
    def one_shot_embeddings(self, request: RecogRequest, kind: str | None = None):
        """Frozen per-molecule features for conformal prediction sets: the molecule encoder's
        embedding of each support and query molecule on its own (no label, no other row)."""
        from nshot.serve.conformal import OneShotEpisode

        smiles = [m.smiles for m in request.support] + list(request.query)
        fp = torch.from_numpy(ecfp(smiles, n_bits=self.cfg.fp_bits).astype(np.float32))
        emb = self.model.encoder(fp, smiles).numpy()
        n = len(request.support)
        return OneShotEpisode(
            support_emb=emb[:n],
            support_labels=np.array([m.label for m in request.support]),
            query_emb=emb[n:],
            classes=[0, 1],
        )
