"""weightspace predictor: edit a 1→3→1 ReLU INR (the batched form answers each INR as alone).

The request carries the input INR's layers; the answer is f_OCE, the mean of the k edited
INRs, on the grid (the training grid by default), and optionally the k edited INRs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_finite
from nshot.train.checkpoint import LoadedCheckpoint

from .model import load_model

MAX_POINTS = 65_536
SHAPES = [((3, 1), (3,)), ((1, 3), (1,))]  # (W, b) per layer of the 1→3→1 INR


class Layer(StrictRequest):
    W: list[list[float]]
    b: list[float]


class WeightspaceRequest(StrictRequest):
    layers: list[Layer] = Field(..., description="the input INR: [{W, b}] per layer, 1→3→1")
    grid: list[list[float]] | None = Field(
        None, description=f"points to render (1-D: [[x], ...], x in [-1, 1]), ≤ {MAX_POINTS}"
    )
    return_weights: bool = False

    @model_validator(mode="after")
    def _check(self) -> WeightspaceRequest:
        want = " and ".join(f"W {w[0]}×{w[1]}, b {b[0]}" for w, b in SHAPES)
        if len(self.layers) != len(SHAPES):
            raise ValueError(f"layers: expected {len(SHAPES)} layers ({want}), "
                             f"got {len(self.layers)}")  # fmt: skip
        for i, (layer, (ws, bs)) in enumerate(zip(self.layers, SHAPES, strict=True)):
            shape = (len(layer.W), len(layer.W[0]) if layer.W else 0)
            if shape != ws or any(len(r) != ws[1] for r in layer.W) or len(layer.b) != bs[0]:
                raise ValueError(f"layers[{i}]: expected W {ws[0]}×{ws[1]} and b {bs[0]} "
                                 f"(architecture {want})")  # fmt: skip
            check_finite(f"layers[{i}]", [v for r in layer.W for v in r] + list(layer.b))
        if self.grid is not None:
            if not self.grid:
                raise ValueError("grid: at least one point is needed")
            if len(self.grid) > MAX_POINTS:
                raise ValueError(f"grid: {len(self.grid)} points, the limit is {MAX_POINTS}")
            for j, p in enumerate(self.grid):
                if len(p) != 1:
                    raise ValueError(f"grid[{j}]: points are 1-D ([x]), got {len(p)} values")
                if not math.isfinite(p[0]) or not -1.0 <= p[0] <= 1.0:
                    raise ValueError(f"grid[{j}]: {p[0]} is outside the training domain [-1, 1]")
        return self


class WeightspaceResponse(BaseModel):
    values: list[float]
    k: int
    grid_shape: list[int]
    edited: list[list[Layer]] | None = None


class WeightspacePredictor(Predictor[WeightspaceRequest, WeightspaceResponse]):
    Request = WeightspaceRequest
    Response = WeightspaceResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model = load_model(checkpoint)
        self.grid_points = int(checkpoint.extra.get("grid", 128))
        self.meta = {**checkpoint.extra.get("model", {}), "params": checkpoint.extra.get("params"),
                     "task": checkpoint.extra.get("task"), "grid": self.grid_points,
                     "architecture": "relu 1-3-1", "max_points": MAX_POINTS}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        return self.meta

    def example_request(self) -> dict[str, Any]:
        """A hat INR as in the training data (centre 0.5, half-width 0.2, height 1:
        ``5·relu(x − 0.3) − 10·relu(x − 0.5) + 5·relu(x − 0.7)``), in the layer shapes the
        model edits (``SHAPES``); the answer is f_OCE on the checkpoint's training grid."""
        c, w, a = 0.5, 0.2, 1.0
        (w1, _), (w2, _) = SHAPES
        return {
            "layers": [
                {"W": [[1.0]] * w1[0], "b": [-(c - w), -c, -(c + w)]},
                {"W": [[a / w, -2 * a / w, a / w]] * w2[0], "b": [0.0]},
            ]
        }

    def _tensors(self, requests: list[WeightspaceRequest]) -> tuple[torch.Tensor, ...]:
        W1 = torch.tensor([r.layers[0].W for r in requests], dtype=torch.float32)
        b1 = torch.tensor([r.layers[0].b for r in requests], dtype=torch.float32)
        W2 = torch.tensor([r.layers[1].W for r in requests], dtype=torch.float32)
        b2 = torch.tensor([r.layers[1].b for r in requests], dtype=torch.float32)
        return W1, b1, W2, b2

    def batch(self, requests: list[WeightspaceRequest]) -> list[WeightspaceResponse]:
        """One meta-network pass per request (the network is tiny, and a request's answer must not
        depend on the batch it arrives in: a matrix product's rounding changes with the batch
        size); each renders on its own grid."""
        from .model import render

        tensors = self._tensors(requests)
        with torch.no_grad():
            passes = [self.model(*(t[i : i + 1] for t in tensors)) for i in range(len(requests))]
            eW1, eb1, eW2, eb2 = (torch.cat([p[j] for p in passes]) for j in range(4))
        out = []
        for i, r in enumerate(requests):
            x = (torch.tensor([p[0] for p in r.grid], dtype=torch.float32) if r.grid is not None
                 else torch.linspace(-1.0, 1.0, self.grid_points))  # fmt: skip
            with torch.no_grad():
                vals = render(eW1[i], eb1[i], eW2[i], eb2[i], x).mean(0)
            edited = None
            if r.return_weights:
                edited = [
                    [Layer(W=eW1[i, c].tolist(), b=eb1[i, c].tolist()),
                     Layer(W=eW2[i, c].tolist(), b=eb2[i, c].tolist())]
                    for c in range(self.model.k)
                ]  # fmt: skip
            out.append(WeightspaceResponse(values=vals.tolist(), k=self.model.k,
                                           grid_shape=[len(x)], edited=edited))  # fmt: skip
        return out

    def __call__(self, request: WeightspaceRequest) -> WeightspaceResponse:
        return self.batch([request])[0]
