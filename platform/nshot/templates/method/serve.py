"""skeleton's predictor: one few-shot episode per request.

A request holds labelled support rows and the query rows to classify; the answer is a label and
the class probabilities per query. Requests are validated before the model runs: a malformed
one is a 422 naming the field, never a 500.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_finite, check_label_types
from nshot.train.checkpoint import LoadedCheckpoint

from .data import episode, examples
from .model import load_model, prototype_logits

MAX_ROWS = 1000  # support rows, and query rows, per request
Label = int | str  # one type per request: all integers or all strings


class SkeletonRequest(StrictRequest):
    support_x: list[list[float]] = Field(
        ..., min_length=1, max_length=MAX_ROWS, description="support rows, n x dim"
    )
    support_y: list[Label] = Field(
        ..., min_length=1, max_length=MAX_ROWS, description="one label per support row"
    )
    query_x: list[list[float]] = Field(
        ..., min_length=1, max_length=MAX_ROWS, description="rows to classify, q x dim"
    )

    @model_validator(mode="after")
    def _check(self) -> SkeletonRequest:
        if len(self.support_y) != len(self.support_x):
            raise ValueError(
                f"support_y: {len(self.support_y)} labels for {len(self.support_x)} rows"
            )
        width = len(self.support_x[0])
        for name, rows in (("support_x", self.support_x), ("query_x", self.query_x)):
            for i, row in enumerate(rows):
                if len(row) != width:
                    raise ValueError(f"{name}[{i}]: {len(row)} features, support_x[0] has {width}")
                check_finite(f"{name}[{i}]", row)
        check_label_types("support_y", self.support_y)
        return self


class SkeletonResponse(BaseModel):
    labels: list[Label] = Field(..., description="the predicted label of each query")
    probs: list[dict[str, float]] = Field(..., description="per query: label -> probability")


class SkeletonPredictor(
    Predictor[SkeletonRequest, SkeletonResponse],
):
    Request = SkeletonRequest
    Response = SkeletonResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model, self.cfg = load_model(checkpoint)

    @torch.no_grad()
    def __call__(
        self,
        request: SkeletonRequest,
    ) -> SkeletonResponse:
        width = len(request.support_x[0])
        if width != self.cfg.dim:
            raise ValueError(
                f"support_x: rows have {width} features; the model takes {self.cfg.dim}"
            )
        classes = list(dict.fromkeys(request.support_y))  # in order of first appearance
        index = {c: i for i, c in enumerate(classes)}
        sy = torch.tensor([index[c] for c in request.support_y])
        sx = self.model(torch.tensor(request.support_x, dtype=torch.float32))
        qx = self.model(torch.tensor(request.query_x, dtype=torch.float32))
        probs = prototype_logits(sx, sy, qx, len(classes)).softmax(1)
        return SkeletonResponse(
            labels=[classes[i] for i in probs.argmax(1).tolist()],
            probs=[{str(c): float(p) for c, p in zip(classes, row)} for row in probs.tolist()],
        )

    def metadata(self) -> dict[str, Any]:
        return {"dim": self.cfg.dim, "trained_ways": self.cfg.ways, "shots": self.cfg.shots}

    def example_request(self) -> dict[str, Any]:
        """A 5-way episode of held-out classes, as a user sends it to ``/predict``."""
        cfg = self.cfg.replace(ways=min(5, self.cfg.ways), queries=min(2, self.cfg.queries))
        sx, sy, qx, _ = episode(*examples(cfg, "test"), cfg, np.random.default_rng(0))
        return {
            "support_x": np.round(sx, 3).tolist(),
            "support_y": [f"class-{c}" for c in sy.tolist()],
            "query_x": np.round(qx, 3).tolist(),
        }
