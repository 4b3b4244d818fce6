"""FRONT predictor: a trained descendant (or ancestry) ViT classifies digit images.

FRONT's product is an initialisation; what is served is the classifier trained from it.
``nshot serve front --conformal caos`` adds prediction sets: a request then also carries
labelled ``support_images`` (the calibration set; CAOS uses each as a one-shot predictor on the
ViT's frozen [CLS] features and calibrates by leave-one-out, :mod:`nshot.serve.conformal`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .model import load_model

MAX_IMAGES = 1024


class FrontRequest(StrictRequest):
    images: list[list[float]] = Field(
        ..., max_length=MAX_IMAGES,
        description="flattened square grey images (64 values for 8×8, 256 for 16×16)",
    )  # fmt: skip
    scale: Literal["unit", "sklearn"] = Field(
        "unit", description="pixel scale: unit = [0, 1]; sklearn = scikit-learn digits' 0–16"
    )
    support_images: list[list[float]] | None = Field(
        None, max_length=MAX_IMAGES,
        description="labelled images for prediction sets (--conformal caos), same size and "
        "scale as images; unused by the classifier itself",
    )  # fmt: skip
    support_labels: list[int] | None = Field(
        None, max_length=MAX_IMAGES, description="the class of each support image"
    )

    @model_validator(mode="after")
    def _check(self) -> FrontRequest:
        if not self.images:
            raise ValueError("images: at least one image is needed")
        top = 1.0 if self.scale == "unit" else 16.0
        n = len(self.images[0])
        rows = [("images", self.images), ("support_images", self.support_images or [])]
        for name, images in rows:
            for i, im in enumerate(images):
                if len(im) != n:
                    raise ValueError(f"{name}[{i}]: {len(im)} values, images[0] has {n}")
                for v in im:
                    if not math.isfinite(v):
                        raise ValueError(f"{name}[{i}]: contains NaN or inf")
                    if not 0.0 <= v <= top:
                        raise ValueError(
                            f"{name}[{i}]: value {v} is outside the {self.scale} scale [0, {top:g}]"
                        )
        images, labels = self.support_images, self.support_labels
        if (images is None) != (labels is None):
            raise ValueError("support_labels: give support_images and support_labels together")
        if images is not None and labels is not None and len(images) != len(labels):
            raise ValueError(
                f"support_labels: {len(labels)} labels for {len(images)} support images"
            )
        return self


class FrontResponse(BaseModel):
    labels: list[int]
    probs: list[list[float]]
    model: dict[str, Any]


class FrontPredictor(Predictor[FrontRequest, FrontResponse]):
    Request = FrontRequest
    Response = FrontResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model = load_model(checkpoint)
        ex = checkpoint.extra
        self.info = {
            "depth": self.model.depth,
            "width": self.model.width,
            "init": ex.get("init", "ancestry" if ex.get("stage") == "ancestry" else None),
        }
        self.meta = {
            "stage": ex.get("stage"),
            "task": ex.get("task", "digits"),
            "ancestry_id": ex.get("ancestry_id"),
            "keep_ratio": ex.get("keep_ratio"),
            "fill": ex.get("fill"),
            "depth_fix": ex.get("depth_fix"),
            "descendant_shape": ex.get("shape"),
            "image_values": self.model.img_size**2,
            "classes": self.model.num_classes,
            "max_images": MAX_IMAGES,
        }

    def metadata(self) -> dict[str, Any]:
        return self.meta

    def example_request(self) -> dict[str, Any]:
        """Two images of this model's size on the unit scale: a blank one and a diagonal
        stroke."""
        side = self.model.img_size
        stroke = [1.0 if r == c else 0.0 for r in range(side) for c in range(side)]
        return {"images": [[0.0] * (side * side), stroke], "scale": "unit"}

    def _pixels(self, images: list[list[float]], scale: str) -> torch.Tensor:
        """``images`` as the model's input batch (unit scale), or a ``ValueError`` naming
        ``images`` when their size is not the model's."""
        side = self.model.img_size
        if len(images[0]) != side * side:
            raise ValueError(
                f"images: this model takes {side}×{side} images ({side * side} values), "
                f"got {len(images[0])} values"
            )
        x = torch.tensor(images, dtype=torch.float32).view(-1, 1, side, side)
        return x / 16.0 if scale == "sklearn" else x

    def _logits(self, images: list[list[float]], scale: str) -> torch.Tensor:
        with torch.no_grad():
            return self.model(self._pixels(images, scale))

    def _response(self, probs: torch.Tensor) -> FrontResponse:
        return FrontResponse(
            labels=probs.argmax(-1).tolist(),
            probs=[[round(float(p), 6) for p in row] for row in probs],
            model=self.info,
        )

    def __call__(self, request: FrontRequest) -> FrontResponse:
        return self._response(self._logits(request.images, request.scale).softmax(-1))

    def one_shot_embeddings(self, request: FrontRequest, kind: str | None = None):
        """The ViT's frozen [CLS] features of each support and query image on its own, for
        CAOS prediction sets over the request's labelled ``support_images``."""
        from nshot.serve.conformal import OneShotEpisode

        if request.support_images is None or request.support_labels is None:
            raise ValueError(
                "support_images: prediction sets need labelled support images "
                "(support_images and support_labels) in the request"
            )
        classes = self.model.num_classes
        for i, label in enumerate(request.support_labels):
            if not 0 <= label < classes:
                raise ValueError(f"support_labels[{i}]: {label} is not a class in [0, {classes})")
        x = self._pixels([*request.images, *request.support_images], request.scale)
        with torch.no_grad():
            emb = self.model.features(x).double().numpy()
        q = len(request.images)
        return OneShotEpisode(
            support_emb=emb[q:],
            support_labels=np.array(request.support_labels),
            query_emb=emb[:q],
            classes=list(range(classes)),
            support_field="support_images",
        )

    def batch(self, requests: list[FrontRequest]) -> list[FrontResponse]:
        """One forward pass for all requests when every image has this model's size."""
        side2 = self.model.img_size**2
        if any(len(r.images[0]) != side2 for r in requests):
            return [self(r) for r in requests]  # each bad request gets its own error
        x = [
            [v / 16.0 for v in im] if r.scale == "sklearn" else im
            for r in requests
            for im in r.images
        ]
        probs = self._logits(x, "unit").softmax(-1)
        return [self._response(p) for p in probs.split([len(r.images) for r in requests])]
