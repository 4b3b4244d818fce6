"""ATHA predictor: one request is one few-shot episode.

The predictor builds a fresh episode model from the pre-trained CLIP of the checkpoint, adapts
it on the request's support set (CoOp + LoRA, with ATHA's token update when ``use_atha``), and
classifies the queries. The cost is bounded: at most ``max_epochs`` steps over at most
``20 × 10`` support images, and 500 queries. Answers are deterministic (a fixed seed).

Images are base64 PNG strings or ``H × W × 3`` arrays of integers in [0, 255], any size up to
1024 × 1024, given the backbone's preprocessing
(:meth:`nshot.nn.backbone.CLIPBackbone.preprocess`). The tiny CLIP's checkpoints hold its
weights; images are resized (bilinear) to its 32 × 32. A ``paper`` checkpoint
(``backbone='clip'``) holds no weights: it records the real CLIP (``clip_path``, tokenizer and
architecture in its config, a parameter fingerprint in ``extra.clip``), which the predictor
reads from that path (:func:`.model.load_model`; the error names ``clip_path`` when this
machine lacks it); images get CLIP's preprocessing (the shorter side resized bicubic to its
resolution, the centre crop).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.images import check_rgb_array, decode_base64_image
from nshot.serve.schema import StrictRequest

from .model import load_model
from .train import adapt

MAX_CLASSES = 20
MAX_SHOTS = 10
MAX_QUERIES = 500
MAX_SIDE = 1024
SEED = 0

Image = str | list[list[list[int]]]


def decode_image(image: Image, where: str) -> np.ndarray:
    """``uint8 [H, W, 3]`` of a base64 PNG (RGB) or a nested array of 0–255 (``ValueError``
    naming ``where``)."""
    if isinstance(image, str):
        return decode_base64_image(image, where, formats=("PNG",), rgb_only=True, max_side=MAX_SIDE)
    return check_rgb_array(image, where, scale=255, max_side=MAX_SIDE)


class SupportImage(StrictRequest):
    image: Image = Field(..., description="base64 PNG (RGB) or an H × W × 3 array of 0–255")
    label: str = Field(..., description="one of class_names")


class AthaRequest(StrictRequest):
    class_names: list[str] = Field(..., description="2 to 20 unique class names")
    support: list[SupportImage] = Field(..., description="labelled images, 1 to 10 per class")
    queries: list[Image] = Field(..., description="1 to 500 images to classify")
    epochs: int | None = Field(
        None, description="adaptation steps (1 to the model's max_epochs; default: its epochs)"
    )
    use_atha: bool = Field(True, description="ATHA's token update (false: CoOp + LoRA)")

    @model_validator(mode="after")
    def _check(self) -> AthaRequest:
        names = self.class_names
        if not 2 <= len(names) <= MAX_CLASSES:
            raise ValueError(f"class_names: {len(names)} classes; need 2 to {MAX_CLASSES}")
        for i, n in enumerate(names):
            if not n.strip():
                raise ValueError(f"class_names[{i}]: empty")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"class_names: {dup!r} is listed twice")
        if not self.support:
            raise ValueError("support: empty; give at least one image per class")
        counts = dict.fromkeys(names, 0)
        for i, s in enumerate(self.support):
            if s.label not in counts:
                raise ValueError(f"support[{i}].label: {s.label[:80]!r} is not in class_names")
            counts[s.label] += 1
            decode_image(s.image, f"support[{i}].image")
        for n, c in counts.items():
            if c == 0:
                raise ValueError(f"support: class {n[:80]!r} has no image")
            if c > MAX_SHOTS:
                raise ValueError(f"support: class {n[:80]!r} has {c} images; at most {MAX_SHOTS}")
        if not 1 <= len(self.queries) <= MAX_QUERIES:
            raise ValueError(f"queries: {len(self.queries)} images; need 1 to {MAX_QUERIES}")
        for i, q in enumerate(self.queries):
            decode_image(q, f"queries[{i}]")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs: {self.epochs} is below 1")
        return self


class Rates(BaseModel):
    head: list[float]
    tail: list[float]


class AthaResponse(BaseModel):
    labels: list[str]
    probs: list[list[float]]
    epochs_run: int
    rates: Rates
    unknown_words: int


class AthaPredictor(Predictor[AthaRequest, AthaResponse]):
    Request = AthaRequest
    Response = AthaResponse

    def __init__(self, checkpoint: Any) -> None:
        from nshot.train.trainer import local_device

        self.backbone, self.cfg = load_model(checkpoint)
        self.backbone.to(local_device())
        self.side = self.backbone.image_size

    @classmethod
    def from_checkpoint(cls, checkpoint: Any) -> AthaPredictor:
        return cls(checkpoint)

    def metadata(self) -> dict[str, Any]:
        return {
            "text": "clip" if self.cfg.backbone == "clip" else self.cfg.text,
            "image_side": self.side,
            "epochs": self.cfg.epochs,
            "max_epochs": self.cfg.max_epochs,
            "max_classes": MAX_CLASSES,
            "max_shots": MAX_SHOTS,
            "max_queries": MAX_QUERIES,
        }

    def example_request(self) -> dict[str, Any]:
        """Two shapes, one base64 PNG each as support; a PNG and a small array as queries."""
        from PIL import Image as PILImage

        from nshot.data.shapes import render_shapes

        d = render_shapes(12, seed=7, side=32)
        pick = {}
        for i, s in enumerate(d["shape"].tolist()):
            pick.setdefault(s, []).append(i)
        a, b = sorted(pick)[:2]

        def png(i: int) -> str:
            buf = io.BytesIO()
            PILImage.fromarray(d["image"][i]).save(buf, format="PNG")
            return base64.b64encode(buf.getvalue()).decode()

        from nshot.data.shapes import SHAPES

        small = d["image"][pick[b][-1]][::4, ::4].tolist()  # an 8 × 8 × 3 array
        return {
            "class_names": [SHAPES[a], SHAPES[b]],
            "support": [
                {"image": png(pick[a][0]), "label": SHAPES[a]},
                {"image": png(pick[b][0]), "label": SHAPES[b]},
            ],
            "queries": [png(pick[a][-1]), small],
            "epochs": min(2, self.cfg.max_epochs),
        }

    def images(self, images: list[np.ndarray]) -> torch.Tensor:
        """Pixels in [0, 1] ``[n, 3, side, side]``: the backbone's preprocessing (the tiny
        CLIP's bilinear resize, or the real CLIP's)."""
        return torch.from_numpy(np.stack([self.backbone.preprocess(im) for im in images]))

    def _resized(self, images: list[Image], field: str) -> torch.Tensor:
        """Each image decoded and brought to the model's side before the next is decoded: a
        request of hundreds of large images never holds them all at full size."""
        return torch.cat([self.images([decode_image(im, field)]) for im in images])

    def _tensors(self, request: AthaRequest):
        index = {n: i for i, n in enumerate(request.class_names)}
        sx = self._resized([s.image for s in request.support], "support")
        sy = torch.tensor([index[s.label] for s in request.support])
        qx = self._resized(list(request.queries), "queries")
        return sx, sy, qx

    def __call__(self, request: AthaRequest) -> AthaResponse:
        epochs = self.cfg.epochs if request.epochs is None else request.epochs
        if epochs > self.cfg.max_epochs:
            raise ValueError(
                f"epochs: {epochs} exceeds this model's max_epochs {self.cfg.max_epochs}"
            )
        sx, sy, qx = self._tensors(request)
        shots = int(torch.bincount(sy, minlength=len(request.class_names)).min())
        res = adapt(
            self.backbone,
            request.class_names,
            sx,
            sy,
            qx,
            self.cfg,
            "atha" if request.use_atha else "coop_lora",
            shots=shots,
            seed=SEED,
            epochs=epochs,
        )
        probs = res.probs
        return AthaResponse(
            labels=[request.class_names[i] for i in probs.argmax(-1).tolist()],
            probs=[[round(float(p), 6) for p in row] for row in probs],
            epochs_run=res.epochs_run,
            rates=Rates(**res.rates),
            unknown_words=self.backbone.unknown_words(request.class_names),
        )

    @torch.no_grad()
    def one_shot_embeddings(self, request: AthaRequest, kind: str | None = None):
        """Frozen per-image features for conformal prediction sets: the pre-trained CLIP's
        unit image features of each support and query image on its own. The adapted model
        depends on the support labels, so its features would break exchangeability; the
        frozen encoder's do not."""
        from nshot.serve.conformal import OneShotEpisode

        sx, sy, qx = self._tensors(request)
        emb = self.backbone.encode_image(torch.cat([sx, qx]), normalize=True).cpu().numpy()
        n = len(sx)
        return OneShotEpisode(
            support_emb=emb[:n],
            support_labels=sy.numpy(),
            query_emb=emb[n:],
            classes=list(request.class_names),
        )
