"""CAOS predictor: landmark prediction sets for images.

The bank (reference vectors and sorted leave-one-out scores) comes from the checkpoint unless
the request brings its own labelled ``support``; any ``alpha`` is served from the sorted scores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, StrictInt, model_validator

from nshot.conformal import CAOSBank, agg_k
from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .data import DigitsLandmarkPool, patch_features
from .model import load_model

MAX_IMAGES = 256
Image = list[list[float]]


def _finite(name: str, rows: list) -> None:
    for i, row in enumerate(rows):
        flat = row if not row or not isinstance(row[0], list) else [v for r in row for v in r]
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in flat):
            raise ValueError(f"{name}[{i}]: contains NaN or inf")


class SupportItem(StrictRequest):
    image: Image
    # a JSON array of two integers (strict integers, lax only about list versus tuple)
    landmark: tuple[StrictInt, StrictInt] = Field(
        ..., strict=False, description="(row, col) of the landmark"
    )


class CAOSRequest(StrictRequest):
    images: list[Image] | None = Field(
        None, max_length=MAX_IMAGES, description="query images, each canvas × canvas"
    )
    features: list[list[list[float]]] | None = Field(
        None, max_length=MAX_IMAGES, description="per-candidate features L × D (feature banks)"
    )
    alpha: float = Field(0.1, description="miscoverage level in (0, 1)")
    support: list[SupportItem] | None = Field(
        None, description="labelled images that replace the checkpoint's bank for this request"
    )
    return_scores: bool = False

    @model_validator(mode="after")
    def _check(self) -> CAOSRequest:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha: must lie in (0, 1), got {self.alpha}")
        if (self.images is None) == (self.features is None):
            raise ValueError("images: give exactly one of images or features")
        rows = self.images if self.images is not None else self.features
        name = "images" if self.images is not None else "features"
        if not rows:
            raise ValueError(f"{name}: at least one query is needed")
        shape = (len(rows[0]), len(rows[0][0]) if rows[0] else 0)
        for i, im in enumerate(rows):
            if not im or any(len(r) != shape[1] for r in im) or len(im) != shape[0]:
                raise ValueError(f"{name}[{i}]: every query must have shape {shape[0]}×{shape[1]}")
        _finite(name, rows)
        if self.support is not None:
            if self.images is None:
                raise ValueError("support: a support set is accepted with images only")
            for i, s in enumerate(self.support):
                if len(s.image) != shape[0] or any(len(r) != shape[1] for r in s.image):
                    raise ValueError(
                        f"support[{i}].image: shape differs from the queries' {shape[0]}×{shape[1]}"
                    )
                r, c = s.landmark
                if not (0 <= r < shape[0] and 0 <= c < shape[1]):
                    raise ValueError(f"support[{i}].landmark: ({r}, {c}) is outside the image")
            _finite("support", [s.image for s in self.support])
        return self


class CAOSImageResult(BaseModel):
    set: list[tuple[int, int]]
    set_size: int
    point: tuple[int, int]
    q_hat: float | None
    trivial: bool
    scores: list[float] | None = None


class CAOSResponse(BaseModel):
    results: list[CAOSImageResult]
    alpha: float
    k: int
    n_calibration: int


class CAOSPredictor(Predictor[CAOSRequest, CAOSResponse]):
    Request = CAOSRequest
    Response = CAOSResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        model = load_model(checkpoint)
        self.ref, self.bank, self.grid = model.ref, model.bank, model.grid
        self.patch, self.backbone = model.patch, model.backbone

    def metadata(self) -> dict[str, Any]:
        return {
            "k": self.bank.k,
            "n_calibration": self.bank.n,
            "grid": list(self.grid),
            "backbone": self.backbone,
            "max_images": MAX_IMAGES,
        }

    def example_request(self) -> dict[str, Any]:
        """Two query images at alpha = 0.1: digits placed on this bank's canvas by the
        substitute's generator (or, for a feature bank, two unit-norm random feature maps of
        its shape)."""
        rng = np.random.default_rng([0, 4])  # a stream of its own, disjoint from the trials'
        if self.backbone == "features":
            F = rng.normal(size=(2, self.grid[0], self.ref.shape[1]))
            F /= np.linalg.norm(F, axis=-1, keepdims=True)
            return {"features": np.round(F, 4).tolist(), "alpha": 0.1}
        images, _ = DigitsLandmarkPool(self.grid[0], self.patch).images(rng, 2)
        return {"images": np.round(images, 3).tolist(), "alpha": 0.1}

    def _features(self, images: list[Image]) -> np.ndarray:
        arr = np.asarray(images, dtype=np.float64)
        if self.backbone == "features":
            raise ValueError("images: this checkpoint was built from features; send `features`")
        if arr.shape[1:] != self.grid:
            raise ValueError(
                f"images: expected {self.grid[0]}×{self.grid[1]} images, got "
                f"{arr.shape[1]}×{arr.shape[2]}"
            )
        return patch_features(arr, self.patch)

    def __call__(self, request: CAOSRequest) -> CAOSResponse:
        if request.images is not None:
            F = self._features(request.images)
        else:
            F = np.asarray(request.features, dtype=np.float64)
            if (
                self.backbone != "features"
                or F.shape[1] != self.grid[0]
                or F.shape[2] != self.ref.shape[1]
            ):
                raise ValueError(
                    f"features: this checkpoint expects "
                    f"{'images' if self.backbone != 'features' else f'{self.grid[0]}×{self.ref.shape[1]} features'}"
                )
            F = F / (np.linalg.norm(F, axis=-1, keepdims=True) + 1e-8)
        ref, bank = self.ref, self.bank
        if request.support is not None:
            k = self.bank.k
            if len(request.support) < k + 1:
                raise ValueError(
                    f"support: needs at least k + 1 = {k + 1} labelled images (k = {k}), "
                    f"got {len(request.support)}"
                )
            Fs = self._features([s.image for s in request.support])
            w = self.grid[1]
            y = np.array([r * w + c for r, c in (s.landmark for s in request.support)])
            ref = Fs[np.arange(len(y)), y]
            bank = CAOSBank.fit(1.0 - ref @ ref.T, k)
        T = agg_k(1.0 - F @ ref.T, bank.k)  # (q, L)
        q = bank.q_hat(request.alpha)
        w = self.grid[1] if len(self.grid) == 2 else 1
        results = []
        for t in T:
            members = np.flatnonzero(t <= q)
            best = int(np.argmin(t))
            results.append(
                CAOSImageResult(
                    set=[(int(i // w), int(i % w)) for i in members],
                    set_size=int(len(members)),
                    point=(best // w, best % w),
                    q_hat=q if math.isfinite(q) else None,
                    trivial=not math.isfinite(q),
                    scores=t.tolist() if request.return_scores else None,
                )
            )
        return CAOSResponse(results=results, alpha=request.alpha, k=bank.k, n_calibration=bank.n)
