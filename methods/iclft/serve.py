"""iclft's predictor: in-context regression with a pretrained or fine-tuned model.

A request carries the demonstrations (``context_x`` n×d, ``context_y`` n; n may be 0: zero-shot
is the point of the method) and one or more queries (``query_x`` q×d); every query is predicted
with the same context, i.e. prompt ``[z_1 … z_n, z_q]``. ``variant`` picks one of the models in
the checkpoint (``pretrained``, ``zs/v``, ``zs+fs/all``, ... or their row names ``zs_v``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.errors import NshotError
from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .config import row_name
from .model import ICLFTBundle, LinearAttention, load_model

MAX_CONTEXT = 1000
MAX_QUERIES = 10_000


class ICLFTRequest(StrictRequest):
    context_x: list[list[float]] = Field(
        default_factory=list, description="demonstration inputs, n × d (n may be 0)"
    )
    context_y: list[float] = Field(default_factory=list, description="demonstration labels, n")
    query_x: list[list[float]] = Field(..., description="query inputs, q × d (q ≥ 1)")
    variant: str | None = Field(
        None, description="model to use (e.g. 'zs/v', 'pretrained'); default: the checkpoint's"
    )

    @model_validator(mode="after")
    def _check(self) -> ICLFTRequest:
        if not self.query_x:
            raise ValueError("query_x: at least one query is required")
        if len(self.query_x) > MAX_QUERIES:
            raise ValueError(f"query_x: {len(self.query_x)} queries, at most {MAX_QUERIES}")
        if len(self.context_x) != len(self.context_y):
            raise ValueError(
                f"context_y: {len(self.context_y)} labels for {len(self.context_x)} context rows"
            )
        if len(self.context_x) > MAX_CONTEXT:
            raise ValueError(
                f"context_x: {len(self.context_x)} demonstrations, at most max_context = "
                f"{MAX_CONTEXT}"
            )
        d = len(self.query_x[0])
        if d == 0:
            raise ValueError("query_x[0]: a query has no features")
        for name, rows in (("context_x", self.context_x), ("query_x", self.query_x)):
            for i, row in enumerate(rows):
                if len(row) != d:
                    raise ValueError(f"{name}[{i}]: has {len(row)} features, query_x[0] has {d}")
                if not all(math.isfinite(v) for v in row):
                    raise ValueError(f"{name}[{i}]: contains NaN or inf")
        for i, v in enumerate(self.context_y):
            if not math.isfinite(v):
                raise ValueError(f"context_y[{i}]: NaN or inf")
        return self


class ICLFTResponse(BaseModel):
    y_hat: list[float] = Field(..., description="one prediction per query")
    n_context: int
    variant: str
    d: int


class ICLFTPredictor(Predictor[ICLFTRequest, ICLFTResponse]):
    Request = ICLFTRequest
    Response = ICLFTResponse

    def __init__(
        self, models: dict[str, LinearAttention], names: dict[str, str], default: str, d: int,
        info: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """``models``: row -> model (float64 copies are used); ``names``: row -> variant."""
        self.d = d
        self.names = dict(names)
        self.default = default
        self.info = dict(info or {})
        self.params: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for row, net in models.items():
            Q, K, V = (p.detach().double().cpu() for p in (net.Q, net.K, net.V))
            self.params[row] = (Q.T @ K, V[-1].clone())  # ŷ depends on QᵀK and v only

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> ICLFTPredictor:
        bundle, extra = load_model(checkpoint)
        trained = [r for r in extra["rows"] if r in extra.get("trained", [])]
        if not trained:
            raise NshotError(f"{checkpoint.path}: no model of this run has finished training")
        assert isinstance(bundle, ICLFTBundle)
        names = {r: extra.get("variants", {}).get(r, r) for r in trained}
        return cls(
            {r: bundle.models[r] for r in trained}, names, default=trained[-1],
            d=int(extra["d"]), info={"step": checkpoint.step, "theta0": extra.get("theta0")},
        )  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        return {
            "d": self.d,
            "variants": [self.names[r] for r in self.params],
            "default_variant": self.names[self.default],
            "max_context": MAX_CONTEXT,
            "max_queries": MAX_QUERIES,
            **self.info,
        }

    def example_request(self) -> dict[str, Any]:
        """Four demonstrations of the checkpoint's target task θ0 (``y = θ0ᵀx``; a fixed unit
        vector when the checkpoint records none) and two queries, ``d`` features each, for the
        default model: the body a user would POST to ``/predict``."""
        rng = np.random.default_rng(0)
        theta = np.asarray(self.info.get("theta0") or np.ones(self.d) / math.sqrt(self.d))
        cx = np.round(rng.normal(size=(4, self.d)), 3)
        return {
            "context_x": cx.tolist(),
            "context_y": np.round(cx @ theta, 3).tolist(),
            "query_x": np.round(rng.normal(size=(2, self.d)), 3).tolist(),
        }

    def _row(self, variant: str | None) -> str:
        if variant is None:
            return self.default
        for row, name in self.names.items():
            if variant in (row, name):
                return row
        try:
            row = row_name(variant)
        except ValueError:
            row = variant
        if row in self.params:
            return row
        raise ValueError(
            f"variant: unknown model {variant!r}; this checkpoint has "
            f"{[self.names[r] for r in self.params]}"
        )

    @torch.no_grad()
    def __call__(self, request: ICLFTRequest) -> ICLFTResponse:
        row = self._row(request.variant)
        d = len(request.query_x[0])
        if d != self.d:
            raise ValueError(f"query_x[0]: has {d} features, the model expects d = {self.d}")
        M, v = self.params[row]
        n = len(request.context_x)
        q = torch.tensor(request.query_x, dtype=torch.float64)
        zq = torch.cat([torch.ones(len(q), 1, dtype=q.dtype), q, torch.zeros(len(q), 1)], 1)
        # prompt [z_1 … z_n, z_q]: S = (C + z_q z_qᵀ)/(n+1) with C the context's Σ z zᵀ
        if n:
            cx = torch.tensor(request.context_x, dtype=torch.float64)
            cy = torch.tensor(request.context_y, dtype=torch.float64)
            zc = torch.cat([torch.ones(n, 1, dtype=cx.dtype), cx, cy.unsqueeze(1)], 1)
            Cv = zc.T @ (zc @ v)
        else:
            Cv = torch.zeros_like(v)
        Sv = (Cv.unsqueeze(0) + zq * (zq @ v).unsqueeze(1)) / (n + 1)
        y_hat = ((zq @ M) * Sv).sum(-1)
        return ICLFTResponse(y_hat=y_hat.tolist(), n_context=n, variant=self.names[row], d=self.d)
