"""dirclip's predictor: zero-shot classification of images under a label set chosen per
request, with UCAT's Dirichlet uncertainty per answer.

A request gives images (64 floats in [0, 1] each, an 8 × 8 grey digit row by row, or base64
PNGs of 8 × 8 grey images), class names, a prompt template with ``{}`` and
``return_uncertainty``. The toy's text tower knows the ten digit names only, so class names
come from them (2 to 10 of them; the error lists them). All images of a request (and of a
batch of requests) go through the image tower in one forward pass.

For ``nshot serve dirclip --conformal caos`` a request may add a labelled support set
(``support_images`` with ``support_labels``, names among ``class_names``): the conformal
wrapper calibrates on it, with g's unit image features as the frozen embedding.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.images import decode_base64_image
from nshot.serve.schema import StrictRequest
from nshot.train.checkpoint import LoadedCheckpoint

from .config import TEMPLATE
from .data import DIGIT_NAMES
from .dirichlet import uncertainty
from .model import DirClip, load_model

MAX_IMAGES = 1024
MAX_CLASSES = 1000
SIDE = 8


def _check_pixels(rows: list[list[float]], field: str) -> None:
    for i, im in enumerate(rows):
        if len(im) != SIDE * SIDE:
            raise ValueError(
                f"{field}[{i}]: {len(im)} values; an image is {SIDE * SIDE} floats "
                f"({SIDE}×{SIDE} grey, row by row)"
            )
        for v in im:
            if not math.isfinite(v):
                raise ValueError(f"{field}[{i}]: contains NaN or inf")
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{field}[{i}]: value {v} is outside [0, 1]")


def decode_png(data: str, field: str) -> list[float]:
    """A base64 PNG (or JPEG) of an 8 × 8 image → 64 grey values in [0, 1].

    The side is checked from the header before any pixel is decoded (a small file may claim
    a huge image), through the platform's decoder.
    """
    from PIL import Image

    rgb = decode_base64_image(data, field, formats=("PNG", "JPEG"), max_side=SIDE)
    if rgb.shape[:2] != (SIDE, SIDE):
        raise ValueError(f"{field}: image is {rgb.shape[1]}×{rgb.shape[0]}, not {SIDE}×{SIDE}")
    grey = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.float64) / 255.0
    return grey.reshape(-1).tolist()


def encode_png(pixels: list[float]) -> str:
    """64 grey values in [0, 1] → a base64 PNG (for clients and tests)."""
    from PIL import Image

    arr = np.clip(np.round(np.asarray(pixels) * 255), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr.reshape(SIDE, SIDE), mode="L").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _round(v: float | torch.Tensor) -> float:
    """Six significant digits (the float64 tower's last bits may still depend on the batch)."""
    return float(f"{float(v):.6g}")


class DirclipRequest(StrictRequest):
    images: list[list[float]] | None = Field(
        None, max_length=MAX_IMAGES, description="8×8 grey images, 64 floats in [0, 1] each"
    )
    images_b64: list[str] | None = Field(
        None, max_length=MAX_IMAGES, description="8×8 images as base64 PNG (or JPEG)"
    )
    class_names: list[str] = Field(..., description="the label set (2 to 1,000 unique names)")
    template: str = Field(TEMPLATE, description="prompt with {} for the class name")
    return_uncertainty: bool = True
    support_images: list[list[float]] | None = Field(
        None, max_length=MAX_IMAGES, description="labelled images for --conformal caos"
    )
    support_labels: list[str] | None = Field(
        None, max_length=MAX_IMAGES, description="their class names (among class_names)"
    )

    @model_validator(mode="after")
    def _check(self) -> DirclipRequest:
        if (self.images is None) == (self.images_b64 is None):
            raise ValueError("images: give exactly one of images and images_b64")
        if self.images is not None:
            if not self.images:
                raise ValueError("images: at least one image is needed")
            _check_pixels(self.images, "images")
        else:
            if not self.images_b64:
                raise ValueError("images_b64: at least one image is needed")
            for i, s in enumerate(self.images_b64):
                decode_png(s, f"images_b64[{i}]")
        names = self.class_names
        if not 2 <= len(names) <= MAX_CLASSES:
            raise ValueError(f"class_names: give 2 to {MAX_CLASSES} names, got {len(names)}")
        for i, n in enumerate(names):
            if n not in DIGIT_NAMES:
                raise ValueError(
                    f"class_names[{i}]: {n[:80]!r} is not a name this model's text tower "
                    f"knows; known names: {', '.join(DIGIT_NAMES)}"
                )
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"class_names: names must be unique; repeated: {dup}")
        if "{}" not in self.template or self.template.count("{}") != 1:
            raise ValueError("template: must contain '{}' exactly once, for the class name")
        if (self.support_images is None) != (self.support_labels is None):
            raise ValueError("support_labels: give support_images and support_labels together")
        if self.support_images is not None:
            _check_pixels(self.support_images, "support_images")
            if len(self.support_labels) != len(self.support_images):
                raise ValueError(
                    f"support_labels: {len(self.support_labels)} labels for "
                    f"{len(self.support_images)} support images"
                )
            for i, lab in enumerate(self.support_labels):
                if lab not in names:
                    raise ValueError(f"support_labels[{i}]: {lab[:80]!r} is not in class_names")
        return self

    def pixels(self) -> list[list[float]]:
        if self.images is not None:
            return self.images
        return [decode_png(s, f"images_b64[{i}]") for i, s in enumerate(self.images_b64 or [])]


class Uncertainty(BaseModel):
    entropy: float = Field(..., description="softmax entropy (nats)")
    au: float = Field(..., description="aleatoric: expected entropy under the Dirichlet ÷ ln C")
    eu: float = Field(..., description="epistemic (paper): C / (α₀ + C)")
    eu_code: float = Field(..., description="epistemic (released code): C / logsumexp(α+1) / ln C")
    alpha0: float = Field(..., description="Dirichlet strength α₀ (evaluation α)")


class Prediction(BaseModel):
    label: str
    probs: dict[str, float]
    uncertainty: Uncertainty | None = None


class DirclipResponse(BaseModel):
    predictions: list[Prediction]


class DirclipPredictor(Predictor[DirclipRequest, DirclipResponse]):
    Request = DirclipRequest
    Response = DirclipResponse

    def __init__(self, model: DirClip, cfg, extra: dict[str, Any]) -> None:
        self.model = model.eval()
        # the image tower in float64: an image's answer does not depend on which images share
        # its forward pass (float32 matrix products differ in the last bits between batch sizes,
        # and the logits' scale of 100 amplifies them)
        model.clip.visual.double()
        model.clip.visual_proj.data = model.clip.visual_proj.data.double()
        self.cfg = cfg
        self.extra = extra
        self._text: dict[tuple[tuple[str, ...], str], torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> DirclipPredictor:
        model, cfg, extra = load_model(checkpoint)
        return cls(model, cfg, extra)

    def metadata(self) -> dict[str, Any]:
        return {
            "loss": self.extra.get("loss"),
            "lambda": self.extra.get("lambda"),
            "selected": self.extra.get("selected"),
            "class_names": list(DIGIT_NAMES),
            "image_values": SIDE * SIDE,
            "max_images": MAX_IMAGES,
            "template": TEMPLATE,
        }

    def example_request(self) -> dict[str, Any]:
        """Two test-like strokes: a vertical bar ("one"?) and a ring ("zero"?), 4 classes."""
        bar = [1.0 if c in (3, 4) and 1 <= r <= 6 else 0.0 for r in range(8) for c in range(8)]
        ring = [
            1.0 if (r in (1, 6) and 2 <= c <= 5) or (c in (2, 5) and 1 <= r <= 6) else 0.0
            for r in range(8)
            for c in range(8)
        ]
        return {"images": [bar, ring], "class_names": ["zero", "one", "seven", "eight"]}

    def _text_features(self, names: list[str], template: str) -> torch.Tensor:
        key = (tuple(names), template)
        if key not in self._text:
            if len(self._text) > 256:
                self._text.clear()
            self._text[key] = self.model.text_features_of(names, template)
        return self._text[key]

    @torch.no_grad()
    def _features(self, pixels: list[list[float]]) -> torch.Tensor:
        x = torch.tensor(pixels, dtype=torch.float64).view(-1, 1, SIDE, SIDE)
        return torch.nn.functional.normalize(self.model.features(x), dim=-1)

    def _answer(self, request: DirclipRequest, feats: torch.Tensor) -> DirclipResponse:
        names = request.class_names
        logits = self.model.scale * feats @ self._text_features(names, request.template).double().T
        return response_from_logits(names, logits, request.return_uncertainty)

    def __call__(self, request: DirclipRequest) -> DirclipResponse:
        return self.batch([request])[0]

    def batch(self, requests: list[DirclipRequest]) -> list[DirclipResponse]:
        """Every image of every request through the image tower in one forward pass."""
        pixels = [r.pixels() for r in requests]
        feats = self._features([im for p in pixels for im in p])
        parts = feats.split([len(p) for p in pixels])
        return [self._answer(r, f) for r, f in zip(requests, parts, strict=True)]

    @torch.no_grad()
    def one_shot_embeddings(self, request: DirclipRequest, kind: str | None = None):
        """Frozen per-image features for conformal prediction sets: g's unit image features
        of the labelled support images and of the query images (one image each, no label)."""
        from nshot.serve.conformal import OneShotEpisode

        if not request.support_images:
            raise ValueError("support_images: conformal sets need a labelled support set")
        names = request.class_names
        index = {n: i for i, n in enumerate(names)}
        f = self._features(request.support_images + request.pixels()).numpy()
        n = len(request.support_images)
        return OneShotEpisode(
            support_emb=f[:n],
            support_labels=np.array([index[lab] for lab in request.support_labels or []]),
            query_emb=f[n:],
            classes=list(names),
            support_field="support_images",
        )


def response_from_logits(
    names: list[str], logits: torch.Tensor, with_uncertainty: bool
) -> DirclipResponse:
    """One answer per row of ``logits`` (images × classes): the label, the probabilities and,
    when asked, the Dirichlet uncertainty (AU/EU) of the concentrations the logits define."""
    probs = logits.softmax(-1)
    u = uncertainty(logits) if with_uncertainty else None
    preds = []
    for i in range(len(logits)):
        unc = None
        if u is not None:
            unc = Uncertainty(**{k: _round(u[k][i]) for k in Uncertainty.model_fields})
        preds.append(
            Prediction(
                label=names[int(probs[i].argmax())],
                probs={n: _round(p) for n, p in zip(names, probs[i].tolist(), strict=True)},
                uncertainty=unc,
            )
        )
    return DirclipResponse(predictions=preds)
