"""CFR predictor: an RGB image and its organised point cloud → an image anomaly score and a
per-pixel anomaly map, for the object class of the checkpoint.

The support set of normal samples (the memory banks built from the k shots) is part of the
**checkpoint**, not of the request: a checkpoint saved before its banks were built (during
stage 1) is refused with a 422 naming ``class_name``. One checkpoint holds one (class, k), and
a predictor serves the class of its checkpoint (a request for another class is a 422).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, PrivateAttr, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .data import load_class
from .features import make_extractors
from .model import load_model

MAX_SIDE = 256
MAX_PNG_BYTES = 1 << 20


def _decode_png(text: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if len(text) > 2 * MAX_PNG_BYTES:
        raise ValueError(f"rgb: the base64 text is longer than {2 * MAX_PNG_BYTES} characters")
    try:
        raw = base64.b64decode(text, validate=True)
        img = Image.open(io.BytesIO(raw))
        if img.format != "PNG":
            raise ValueError(f"rgb: a {img.format} image, not a PNG")
        if max(img.size) > MAX_SIDE:
            raise ValueError(f"rgb: {img.size[0]}×{img.size[1]} is larger than {MAX_SIDE}")
        if img.mode != "RGB":
            raise ValueError(f"rgb: a PNG of mode {img.mode}, not 3-channel RGB")
        return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (binascii.Error, UnidentifiedImageError, OSError) as err:
        raise ValueError(f"rgb: not a base64-encoded PNG ({type(err).__name__})") from None


def _rgb_array(rows: list) -> np.ndarray:
    if not rows or not rows[0]:
        raise ValueError("rgb: an empty image")
    h, w = len(rows), len(rows[0])
    if max(h, w) > MAX_SIDE:
        raise ValueError(f"rgb: {h}×{w} is larger than {MAX_SIDE}×{MAX_SIDE}")
    for i, row in enumerate(rows):
        if len(row) != w:
            raise ValueError(f"rgb[{i}]: {len(row)} pixels, rgb[0] has {w}")
        for j, px in enumerate(row):
            if len(px) != 3:
                raise ValueError(f"rgb[{i}][{j}]: {len(px)} channels, need 3 (R, G, B)")
            for v in px:
                if not 0 <= v <= 255:
                    raise ValueError(f"rgb[{i}][{j}]: value {v} is outside 0–255 (uint8)")
    return np.asarray(rows, dtype=np.uint8)


def _xyz_array(rows: list, shape: tuple[int, int]) -> np.ndarray:
    h, w = shape
    if len(rows) != h:
        raise ValueError(f"xyz: {len(rows)} rows, rgb has {h} (H × W must match)")
    for i, row in enumerate(rows):
        if len(row) != w:
            raise ValueError(f"xyz[{i}]: {len(row)} pixels, rgb has {w} (H × W must match)")
        for j, p in enumerate(row):
            if len(p) != 3:
                raise ValueError(f"xyz[{i}][{j}]: {len(p)} coordinates, need 3 (x, y, z)")
            if not all(math.isfinite(v) for v in p):
                raise ValueError(f"xyz[{i}][{j}]: NaN or inf (use 0, 0, 0 for no point)")
    xyz = np.asarray(rows, dtype=np.float32)
    if not xyz.any():
        raise ValueError("xyz: no valid point (every point is 0, 0, 0)")
    return xyz


class CfrRequest(StrictRequest):
    class_name: str = Field(..., max_length=64, description="the object class of the model")
    rgb: str | list[list[list[int]]] = Field(
        ..., description="a base64 PNG (RGB) or an H × W × 3 array of uint8 values"
    )
    xyz: list[list[list[float]]] = Field(
        ..., description="H × W × 3 organised point cloud; (0, 0, 0) marks a pixel with no point"
    )
    return_map: bool = Field(True, description="include the per-pixel anomaly map")
    _arrays: tuple[np.ndarray, np.ndarray] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self) -> CfrRequest:
        rgb = _decode_png(self.rgb) if isinstance(self.rgb, str) else _rgb_array(self.rgb)
        xyz = _xyz_array(self.xyz, rgb.shape[:2])
        self._arrays = (rgb, xyz)
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        assert self._arrays is not None  # set by the validator
        return self._arrays


class CfrResponse(BaseModel):
    class_name: str
    image_score: float
    anomaly_map: list[list[float]] | None = Field(
        None, description="per pixel, normalised by the mean of the nonzero scores (AUPRO's map)"
    )
    valid_fraction: float
    replaced_fraction: float = Field(..., description="valid pixels whose P2 was replaced")
    threshold_hint: float = Field(
        ..., description="95th percentile of the image scores of the k normal training images"
    )


class CfrPredictor(Predictor[CfrRequest, CfrResponse]):
    Request = CfrRequest
    Response = CfrResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model, self.cfg, self.run = load_model(checkpoint)
        self.extractors = make_extractors(self.cfg)
        self.class_name = str(self.run.get("class_name", self.cfg.class_name))
        self.banks_built = bool(self.run.get("banks_built", False))
        self.step = checkpoint.step

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> CfrPredictor:
        return cls(checkpoint)

    def metadata(self) -> dict[str, Any]:
        return {"class_name": self.class_name, "shot": self.cfg.shot, "system": self.cfg.system,
                "grid": self.cfg.grid, "theta_mode": self.cfg.theta_mode,
                "theta": float(self.model.theta_q) if self.cfg.theta_mode == "quantile"
                else self.cfg.theta, "threshold_hint": float(self.model.threshold_hint),
                "memory_bank": "in the checkpoint", "banks_built": self.banks_built,
                "bank_sizes": self.model.bank_sizes()}  # fmt: skip

    def example_request(self) -> dict[str, Any]:
        """The first anomalous test image of the checkpoint's class (generated data, or the
        checkpoint's ``data_path``)."""
        cfg = self.cfg.replace(classes=[self.class_name], class_name=self.class_name)
        test = load_class(cfg, self.class_name)["test"]
        i = int(np.argmax(test.label))
        return {"class_name": self.class_name, "rgb": test.rgb[i].tolist(),
                "xyz": test.xyz[i].astype(float).tolist(), "return_map": True}  # fmt: skip

    def __call__(self, request: CfrRequest) -> CfrResponse:
        if request.class_name != self.class_name:
            raise ValueError(
                f"class_name: unknown class {request.class_name!r}; this model serves "
                f"{self.class_name!r}"
            )
        if not self.banks_built:
            raise ValueError(
                f"class_name: the checkpoint of {self.class_name!r} holds no memory bank yet "
                f"(saved at step {self.step}, during stage 1)"
            )
        rgb, xyz = request.arrays()
        g = self.cfg.grid
        if rgb.shape[:2] != (g, g):
            raise ValueError(f"rgb: {rgb.shape[0]}×{rgb.shape[1]}, this model takes {g}×{g}")
        f2, f3 = self.extractors(rgb[None], xyz[None])
        valid = self.extractors.valid(xyz[None], f3)[0]
        theta = None if self.cfg.theta_mode == "quantile" else self.cfg.theta
        gen = torch.Generator().manual_seed(self.cfg.infer_seed)
        sc = self.model.score(f2[0], f3[0], valid, self.cfg.system, theta, gen)
        amap = None
        if request.return_map:
            amap = [[round(float(v), 6) for v in row] for row in sc.aupro_map]
        return CfrResponse(
            class_name=self.class_name,
            image_score=round(sc.image_score, 6),
            anomaly_map=amap,
            valid_fraction=round(sc.valid / valid.numel(), 6),
            replaced_fraction=round(sc.replaced / max(sc.valid, 1), 6),
            threshold_hint=round(float(self.model.threshold_hint), 6),
        )
