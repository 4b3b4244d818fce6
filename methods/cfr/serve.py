"""CFR predictor: an RGB image and its organised point cloud → an image anomaly score and a
per-pixel anomaly map, for the object class of the checkpoint.

The support set of normal samples (the memory banks built from the k shots) is part of the
**checkpoint**, not of the request: a checkpoint saved before its banks were built (during
stage 1) is refused with a 422 naming ``class_name``. A run's checkpoint holds one (class, k);
a bundle (``python -m nshot.methods.cfr.bundle``) holds several, so that one deployment serves
them all: the request's ``class_name`` picks the class and ``shot`` the k (default: the
class's largest), and the answer says which model it came from. A class or k that the
checkpoint does not hold is a 422 naming the field.
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
from nshot.serve.schema import StrictRequest, check_finite
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.trainer import local_device

from .data import load_class
from .features import make_extractors
from .model import Loaded, load_models

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
            check_finite(f"xyz[{i}][{j}]", p)  # coordinates beyond ±1e6 overflow float32 maps
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
    shot: int | None = Field(
        None, ge=1, le=64,
        description="k of the model that answers (a bundle may hold several per class); "
        "default: the class's largest",
    )  # fmt: skip
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
    shot: int = Field(..., description="k of the model that answered")
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
        self.models = load_models(checkpoint)
        self.bundle = "bundle" in checkpoint.extra
        self.by_key = {(m.class_name, m.shot): m for m in self.models}
        # a bundle's models share the extractors and the grid (BUNDLE_SHARED)
        self.cfg = self.models[0].cfg
        self.extractors = make_extractors(self.cfg, local_device())

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> CfrPredictor:
        return cls(checkpoint)

    @staticmethod
    def _describe(m: Loaded) -> dict[str, Any]:
        return {"class_name": m.class_name, "shot": m.shot, "system": m.cfg.system,
                "grid": m.cfg.grid, "theta_mode": m.cfg.theta_mode,
                "theta": float(m.model.theta_q) if m.cfg.theta_mode == "quantile"
                else m.cfg.theta, "threshold_hint": float(m.model.threshold_hint),
                "memory_bank": "in the checkpoint", "banks_built": m.banks_built,
                "bank_sizes": m.model.bank_sizes()}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        if not self.bundle:
            return self._describe(self.models[0])
        return {"bundle": [self._describe(m) for m in self.models], "grid": self.cfg.grid,
                "classes": sorted({m.class_name for m in self.models})}  # fmt: skip

    def example_request(self) -> dict[str, Any]:
        """The first anomalous test image of the class of the checkpoint's (first) model
        (generated data, or the checkpoint's ``data_path``)."""
        m = self.models[0]
        cfg = m.cfg.replace(classes=[m.class_name], class_name=m.class_name)
        test = load_class(cfg, m.class_name)["test"]
        i = int(np.argmax(test.label))
        return {"class_name": m.class_name, "rgb": test.rgb[i].tolist(),
                "xyz": test.xyz[i].astype(float).tolist(), "return_map": True}  # fmt: skip

    def model_for(self, request: CfrRequest) -> Loaded:
        """The model of the request's class and k (the class's largest k without ``shot``)."""
        name = request.class_name
        shots = sorted(k for c, k in self.by_key if c == name)
        if not shots:
            served = sorted({m.class_name for m in self.models})
            one = repr(served[0]) if len(served) == 1 else f"one of {served}"
            raise ValueError(f"class_name: unknown class {name!r}; this model serves {one}")
        if request.shot is not None and request.shot not in shots:
            raise ValueError(
                f"shot: no model of class {name!r} at k = {request.shot}; this checkpoint "
                f"holds k = {', '.join(map(str, shots))}"
            )
        m = self.by_key[(name, shots[-1] if request.shot is None else request.shot)]
        if not m.banks_built:
            raise ValueError(
                f"class_name: the checkpoint of {name!r} holds no memory bank yet "
                f"(saved at step {m.step}, during stage 1)"
            )
        return m

    def __call__(self, request: CfrRequest) -> CfrResponse:
        m = self.model_for(request)
        rgb, xyz = request.arrays()
        g = self.cfg.grid
        if rgb.shape[:2] != (g, g):
            raise ValueError(f"rgb: {rgb.shape[0]}×{rgb.shape[1]}, this model takes {g}×{g}")
        f2, f3 = self.extractors(rgb[None], xyz[None])
        valid = self.extractors.valid(xyz[None], f3)[0]
        theta = None if m.cfg.theta_mode == "quantile" else m.cfg.theta
        gen = torch.Generator().manual_seed(m.cfg.infer_seed)
        sc = m.model.score(f2[0], f3[0], valid, m.cfg.system, theta, gen)
        amap = None
        if request.return_map:
            amap = [[round(float(v), 6) for v in row] for row in sc.aupro_map]
        return CfrResponse(
            class_name=m.class_name,
            shot=m.shot,
            image_score=round(sc.image_score, 6),
            anomaly_map=amap,
            valid_fraction=round(sc.valid / valid.numel(), 6),
            replaced_fraction=round(sc.replaced / max(sc.valid, 1), 6),
            threshold_hint=round(float(m.model.threshold_hint), 6),
        )
